#include "server/ps/table/sparse_grads.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster::ps {
namespace {

TEST(SparseGradsTest, SumsDuplicateKeysInRequestOrderAndKeepsFirstArrivalOrder) {
  const std::vector<uint64_t> keys = {9, 4, 9, 7, 4};
  const std::vector<float> grads = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const SparseGrads g = SparseGrads::Of(2, keys, grads);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g.key(0), 9u);
  EXPECT_EQ(g.key(1), 4u);
  EXPECT_EQ(g.key(2), 7u);
  EXPECT_EQ(g.row(0)[0], 1.0f + 5.0f);
  EXPECT_EQ(g.row(0)[1], 2.0f + 6.0f);
  EXPECT_EQ(g.row(1)[0], 3.0f + 9.0f);
  EXPECT_EQ(g.row(2)[1], 8.0f);
  EXPECT_EQ(g.Find(5), nullptr);
  EXPECT_EQ(g.Find(7), g.row(2));
}

TEST(SparseGradsTest, ARowStartsFromPositiveZero) {
  const std::vector<uint64_t> keys = {1};
  const std::vector<float> grads = {-0.0f};
  const SparseGrads g = SparseGrads::Of(1, keys, grads);
  EXPECT_FALSE(std::signbit(g.row(0)[0]));  // as the map of rows it replaced summed them
}

TEST(SparseGradsTest, PutReplacesOrAppendsAndAddReturnsTheRow) {
  SparseGrads g(2);
  const float a[] = {1, 2}, b[] = {3, 4};
  EXPECT_EQ(g.Add(5, a), 0u);
  EXPECT_EQ(g.Add(6, a), 1u);
  EXPECT_EQ(g.Add(5, b), 0u);
  EXPECT_EQ(g.row(0)[1], 6.0f);
  g.Put(6, b);
  g.Put(8, a);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g.row(1)[0], 3.0f);
  EXPECT_EQ(g.Find(8)[1], 2.0f);
  g.Clear();
  EXPECT_TRUE(g.empty());
  EXPECT_EQ(g.Find(5), nullptr);
  EXPECT_EQ(g.dim(), 2u);
}

}  // namespace
}  // namespace pscluster::ps
