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

ModeLimits Limits(const char* model, int layers, int max_tensor_parallel, bool embeddings) {
  ModeLimits l;
  l.set_model(model);
  l.set_layers(layers);
  l.set_max_tensor_parallel(max_tensor_parallel);
  l.set_embedding_tables(embeddings);
  return l;
}

TEST(TrainingModeTest, ModesAModelCannotTakeAreRefusedSayingWhy) {
  const ModeLimits mlp = Limits("mlp", 4, 0, false);
  const ModeLimits gpt = Limits("gpt", 6, 4, false);  // 4 heads
  const ModeLimits embedding = Limits("embedding", 3, 0, true);
  for (TrainingMode m : {PS, ALLREDUCE, FSDP, PIPELINE}) {
    EXPECT_TRUE(CheckModeFits(m, mlp, 4).ok()) << ModeName(m);
  }
  for (TrainingMode m : kTrainingModes) EXPECT_TRUE(CheckModeFits(m, gpt, 2).ok()) << ModeName(m);
  EXPECT_TRUE(CheckModeFits(TENSOR, gpt, 4).ok());
  EXPECT_TRUE(CheckModeFits(PS, embedding, 8).ok());
  EXPECT_TRUE(CheckModeFits(ALLREDUCE, embedding, 8).ok());

  auto refused = [](TrainingMode m, const ModeLimits& l, int workers, const char* says) {
    const absl::Status s = CheckModeFits(m, l, workers);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << ModeName(m) << " " << workers;
    EXPECT_NE(s.message().find(says), absl::string_view::npos) << s.message();
  };
  refused(TENSOR, mlp, 2, "the mlp model has none");
  refused(TENSOR, gpt, 3, "dividing 4");
  refused(PIPELINE, mlp, 5, "4 layers, the cluster 5 workers");
  for (TrainingMode m : {FSDP, PIPELINE, TENSOR}) refused(m, embedding, 2, "embedding tables");
}

}  // namespace
}  // namespace pscluster::coord
