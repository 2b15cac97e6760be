#include "bench/one_f_one_b.h"

#include "gtest/gtest.h"

namespace pscluster::bench {
namespace {

TEST(OneFOneBTest, EqualStagesLeaveTheTextbookBubble) {
  for (int stages : {2, 3, 4}) {
    for (int micro : {1, 2, 4, 8, 16}) {
      const std::vector<double> b =
          OneFOneBBubble(std::vector<StageTimes>(stages, {1.0, 2.0, 0.0}), micro, 3);
      for (int k = 0; k < stages; ++k) {
        EXPECT_NEAR(b[k], (stages - 1.0) / (micro + stages - 1.0), 1e-12)
            << "K=" << stages << " M=" << micro << " stage " << k;
      }
    }
  }
}

TEST(OneFOneBTest, TheSlowerStageSetsThePace) {
  // Stage 1 takes 3 + 3 a micro-batch, stage 0 only 1 + 2: in the steady phase stage 0
  // waits 3 at every micro-batch, stage 1 only at the start (for stage 0's forward and,
  // after the first step, its last backward).
  const std::vector<double> b = OneFOneBBubble({{1, 2, 0}, {3, 3, 0}}, 4, 3);
  // A step: F0 of stage 0 (1), 4 micro-batches of stage 1 (24), B3 of stage 0 (2) = 27.
  EXPECT_NEAR(b[0], (27.0 - 4 * 3) / 27, 1e-12);
  EXPECT_NEAR(b[1], (27.0 - 4 * 6) / 27, 1e-12);
}

TEST(OneFOneBTest, ALongerUpdateDelaysTheOthersNextStep) {
  // Equal micro-batches; stage 0's update takes 5 more than stage 1's: stage 1 waits for it
  // at the start of every step after the first.
  const std::vector<double> b = OneFOneBBubble({{1, 2, 5}, {1, 2, 0}}, 4, 3);
  // Stage 0's step: F (1), then in step with stage 1's 3 per micro-batch, B3 (2), update (5):
  // 1 + 4 * 3 + 2 + 5 = 20; its bubble is the ideal one micro-batch (3).
  EXPECT_NEAR(b[0], 3.0 / 20, 1e-12);
  // Stage 1 runs the same 20 in lockstep, 12 of them computing.
  EXPECT_NEAR(b[1], 8.0 / 20, 1e-12);
}

}  // namespace
}  // namespace pscluster::bench
