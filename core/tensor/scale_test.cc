#include "core/tensor/scale.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster::core {
namespace {

TEST(ScaleTest, MultipliesEveryValueAsAScalarLoopWould) {
  // Lengths around the vector widths, so the vector body and the remainder both run.
  for (size_t n : {0, 1, 7, 8, 15, 16, 17, 33, 1000}) {
    std::vector<float> v(n), want(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = std::ldexp(static_cast<float>(i) - 500.25f, static_cast<int>(i % 7) - 3);
      want[i] = v[i] * (1.0f / 3);
    }
    Scale(absl::MakeSpan(v), 1.0f / 3);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(v[i], want[i]) << "n " << n << " at " << i;
  }
}

TEST(ScaleTest, KeepsNonFiniteValuesForTheScansToFind) {
  std::vector<float> v = {1, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), -2};
  Scale(absl::MakeSpan(v), 0.5f);
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_TRUE(std::isinf(v[1]));
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_EQ(v[3], -1.0f);
}

}  // namespace
}  // namespace pscluster::core
