#include "worker/modes/step_observers.h"

#include <vector>

#include "gtest/gtest.h"

namespace pscluster::modes {
namespace {

// Issue 50: each progress report carries the mean step's split since the last one (the
// status page's step-time bars), from the steps' own compute and communication times.
TEST(ProgressPrinterTest, ReportsTheMeanStepSplitSinceTheLastReport) {
  std::vector<coord::StepTime> reported;
  ProgressPrinter::Options o;
  o.batch_size = 8;
  o.epochs = 1;
  o.every = absl::ZeroDuration();  // a report after every step
  o.mode = [] { return coord::PS; };
  o.report = [&](int64_t, double, double, const coord::StepTime& t) { reported.push_back(t); };
  ProgressPrinter printer(std::move(o));
  StepDone done;
  done.total = 10;
  for (int64_t step = 0; step < 2; ++step) {
    done.step = step;
    done.took = absl::Milliseconds(10 + 10 * step);
    done.comm = absl::Milliseconds(4);
    ASSERT_TRUE(printer.AfterStep(done).ok());
  }
  ASSERT_EQ(reported.size(), 2u);
  EXPECT_DOUBLE_EQ(reported[0].compute_ms(), 6);
  EXPECT_DOUBLE_EQ(reported[0].communication_ms(), 4);
  EXPECT_DOUBLE_EQ(reported[1].compute_ms(), 16);  // the second step's alone
  EXPECT_DOUBLE_EQ(reported[1].communication_ms(), 4);
  EXPECT_GE(reported[1].other_ms(), 0);
}

}  // namespace
}  // namespace pscluster::modes
