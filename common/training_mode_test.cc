#include "common/training_mode.h"

#include "gtest/gtest.h"

namespace pscluster::coord {
namespace {

SwitchRecord Switch(int64_t at_step, TrainingMode to) {
  SwitchRecord r;
  r.set_at_step(at_step);
  r.set_to_mode(to);
  return r;
}

TEST(TrainingModeTest, EveryModeParsesBackFromItsName) {
  for (TrainingMode m : {PS, ALLREDUCE, FSDP, PIPELINE, TENSOR}) {
    absl::StatusOr<TrainingMode> parsed = ParseMode(ModeName(m));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, m);
  }
}

TEST(TrainingModeTest, AnUnknownNameIsInvalidAndTheMessageListsTheValidOnes) {
  for (absl::string_view bad : {"zero3", "", "PS", "unspecified"}) {
    absl::StatusOr<TrainingMode> parsed = ParseMode(bad);
    ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("ps, allreduce, fsdp, pipeline or tensor"),
              absl::string_view::npos);
  }
}

TEST(TrainingModeTest, UnspecifiedAndOutOfRangeValuesFromTheWireAreRefused) {
  EXPECT_TRUE(CheckMode("mode", FSDP).ok());
  EXPECT_EQ(CheckMode("mode", TRAINING_MODE_UNSPECIFIED).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckMode("to_mode", static_cast<TrainingMode>(17)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TrainingModeTest, ASwitchAtStepSAlreadyGovernsStepS) {
  const SwitchRecord a = Switch(10, FSDP), b = Switch(20, PIPELINE);
  const std::vector<const SwitchRecord*> switches = {&b, &a};  // any order
  EXPECT_EQ(ModeAt(0, PS, switches), PS);
  EXPECT_EQ(ModeAt(9, PS, switches), PS);
  EXPECT_EQ(ModeAt(10, PS, switches), FSDP);
  EXPECT_EQ(ModeAt(19, PS, switches), FSDP);
  EXPECT_EQ(ModeAt(20, PS, switches), PIPELINE);
  EXPECT_EQ(ModeAt(1000, PS, switches), PIPELINE);
  EXPECT_EQ(SwitchInEffectAt(9, switches), nullptr);
  EXPECT_EQ(SwitchInEffectAt(15, switches), &a);
}

TEST(TrainingModeTest, AViewCountsDoneAndPendingSwitchesFromItsInitialMode) {
  ClusterView view;
  view.set_initial_mode(ALLREDUCE);
  *view.add_switches() = Switch(5, PS);
  *view.add_pending_switches() = Switch(8, FSDP);
  EXPECT_EQ(ModeAt(view, 4), ALLREDUCE);
  EXPECT_EQ(ModeAt(view, 5), PS);
  EXPECT_EQ(ModeAt(view, 8), FSDP);
}

}  // namespace
}  // namespace pscluster::coord
