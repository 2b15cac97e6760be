#include "worker/compute/cuda_device.h"

#include <cstdio>

#include "gtest/gtest.h"

namespace pscluster::compute {
namespace {

// Skips, saying why, wherever no GPU is usable; fails only on a GPU that misbehaves.
#define SKIP_WITHOUT_GPU()                                                        \
  do {                                                                            \
    auto devices = CudaDevices();                                                 \
    if (!devices.ok()) {                                                          \
      std::printf("SKIPPED (no GPU): %s\n", devices.status().ToString().c_str()); \
      GTEST_SKIP() << devices.status();                                           \
    }                                                                             \
  } while (0)

TEST(CudaDeviceTest, ListsDevicesWithNamesAndMemory) {
  SKIP_WITHOUT_GPU();
  for (const auto& d : *CudaDevices()) {
    std::printf("GPU %d: %s, sm_%d%d, %.1f GiB\n", d.index, d.name.c_str(), d.compute_major,
                d.compute_minor, d.total_memory_bytes / 1073741824.0);
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, 0u);
  }
}

TEST(CudaDeviceTest, AxpyKernelMatchesHostForOddAndEmptySizes) {
  SKIP_WITHOUT_GPU();
  for (size_t n : {0u, 1u, 257u, 100003u}) {
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(i % 13) - 6.0f;
      y[i] = 0.5f * static_cast<float>(i % 7);
    }
    auto out = CudaAxpy(2.0f, x, y);
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ((*out)[i], 2.0f * x[i] + y[i]) << "i=" << i;
  }
}

}  // namespace
}  // namespace pscluster::compute
