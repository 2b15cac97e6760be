// The one cudaError_t -> absl::Status adapter, for every CUDA user (backend, device
// queries, NCCL communicator): "<what>: <name> (<text>)" with the code saying what the
// caller can do: UNAVAILABLE for no usable device or driver, RESOURCE_EXHAUSTED for device
// memory, INVALID_ARGUMENT for a bad device or value, INTERNAL otherwise.
// CUDA builds only (--config=cuda).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"

namespace pscluster {

inline absl::Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string msg = what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(msg);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace pscluster
