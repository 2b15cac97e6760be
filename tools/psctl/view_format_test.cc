#include "tools/psctl/view_format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::psctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

coord::ClusterView TwoWorkers() {
  coord::ClusterView v;
  v.set_num_workers(2);
  return v;
}

TEST(FormatViewTest, ARunThatNeverRolledBackSaysNothingOfRollbacks) {
  EXPECT_THAT(FormatView(TwoWorkers(), absl::Now()), Not(HasSubstr("rollback")));
}

TEST(FormatViewTest, ARollbackInProgressNamesTheWorkersItWaitsFor) {
  coord::ClusterView v = TwoWorkers();
  v.mutable_rollback()->set_generation("s0.1-w0.1-w1.2-");
  v.mutable_rollback()->add_stopped_ranks(1);
  EXPECT_THAT(FormatView(v, absl::Now()),
              HasSubstr("rollback in progress: 1 of 2 worker(s) stopped; waiting for rank(s) 0\n"));
  v.mutable_rollback()->add_stopped_ranks(0);
  EXPECT_THAT(FormatView(v, absl::Now()), HasSubstr("2 of 2 worker(s) stopped; rank 0 restores"));
}

TEST(FormatViewTest, ADecidedRollbackIsCountedWithItsStep) {
  coord::ClusterView v = TwoWorkers();
  v.mutable_rollback()->set_generation("g");
  v.mutable_rollback()->set_decided(true);
  v.mutable_rollback()->set_step(624);
  v.mutable_run()->set_rollbacks(2);
  const std::string out = FormatView(v, absl::Now());
  EXPECT_THAT(out, HasSubstr("rollbacks: 2 (the last to step 624)\n"));
  EXPECT_THAT(out, Not(HasSubstr("in progress")));
}

}  // namespace
}  // namespace pscluster::psctl
