// MakeCudaBackend() for builds without --config=cuda.
#include "absl/status/status.h"
#include "worker/compute/backend.h"

namespace pscluster::compute {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int /*device*/) {
  return absl::UnavailableError("built without CUDA (rebuild with bazel --config=cuda)");
}

}  // namespace pscluster::compute
