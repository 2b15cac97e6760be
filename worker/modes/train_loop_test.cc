#include "worker/modes/train_loop.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pscluster::modes {
namespace {

// Records what it saw; fails the step named by fail_at once.
class Recorder final : public StepObserver {
 public:
  explicit Recorder(std::vector<std::string>* log) : log_(log) {}
  absl::Status AfterStep(const StepDone& d) override {
    log_->push_back(absl::StrCat("step ", d.step, " epoch ", d.epoch, d.epoch_end ? " end" : "",
                                 " loss ", d.epoch_loss));
    if (d.step == fail_at) {
      fail_at = -1;
      return absl::UnavailableError("observer failed");
    }
    return absl::OkStatus();
  }
  void RolledBack(int64_t failed, int64_t resumed) override {
    log_->push_back(absl::StrCat("rolled back ", failed, " to ", resumed));
  }
  int64_t fail_at = -1;

 private:
  std::vector<std::string>* log_;
};

TrainLoopHooks Hooks(std::vector<std::string>* log) {
  TrainLoopHooks h;
  h.step = [](int64_t step) -> absl::StatusOr<float> { return static_cast<float>(step); };
  h.recover = [log](int64_t step, absl::Status s) -> absl::StatusOr<int64_t> {
    log->push_back(absl::StrCat("recover ", step, ": ", s.message()));
    return step - 1;
  };
  return h;
}

TEST(TrainLoopTest, ObserversSeeEveryStepAndEveryEpochsEndInOrder) {
  std::vector<std::string> log;
  TrainLoop loop(Hooks(&log), /*per_epoch=*/3, /*total=*/7);
  Recorder first(&log), second(&log);
  loop.Observe(&first);
  loop.Observe(&second);
  auto r = loop.Run(1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->final_loss, 6);  // the run's last epoch: step 6 alone (cut short)
  EXPECT_TRUE(r->rollbacks.empty());
  EXPECT_EQ(
      log,
      (std::vector<std::string>{
          "step 1 epoch 1 loss 1", "step 1 epoch 1 loss 1", "step 2 epoch 1 end loss 1.5",
          "step 2 epoch 1 end loss 1.5", "step 3 epoch 2 loss 3", "step 3 epoch 2 loss 3",
          "step 4 epoch 2 loss 3.5", "step 4 epoch 2 loss 3.5", "step 5 epoch 2 end loss 4",
          "step 5 epoch 2 end loss 4", "step 6 epoch 3 end loss 6", "step 6 epoch 3 end loss 6"}));
}

// A step that fails (before it runs, or in an observer) goes to the recovery; the loop
// resumes where it says, the epoch's loss starting over, and observers hear of it.
TEST(TrainLoopTest, AFailedStepResumesWhereRecoverySays) {
  std::vector<std::string> log;
  TrainLoopHooks hooks = Hooks(&log);
  int failures = 1;
  hooks.before = [&](int64_t step) {
    return step == 2 && failures-- > 0 ? absl::UnavailableError("a shard died") : absl::OkStatus();
  };
  TrainLoop loop(std::move(hooks), /*per_epoch=*/10, /*total=*/4);
  Recorder observer(&log);
  observer.fail_at = 3;
  loop.Observe(&observer);
  auto r = loop.Run(0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rollbacks, (std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {3, 2}}));
  EXPECT_EQ(log,
            (std::vector<std::string>{
                "step 0 epoch 1 loss 0", "step 1 epoch 1 loss 0.5", "recover 2: a shard died",
                "rolled back 2 to 1", "step 1 epoch 1 loss 1", "step 2 epoch 1 loss 1.5",
                "step 3 epoch 1 end loss 2", "recover 3: observer failed", "rolled back 3 to 2",
                "step 2 epoch 1 loss 2", "step 3 epoch 1 end loss 2.5"}));
}

TEST(TrainLoopTest, AFailureTheRecoveryReturnsEndsTheRun) {
  TrainLoopHooks hooks;
  hooks.step = [](int64_t step) -> absl::StatusOr<float> {
    if (step == 1) return absl::InternalError("NaN loss");
    return 1.0f;
  };
  hooks.recover = [](int64_t, absl::Status s) -> absl::StatusOr<int64_t> { return s; };
  TrainLoop loop(std::move(hooks), 5, 5);
  auto r = loop.Run(0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r.status().message(), "NaN loss");
}

}  // namespace
}  // namespace pscluster::modes
