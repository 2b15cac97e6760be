// CreateNcclCommunicator() for builds without --config=cuda.
#include "worker/collective/nccl_communicator.h"

namespace pscluster::collective {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Rendezvous*,
                                                                     const NcclOptions&) {
  return absl::UnavailableError("built without --config=cuda");
}

}  // namespace pscluster::collective
