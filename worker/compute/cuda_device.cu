#include <cuda_runtime.h>

#include <string>

#include "common/cuda_status.h"
#include "worker/compute/cuda_device.h"

namespace pscluster::compute {
namespace {

using ::pscluster::CudaStatus;

__global__ void AxpyKernel(float a, const float* x, const float* y, float* out, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}

}  // namespace

absl::StatusOr<std::vector<CudaDeviceInfo>> CudaDevices() {
  int count = 0;
  absl::Status s = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!s.ok()) return s;
  if (count == 0) return absl::UnavailableError("no CUDA device is visible");
  std::vector<CudaDeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p;
    s = CudaStatus(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties");
    if (!s.ok()) return s;
    out.push_back({i, p.name, p.major, p.minor, p.totalGlobalMem});
  }
  return out;
}

absl::StatusOr<std::vector<float>> CudaAxpy(float a, const std::vector<float>& x,
                                            const std::vector<float>& y) {
  if (x.size() != y.size()) return absl::InvalidArgumentError("x and y differ in length");
  const size_t n = x.size(), bytes = n * sizeof(float);
  std::vector<float> out(n);
  if (n == 0) return out;
  float *dx = nullptr, *dy = nullptr, *dout = nullptr;
  absl::Status s = CudaStatus(cudaMalloc(&dx, bytes), "cudaMalloc");
  if (s.ok()) s = CudaStatus(cudaMalloc(&dy, bytes), "cudaMalloc");
  if (s.ok()) s = CudaStatus(cudaMalloc(&dout, bytes), "cudaMalloc");
  if (s.ok()) s = CudaStatus(cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (s.ok()) s = CudaStatus(cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (s.ok()) {
    AxpyKernel<<<(n + 255) / 256, 256>>>(a, dx, dy, dout, n);
    s = CudaStatus(cudaGetLastError(), "AxpyKernel launch");
  }
  if (s.ok())
    s = CudaStatus(cudaMemcpy(out.data(), dout, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dout);
  if (!s.ok()) return s;
  return out;
}

}  // namespace pscluster::compute
