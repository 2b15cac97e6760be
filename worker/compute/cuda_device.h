// CUDA runtime adapter: cudaError_t -> absl::Status in one place, and device discovery.
// Built for real only with --config=cuda; otherwise CudaDevices() says CUDA is absent.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pscluster::compute {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_memory_bytes = 0;
};

// The visible CUDA devices. UNAVAILABLE with the reason when this binary was built
// without --config=cuda, when no driver is loaded, or when no GPU is visible.
absl::StatusOr<std::vector<CudaDeviceInfo>> CudaDevices();

// out[i] = a * x[i] + y[i] computed on device 0: the smallest end-to-end check that a
// kernel launches and memory moves both ways.
absl::StatusOr<std::vector<float>> CudaAxpy(float a, const std::vector<float>& x,
                                            const std::vector<float>& y);

}  // namespace pscluster::compute
