#include "server/ps/service/request_budget.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps/service/buffer_pool.h"

namespace pscluster::ps {
namespace {

using ::testing::HasSubstr;

TEST(RequestBudgetTest, ChargesOverTheBudgetAreRefusedNamingItAndGivenBackOnDestruction) {
  RequestBudget budget(100);
  {
    RequestBudget::Charge a(&budget);
    ASSERT_TRUE(a.GrowTo(60, "a").ok());
    RequestBudget::Charge b(&budget);
    absl::Status s = b.GrowTo(41, "the push stream of table 3");
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(s.message(), HasSubstr("the push stream of table 3 would hold 41 bytes"));
    EXPECT_THAT(s.message(), HasSubstr("other requests in flight hold 60"));
    EXPECT_THAT(s.message(), HasSubstr("in-flight request budget of 100 bytes"));
    EXPECT_THAT(s.message(), HasSubstr("--max_inflight_request_bytes"));
    EXPECT_EQ(b.bytes(), 0u) << "a refused charge takes nothing";
    EXPECT_TRUE(b.GrowTo(40, "b").ok()) << "exactly the budget fits";
    EXPECT_TRUE(b.GrowTo(30, "b").ok()) << "not a growth: nothing changes";
    EXPECT_EQ(b.bytes(), 40u);
    EXPECT_EQ(budget.IdleFor(), absl::ZeroDuration());
    RequestBudget::Charge c(&budget);
    c.ForceGrowTo(1000);  // counted over the budget
    EXPECT_FALSE(RequestBudget::Charge(&budget).GrowTo(1, "d").ok());
    EXPECT_FALSE(RequestBudget::Charge(&budget).GrowTo(uint64_t{1} << 63, "e").ok());
  }
  RequestBudget::Charge all(&budget);
  EXPECT_TRUE(all.GrowTo(100, "all").ok()) << "every charge was given back";
}

TEST(BufferPoolTest, HandsOutOnlyBuffersThatFitTheExpectedSize) {
  BufferPool pool(10 << 20);
  std::string big(4 << 20, 'x'), small(64 << 10, 'y');
  pool.Put(std::move(big));
  pool.Put(std::move(small));
  EXPECT_EQ(pool.Get(1 << 20).capacity(), 15u) << "no pooled buffer in [1 MiB, 2 MiB]: fresh";
  std::string got = pool.Get(48 << 10);
  EXPECT_GE(got.capacity(), 64u << 10);
  EXPECT_TRUE(got.empty());
  EXPECT_GE(pool.Get(3 << 20).capacity(), 4u << 20);
  EXPECT_EQ(pool.Get(3 << 20).capacity(), 15u) << "taken";
  pool.Put(std::string(8 << 20, 'z'));
  pool.Put(std::string(8 << 20, 'z'));  // over max_bytes: freed
  pool.Clear();
  EXPECT_EQ(pool.Get(8 << 20).capacity(), 15u);
}

}  // namespace
}  // namespace pscluster::ps
