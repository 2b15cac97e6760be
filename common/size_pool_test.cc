#include "common/size_pool.h"

#include <memory>
#include <set>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

// A buffer that says when it is freed.
struct Tracked {
  int id;
  std::set<int>* freed;
};
struct Untrack {
  void operator()(Tracked* t) const {
    t->freed->insert(t->id);
    delete t;
  }
};
using Buffer = std::unique_ptr<Tracked, Untrack>;

TEST(SizePoolTest, HandsOutABufferOnlyWithinTwiceTheSizeAsked) {
  std::set<int> freed;
  SizePool<Buffer> pool(100);
  pool.Put(40, Buffer(new Tracked{1, &freed}));
  pool.Put(10, Buffer(new Tracked{2, &freed}));
  EXPECT_EQ(pool.pooled_bytes(), 50u);
  EXPECT_FALSE(pool.Take(19).has_value()) << "40 > 2 x 19 and 10 < 19: nothing fits";
  std::optional<Buffer> b = pool.Take(20);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)->id, 1) << "the smallest that holds 20 bytes";
  EXPECT_EQ(pool.pooled_bytes(), 10u);
  b = pool.Take(5);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)->id, 2);
  EXPECT_FALSE(pool.Take(5).has_value()) << "taken";
  EXPECT_TRUE(freed.count(1)) << "the first taken buffer was dropped by the assignment";
  EXPECT_FALSE(freed.count(2));
}

TEST(SizePoolTest, FreesWhatPassesTheBoundAndEverythingOnClear) {
  std::set<int> freed;
  SizePool<Buffer> pool(100);
  pool.Put(60, Buffer(new Tracked{1, &freed}));
  pool.Put(60, Buffer(new Tracked{2, &freed}));  // 120 > 100: freed, not kept
  EXPECT_EQ(freed, std::set<int>{2});
  EXPECT_EQ(pool.pooled_bytes(), 60u);
  pool.Put(40, Buffer(new Tracked{3, &freed}));  // exactly at the bound: kept
  EXPECT_EQ(pool.pooled_bytes(), 100u);
  pool.Clear();
  EXPECT_EQ(freed, (std::set<int>{1, 2, 3}));
  EXPECT_EQ(pool.pooled_bytes(), 0u);
  EXPECT_FALSE(pool.Take(40).has_value());
}

}  // namespace
}  // namespace pscluster
