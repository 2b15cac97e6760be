#include "common/sharding.h"

#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(DenseShardRangeTest, RangesTileTheTensorWithoutGapsOrOverlap) {
  for (uint64_t size : {0ull, 1ull, 7ull, 1000003ull}) {
    for (uint32_t n : {1u, 2u, 3u, 8u}) {
      uint64_t next = 0;
      for (uint32_t s = 0; s < n; ++s) {
        Range r = DenseShardRange(size, s, n);
        EXPECT_EQ(r.begin, next) << "size " << size << " shards " << n;
        EXPECT_LE(r.size(), size / n + 1);
        EXPECT_GE(r.size(), size / n);
        next = r.end;
      }
      EXPECT_EQ(next, size);
    }
  }
}

TEST(DenseShardRangeTest, HugeSizesDoNotOverflow) {
  Range r = DenseShardRange(~0ull, 2, 3);
  EXPECT_EQ(r.end, ~0ull);
  EXPECT_GT(r.begin, 0ull);
}

TEST(SparseShardOfTest, ConsecutiveKeysSpreadEvenly) {
  constexpr uint32_t kShards = 4;
  std::vector<int> counts(kShards);
  for (uint64_t k = 0; k < 40000; ++k) counts[SparseShardOf(k, kShards)]++;
  for (int c : counts) {
    EXPECT_GT(c, 9000);
    EXPECT_LT(c, 11000);
  }
}

TEST(SparseShardOfTest, OneShardOwnsEverything) { EXPECT_EQ(SparseShardOf(123456789, 1), 0u); }

TEST(IntersectTest, DisjointRangesGiveEmpty) {
  EXPECT_EQ(Intersect({0, 5}, {5, 9}).size(), 0u);
  EXPECT_EQ(Intersect({0, 5}, {3, 9}), (Range{3, 5}));
}

}  // namespace
}  // namespace pscluster
