// CudaDevices() for builds without --config=cuda.
#include "worker/compute/cuda_device.h"

namespace pscluster::compute {

absl::StatusOr<std::vector<CudaDeviceInfo>> CudaDevices() {
  return absl::UnavailableError("built without CUDA (rebuild with bazel --config=cuda)");
}

absl::StatusOr<std::vector<float>> CudaAxpy(float, const std::vector<float>&,
                                            const std::vector<float>&) {
  return absl::UnavailableError("built without CUDA (rebuild with bazel --config=cuda)");
}

}  // namespace pscluster::compute
