#include "core/tensor/non_finite.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster::core {
namespace {

TEST(NonFiniteTest, EmptyAndAllFiniteGiveTheSize) {
  EXPECT_EQ(FirstNonFinite({}), 0u);
  std::vector<float> v(3001, 1.5f);
  v[7] = std::numeric_limits<float>::max();
  v[8] = -std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(FirstNonFinite(v), v.size());
}

TEST(NonFiniteTest, FindsTheFirstNanOrInfAcrossBlocks) {
  for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, size_t{2999}}) {
    for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> v(3000, 0.25f);
      v[at] = bad;
      v.back() = bad;  // a later one does not hide the first
      EXPECT_EQ(FirstNonFinite(v), at) << "at " << at << " value " << bad;
    }
  }
}

TEST(NonFiniteTest, MaxAbsIsTheLargestMagnitudeOrInfinity) {
  EXPECT_EQ(MaxAbs({}), 0.0f);
  std::vector<float> v(3001, 0.5f);
  v[1500] = -7.25f;
  v[9] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(MaxAbs(v), 7.25f);
  v[3000] = std::numeric_limits<float>::max();
  EXPECT_EQ(MaxAbs(v), std::numeric_limits<float>::max());
  for (float bad : {std::nanf(""), -std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    v[2047] = bad;
    EXPECT_EQ(MaxAbs(v), std::numeric_limits<float>::infinity()) << bad;
  }
}

TEST(NonFiniteTest, AddAndMaxAbsSumsAndMeasuresTheSum) {
  std::vector<float> sum(2001, 1.0f), add(2001, 0.5f);
  add[700] = -9.5f;  // the sum's largest magnitude: |1 - 9.5|
  add[5] = 3.0f;
  EXPECT_EQ(AddAndMaxAbs(absl::MakeSpan(sum), add), 8.5f);
  EXPECT_EQ(sum[0], 1.5f);
  EXPECT_EQ(sum[5], 4.0f);
  EXPECT_EQ(sum[700], -8.5f);
  // Finite terms whose sum overflows: the sum is Inf, and so is its MaxAbs.
  std::vector<float> big(3, std::numeric_limits<float>::max());
  EXPECT_EQ(AddAndMaxAbs(absl::MakeSpan(big), std::vector<float>(3, 3e38f)),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(AddAndMaxAbs({}, {}), 0.0f);
}

// The scans keep several running maxima side by side and finish the tail alone: the largest
// value counts in every lane and in the tail, for every length around the lane width.
TEST(NonFiniteTest, MaxAbsSeesEveryPositionOfEveryLength) {
  for (size_t n = 1; n <= 70; ++n) {
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> v(n, -0.75f), zeros(n, 0.0f);
      v[at] = -2.5f;
      EXPECT_EQ(MaxAbs(v), 2.5f) << "n " << n << " at " << at;
      EXPECT_EQ(AddAndMaxAbs(absl::MakeSpan(zeros), v), 2.5f) << "n " << n << " at " << at;
      v[at] = -std::nanf("");
      EXPECT_EQ(MaxAbs(v), std::numeric_limits<float>::infinity()) << "n " << n << " at " << at;
    }
  }
}

}  // namespace
}  // namespace pscluster::core
