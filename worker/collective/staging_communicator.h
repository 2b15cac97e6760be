// A communicator on host memory in front of one whose buffers live where a compute backend
// computes (NCCL: device memory): every call copies its spans into backend buffers, runs
// the inner call there, and copies the results back. The trainers keep host-side state, so
// this is how they use NCCL (--collectives=nccl with --backend=cuda); over the CPU backend
// the copies are memcpy and it tests the same code path without a GPU.
#pragma once

#include <memory>

#include "worker/collective/communicator.h"
#include "worker/compute/backend.h"

namespace pscluster::collective {

// `backend` allocates the staging buffers (grown as needed, freed with the communicator).
std::unique_ptr<Communicator> MakeStagingCommunicator(std::unique_ptr<Communicator> inner,
                                                      std::unique_ptr<compute::Backend> backend);

}  // namespace pscluster::collective
