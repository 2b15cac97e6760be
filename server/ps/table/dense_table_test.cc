#include "server/ps/table/dense_table.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sharding.h"
#include "core/optimizer/adam_reference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr float kInit = 1.5f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TableSpec DenseSpec(uint64_t size, ConsistencyConfig::Mode mode, float lr, float init = kInit) {
  TableSpec spec;
  spec.set_table_id(1);
  spec.set_name("dense");
  spec.set_kind(TableSpec::DENSE);
  spec.set_size(size);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(lr);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_initializer()->set_kind(InitializerConfig::CONSTANT);
  spec.mutable_initializer()->set_value(init);
  return spec;
}

std::unique_ptr<DenseTable> MakeTable(const TableSpec& spec, const std::vector<int32_t>& workers,
                                      uint32_t shard = 0, uint32_t num_shards = 1) {
  std::unique_ptr<DenseTable> table =
      DenseTable::Create(spec, DenseShardRange(spec.size(), shard, num_shards)).value();
  for (int32_t w : workers) table->AddWorker(w);
  return table;
}

std::vector<float> ReadAll(const DenseTable& table) {
  std::vector<float> out(table.range().size());
  absl::Status s = table.Read(table.range().begin, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

absl::Status PushOne(DenseTable& table, int32_t worker, int64_t step, uint64_t begin,
                     const std::vector<float>& grad, bool* skipped = nullptr) {
  bool ignored = false;
  return table.Push(worker, step, begin, {absl::MakeConstSpan(grad)}, skipped ? skipped : &ignored);
}

// The table's whole value range as seen through a Shard (exercising DenseShardRange there).
std::vector<float> ReadThroughShard(const TableSpec& spec, uint32_t shard, uint32_t num_shards,
                                    Range* range) {
  Shard s(ShardOptions{shard, num_shards});
  s.RegisterWorker(0);
  auto created = s.CreateTable(spec);
  EXPECT_TRUE(created.ok()) << created.status();
  DenseTable* table = s.GetDense(spec.table_id(), 0).value();
  *range = table->range();
  EXPECT_EQ(created->info().shard_begin(), range->begin);
  EXPECT_EQ(created->info().shard_end(), range->end);
  return ReadAll(*table);
}

using core::testing::AdamRef;

TEST(DenseTableTest, ConstantInitializerSetsEveryValue) {
  auto table = MakeTable(DenseSpec(10, ConsistencyConfig::ASP, 0.5f, 2.25f), {0});
  EXPECT_THAT(ReadAll(*table), Each(2.25f));
}

TEST(DenseTableTest, ZerosInitializerIsTheDefault) {
  TableSpec spec = DenseSpec(7, ConsistencyConfig::ASP, 0.5f);
  spec.clear_initializer();
  auto table = MakeTable(spec, {0});
  EXPECT_THAT(ReadAll(*table), Each(0.0f));
}

TEST(DenseTableTest, ConstantInitIsIdenticalAcrossShardSplits) {
  TableSpec spec = DenseSpec(11, ConsistencyConfig::ASP, 0.5f, -3.0f);
  Range r0, r1, whole;
  std::vector<float> a = ReadThroughShard(spec, 0, 2, &r0);
  std::vector<float> b = ReadThroughShard(spec, 1, 2, &r1);
  std::vector<float> one = ReadThroughShard(spec, 0, 1, &whole);
  EXPECT_EQ(r0.end, r1.begin);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_THAT(a, ElementsAreArray(one));
  EXPECT_THAT(one, Each(-3.0f));
}

TEST(DenseTableTest, SeededUniformInitDependsOnlyOnGlobalIndex) {
  TableSpec spec = DenseSpec(101, ConsistencyConfig::ASP, 0.5f);
  spec.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
  spec.mutable_initializer()->set_scale(0.5f);
  spec.mutable_initializer()->set_seed(42);

  Range whole;
  std::vector<float> one = ReadThroughShard(spec, 0, 1, &whole);
  ASSERT_EQ(one.size(), 101u);
  EXPECT_THAT(one, Each(::testing::AllOf(::testing::Ge(-0.5f), ::testing::Lt(0.5f))));
  EXPECT_NE(one[0], one[1]);  // genuinely random, not a constant

  for (uint32_t n : {2u, 3u}) {
    std::vector<float> joined;
    uint64_t next = 0;
    for (uint32_t s = 0; s < n; ++s) {
      Range r;
      std::vector<float> part = ReadThroughShard(spec, s, n, &r);
      EXPECT_EQ(r.begin, next);
      next = r.end;
      joined.insert(joined.end(), part.begin(), part.end());
    }
    EXPECT_THAT(joined, ElementsAreArray(one)) << n << " shards";
  }

  // The same seed gives the same values; another seed different ones.
  std::vector<float> again = ReadThroughShard(spec, 0, 1, &whole);
  EXPECT_THAT(again, ElementsAreArray(one));
  spec.mutable_initializer()->set_seed(43);
  std::vector<float> other = ReadThroughShard(spec, 0, 1, &whole);
  EXPECT_NE(other, one);
}

TEST(DenseTableTest, SgdAspPushIsAppliedImmediately) {
  auto table = MakeTable(DenseSpec(4, ConsistencyConfig::ASP, 0.5f), {0});
  const std::vector<float> g = {1.0f, -2.0f, 0.25f, 0.0f};
  bool skipped = true;
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, g, &skipped).ok());
  EXPECT_FALSE(skipped);
  std::vector<float> expected;
  for (float gi : g) expected.push_back(kInit - 0.5f * gi);
  EXPECT_THAT(ReadAll(*table), ElementsAreArray(expected));

  // A second push is applied on top of the first, without any waiting.
  ASSERT_TRUE(table->AwaitPullable(1, absl::InfinitePast()).ok());
  ASSERT_TRUE(PushOne(*table, 0, 1, 0, g).ok());
  for (size_t i = 0; i < g.size(); ++i) expected[i] -= 0.5f * g[i];
  EXPECT_THAT(ReadAll(*table), ElementsAreArray(expected));
  EXPECT_EQ(table->Stats().pushes(), 2u);
  EXPECT_EQ(table->Clocks().at(0), 2);
}

TEST(DenseTableTest, PushOfSubRangeInChunksUpdatesOnlyThoseValues) {
  // Shard 1 of 2 of a 10-value tensor holds global [5, 10).
  auto table = MakeTable(DenseSpec(10, ConsistencyConfig::ASP, 0.5f), {0}, 1, 2);
  ASSERT_EQ(table->range(), (Range{5, 10}));
  const std::vector<float> c1 = {2.0f};
  const std::vector<float> c2 = {4.0f, 6.0f};
  bool skipped = true;
  ASSERT_TRUE(
      table->Push(0, 0, 6, {absl::MakeConstSpan(c1), absl::MakeConstSpan(c2)}, &skipped).ok());
  EXPECT_FALSE(skipped);
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit, kInit - 1.0f, kInit - 2.0f, kInit - 3.0f, kInit));

  // Reading a sub-range uses global indices too.
  std::vector<float> part(2);
  ASSERT_TRUE(table->Read(7, absl::MakeSpan(part)).ok());
  EXPECT_THAT(part, ElementsAre(kInit - 2.0f, kInit - 3.0f));
  EXPECT_EQ(table->Stats().bytes_pushed(), 3 * sizeof(float));
}

TEST(DenseTableTest, CheckRangeRejectsOutOfRangeAndOverflowingRequests) {
  auto table = MakeTable(DenseSpec(10, ConsistencyConfig::ASP, 0.5f), {0}, 1, 2);  // [5, 10)
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

  EXPECT_TRUE(table->CheckRange(5, 5).ok());
  EXPECT_TRUE(table->CheckRange(7, 3).ok());
  EXPECT_TRUE(table->CheckRange(10, 0).ok());

  struct Case {
    uint64_t begin, length;
  };
  for (Case c : {Case{4, 1}, Case{4, 0}, Case{9, 2}, Case{11, 0}, Case{0, 10}, Case{kMax, 1},
                 Case{kMax, 0}, Case{kMax - 2, 10},  // begin + length wraps around to 7
                 Case{6, kMax}, Case{5, kMax - 1}}) {
    absl::Status s = table->CheckRange(c.begin, c.length);
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << c.begin << "+" << c.length;
    EXPECT_THAT(std::string(s.message()), HasSubstr("[5, 10)"));
  }

  // Push and Read refuse such ranges too, and nothing changes.
  const std::vector<float> g(10, 1.0f);
  EXPECT_EQ(PushOne(*table, 0, 0, kMax - 2, g).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(PushOne(*table, 0, 0, 4, {1.0f}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(PushOne(*table, 0, 0, 8, {1.0f, 1.0f, 1.0f}).code(), absl::StatusCode::kOutOfRange);
  std::vector<float> out(10);
  EXPECT_EQ(table->Read(kMax - 2, absl::MakeSpan(out)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(table->Read(5, absl::MakeSpan(out)).code(), absl::StatusCode::kOutOfRange);

  EXPECT_THAT(ReadAll(*table), Each(kInit));
  TableStats stats = table->Stats();
  EXPECT_EQ(stats.pushes(), 0u);
  EXPECT_EQ(stats.bytes_pushed(), 0u);
  EXPECT_GE(stats.rejected_requests(), 5u);
  EXPECT_EQ(table->Clocks().at(0), 0);
}

TEST(DenseTableTest, BspAppliesSumOfAllWorkersOnceEveryonePushed) {
  auto table = MakeTable(DenseSpec(3, ConsistencyConfig::BSP, 0.5f), {0, 1, 2});
  const std::vector<std::vector<float>> g = {{1, 2, 3}, {0.5f, 0.5f, 0.5f}, {-4, 1, 2}};

  ASSERT_TRUE(PushOne(*table, 0, 0, 0, g[0]).ok());
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, g[1]).ok());
  // Two of three pushed: nothing applied, a pull of step 1 must wait.
  EXPECT_THAT(ReadAll(*table), Each(kInit));
  EXPECT_EQ(table->Info().applied_steps(), 0);
  EXPECT_EQ(table->AwaitPullable(1, absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(table->AwaitPullable(0, absl::InfinitePast()).ok());

  ASSERT_TRUE(PushOne(*table, 2, 0, 0, g[2]).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  EXPECT_TRUE(table->AwaitPullable(1, absl::InfinitePast()).ok());
  std::vector<float> expected;
  for (size_t i = 0; i < 3; ++i) {
    float sum = g[0][i];
    sum += g[1][i];
    sum += g[2][i];
    expected.push_back(kInit - 0.5f * sum);
  }
  EXPECT_THAT(ReadAll(*table), ElementsAreArray(expected));
}

TEST(DenseTableTest, BspSumsInWorkerIdOrderWhateverThePushOrder) {
  // Element 0 is chosen so that float summation order matters.
  const std::vector<std::vector<float>> g = {{1e8f, 1.0f}, {1.0f, 2.0f}, {-1e8f, 3.0f}};
  float by_id = g[0][0];
  by_id += g[1][0];
  by_id += g[2][0];
  float by_arrival = g[2][0];
  by_arrival += g[0][0];
  by_arrival += g[1][0];
  ASSERT_NE(by_id, by_arrival) << "the test values must make summation order observable";

  std::vector<float> expected;
  for (size_t i = 0; i < 2; ++i) {
    float sum = g[0][i];
    sum += g[1][i];
    sum += g[2][i];
    expected.push_back(kInit - 0.5f * sum);
  }

  for (const std::vector<int32_t>& order :
       {std::vector<int32_t>{0, 1, 2}, std::vector<int32_t>{2, 0, 1},
        std::vector<int32_t>{1, 2, 0}}) {
    auto table = MakeTable(DenseSpec(2, ConsistencyConfig::BSP, 0.5f), {0, 1, 2});
    for (int32_t w : order) ASSERT_TRUE(PushOne(*table, w, 0, 0, g[w]).ok());
    EXPECT_EQ(table->Info().applied_steps(), 1);
    EXPECT_THAT(ReadAll(*table), ElementsAreArray(expected))
        << "push order " << order[0] << order[1] << order[2];
  }
}

TEST(DenseTableTest, BspSumsSubRangePushesOfDifferentWorkers) {
  // Shard 1 of 2 of a 8-value tensor holds [4, 8); each worker pushes part of it.
  auto table = MakeTable(DenseSpec(8, ConsistencyConfig::BSP, 0.5f), {0, 1}, 1, 2);
  ASSERT_TRUE(PushOne(*table, 1, 0, 5, {2, 4}).ok());
  ASSERT_TRUE(PushOne(*table, 0, 0, 4, {6, 8}).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 3, kInit - 5, kInit - 2, kInit));
}

TEST(DenseTableTest, BspSubRangePushAfterWholeRangeStepsSumsZerosElsewhere) {
  // Step 0's staging buffers (whole-range pushes) are kept for later steps; step 1's
  // sub-range push must still count as zeros outside its range, not as step 0's values.
  auto table = MakeTable(DenseSpec(4, ConsistencyConfig::BSP, 0.5f), {0, 1});
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {8, 8, 8, 8}).ok());
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {2, 2, 2, 2}).ok());
  EXPECT_THAT(ReadAll(*table), Each(kInit - 5));
  ASSERT_TRUE(PushOne(*table, 1, 1, 2, {4, 6}).ok());
  ASSERT_TRUE(PushOne(*table, 0, 1, 0, {2}).ok());
  EXPECT_EQ(table->Info().applied_steps(), 2);
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 6, kInit - 5, kInit - 7, kInit - 8));
}

TEST(DenseTableTest, BspStepIsOneOptimizerUpdate) {
  // With Adam, one update of g0 + g1 differs clearly from two updates of g0 then g1.
  TableSpec spec = DenseSpec(1, ConsistencyConfig::BSP, 0.1f, 0.5f);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  auto table = MakeTable(spec, {0, 1});

  AdamRef once{0.5};
  once.Step(1.0 + 3.0, 0.1);
  AdamRef twice{0.5};
  twice.Step(1.0, 0.1);
  twice.Step(3.0, 0.1);
  ASSERT_GT(std::fabs(once.w - twice.w), 1e-2);

  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {3.0f}).ok());
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {1.0f}).ok());
  EXPECT_NEAR(ReadAll(*table)[0], once.w, 1e-5);

  // The next step is the table's second update (bias correction t = 2).
  once.Step(-2.0 + 0.5, 0.1);
  ASSERT_TRUE(PushOne(*table, 0, 1, 0, {-2.0f}).ok());
  ASSERT_TRUE(PushOne(*table, 1, 1, 0, {0.5f}).ok());
  EXPECT_NEAR(ReadAll(*table)[0], once.w, 1e-5);
}

TEST(DenseTableTest, BspRejectsStaleDuplicateTooFarAheadAndNegativeSteps) {
  auto table = MakeTable(DenseSpec(2, ConsistencyConfig::BSP, 0.5f), {0, 1});
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {1, 1}).ok());

  absl::Status dup = PushOne(*table, 0, 0, 0, {100, 100});
  EXPECT_EQ(dup.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(dup.message()), HasSubstr("worker 0 already pushed step 0"));

  absl::Status ahead = PushOne(*table, 0, kMaxBspStepsAhead, 0, {100, 100});
  EXPECT_EQ(ahead.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(ahead.message()), HasSubstr("ahead"));
  // The last step still inside the window is accepted (and staged).
  ASSERT_TRUE(PushOne(*table, 0, kMaxBspStepsAhead - 1, 0, {0, 0}).ok());

  absl::Status negative = PushOne(*table, 1, -1, 0, {100, 100});
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);

  // None of the rejected pushes counted: worker 1's push of step 0 completes the step.
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {2, 4}).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 0.5f * 3, kInit - 0.5f * 5));

  absl::Status stale = PushOne(*table, 1, 0, 0, {100, 100});
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.message()), HasSubstr("already applied"));

  // The window moved with applied_steps.
  EXPECT_TRUE(PushOne(*table, 1, kMaxBspStepsAhead, 0, {0, 0}).ok());
  EXPECT_EQ(PushOne(*table, 1, kMaxBspStepsAhead + 1, 0, {0, 0}).code(),
            absl::StatusCode::kAborted);

  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 0.5f * 3, kInit - 0.5f * 5));
  TableStats stats = table->Stats();
  EXPECT_EQ(stats.rejected_requests(), 5u);
  EXPECT_EQ(stats.pushes(), 4u);
}

TEST(DenseTableTest, AspAndSspAcceptAnyNonNegativeStepButNotANegativeOne) {
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::SSP}) {
    auto table = MakeTable(DenseSpec(1, mode, 0.5f), {0});
    EXPECT_TRUE(PushOne(*table, 0, 7, 0, {1}).ok());
    EXPECT_TRUE(PushOne(*table, 0, 7, 0, {1}).ok());
    EXPECT_TRUE(PushOne(*table, 0, 2, 0, {1}).ok());
    absl::Status s = PushOne(*table, 0, -3, 0, {1});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("-3"));
    EXPECT_EQ(table->Clocks().at(0), 8);
    EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 1.5f));
  }
}

TEST(DenseTableTest, NonFiniteGradientIsRejectedNamingTheIndexAndChangesNothing) {
  auto table = MakeTable(DenseSpec(6, ConsistencyConfig::ASP, 0.5f), {0});
  const std::vector<float> c1 = {0.5f, 0.5f};
  const std::vector<float> c2 = {0.5f, kNaN};
  bool skipped = true;
  absl::Status s =
      table->Push(0, 0, 1, {absl::MakeConstSpan(c1), absl::MakeConstSpan(c2)}, &skipped);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("index 4"));  // global index 1 + 3
  EXPECT_THAT(std::string(s.message()), HasSubstr("skip_nonfinite"));
  EXPECT_FALSE(skipped);

  absl::Status inf = PushOne(*table, 0, 0, 0, {1.0f, 1.0f, -kInf});
  EXPECT_EQ(inf.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(inf.message()), HasSubstr("index 2"));

  EXPECT_THAT(ReadAll(*table), Each(kInit));
  TableStats stats = table->Stats();
  EXPECT_EQ(stats.pushes(), 0u);
  EXPECT_EQ(stats.rejected_requests(), 2u);
  EXPECT_EQ(stats.nonfinite_pushes_skipped(), 0u);
  EXPECT_EQ(table->Clocks().at(0), 0);
}

TEST(DenseTableTest, RejectedNonFiniteBspPushDoesNotCountAsThePush) {
  auto table = MakeTable(DenseSpec(2, ConsistencyConfig::BSP, 0.5f), {0, 1});
  ASSERT_EQ(PushOne(*table, 0, 0, 0, {kNaN, 1}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {1, 1}).ok());
  EXPECT_EQ(table->Info().applied_steps(), 0);
  // Worker 0 may retry the same step with a finite gradient.
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {2, 2}).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  EXPECT_THAT(ReadAll(*table), Each(kInit - 0.5f * 3));
}

TEST(DenseTableTest, SkipNonfiniteDropsThePushCountsItAndLeavesValuesUnchanged) {
  TableSpec spec = DenseSpec(3, ConsistencyConfig::ASP, 0.5f);
  spec.set_skip_nonfinite(true);
  auto table = MakeTable(spec, {0});
  bool skipped = false;
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {1, kInf, 1}, &skipped).ok());
  EXPECT_TRUE(skipped);
  EXPECT_THAT(ReadAll(*table), Each(kInit));
  EXPECT_EQ(table->Stats().nonfinite_pushes_skipped(), 1u);
  EXPECT_EQ(table->Stats().rejected_requests(), 0u);

  ASSERT_TRUE(PushOne(*table, 0, 1, 0, {1, 1, 1}, &skipped).ok());
  EXPECT_FALSE(skipped);
  EXPECT_THAT(ReadAll(*table), Each(kInit - 0.5f));
  EXPECT_EQ(table->Stats().nonfinite_pushes_skipped(), 1u);
}

TEST(DenseTableTest, SkippedNonfinitePushStillCountsForTheBspStep) {
  TableSpec spec = DenseSpec(3, ConsistencyConfig::BSP, 0.5f);
  spec.set_skip_nonfinite(true);
  auto table = MakeTable(spec, {0, 1});
  bool skipped = false;
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {kNaN, 1, 1}, &skipped).ok());
  EXPECT_TRUE(skipped);
  EXPECT_EQ(table->Info().applied_steps(), 0);
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {2, 4, 6}, &skipped).ok());
  EXPECT_FALSE(skipped);
  EXPECT_EQ(table->Info().applied_steps(), 1);
  // Only worker 1's gradient was applied.
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 1, kInit - 2, kInit - 3));

  // A step in which every push was skipped still completes, without changing values.
  ASSERT_TRUE(PushOne(*table, 0, 1, 0, {kNaN, 0, 0}, &skipped).ok());
  ASSERT_TRUE(PushOne(*table, 1, 1, 0, {0, kInf, 0}, &skipped).ok());
  EXPECT_EQ(table->Info().applied_steps(), 2);
  EXPECT_TRUE(table->AwaitPullable(2, absl::InfinitePast()).ok());
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 1, kInit - 2, kInit - 3));

  TableStats stats = table->Stats();
  EXPECT_EQ(stats.nonfinite_pushes_skipped(), 3u);
  EXPECT_EQ(stats.pushes(), 4u);
}

// The state a dense table stores, as bits (equal means bitwise equal): the update count
// (Adam's bias-correction step), then the values, then each optimizer slot.
std::pair<int64_t, std::vector<uint32_t>> StoredState(DenseTable& table, int64_t step) {
  auto state = table.ExportState(step, absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(state.ok()) << state.status();
  if (!state.ok()) return {};
  std::vector<float> floats = state->values;
  for (const auto& slot : state->slots) floats.insert(floats.end(), slot.begin(), slot.end());
  std::vector<uint32_t> bits(floats.size());
  std::memcpy(bits.data(), floats.data(), floats.size() * sizeof(float));
  return {state->updates, std::move(bits)};
}

// A dropped push changes no stored state in any mode, whichever way the gradient came
// (scanned by the table, or chunk by chunk as a stream is): values, Adam slots and update
// count stay bitwise as they were, and the next push gives what it gives on a table that
// never saw the dropped one. The push is still the worker's push of its step.
TEST(DenseTableTest, DroppedNonfinitePushLeavesValuesSlotsAndUpdatesBitwiseInEveryMode) {
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::SSP, ConsistencyConfig::BSP}) {
    for (bool scanned_by_chunk : {false, true}) {
      SCOPED_TRACE(absl::StrCat(ConsistencyConfig::Mode_Name(mode), scanned_by_chunk));
      TableSpec spec = DenseSpec(6, mode, 0.01f);
      spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
      spec.set_skip_nonfinite(true);
      auto table = MakeTable(spec, {0});
      auto reference = MakeTable(spec, {0});
      const std::vector<float> g0 = {0.5f, -1, 2, 0.25f, -3, 1}, g2 = {1, 1, -0.5f, 4, 2, -1};
      ASSERT_TRUE(PushOne(*table, 0, 0, 0, g0).ok());
      ASSERT_TRUE(PushOne(*reference, 0, 0, 0, g0).ok());
      const auto before = StoredState(*table, 1);

      const std::vector<float> bad = {1, 2, kNaN, 3, kInf, 4};
      const absl::Span<const float> first(bad.data(), 3), second(bad.data() + 3, 3);
      DenseTable::Scanned scanned;
      if (scanned_by_chunk) {
        ASSERT_TRUE(table->ScanChunk(0, first, &scanned).ok());
        ASSERT_TRUE(table->ScanChunk(3, second, &scanned).ok());
      }
      bool skipped = false;
      ASSERT_TRUE(table->Push(0, 1, 0, {first, second}, &skipped, scanned).ok());
      EXPECT_TRUE(skipped);
      EXPECT_EQ(StoredState(*table, 2), before) << "the dropped push changed stored state";
      EXPECT_EQ(table->Clocks().at(0), 2) << "the dropped push is the worker's push of step 1";
      EXPECT_EQ(table->Info().applied_steps(), 2);
      EXPECT_EQ(table->Stats().nonfinite_pushes_skipped(), 1u);

      ASSERT_TRUE(PushOne(*table, 0, 2, 0, g2).ok());
      ASSERT_TRUE(PushOne(*reference, 0, 1, 0, g2).ok());
      EXPECT_EQ(StoredState(*table, 3), StoredState(*reference, 2));
    }
  }
}

TEST(DenseTableTest, AspPullNeverWaits) {
  auto table = MakeTable(DenseSpec(1, ConsistencyConfig::ASP, 0.5f), {0, 1});
  EXPECT_TRUE(table->AwaitPullable(1000, absl::InfinitePast()).ok());
}

TEST(DenseTableTest, SspPullTimesOutNamingTheSlowWorkerAndWakesWhenItPushes) {
  TableSpec spec = DenseSpec(1, ConsistencyConfig::SSP, 0.5f);
  spec.mutable_consistency()->set_staleness(1);
  auto table = MakeTable(spec, {0, 1});
  for (int64_t step = 0; step < 3; ++step) ASSERT_TRUE(PushOne(*table, 0, step, 0, {1}).ok());

  // Worker 1 has clock 0: step 1 is within staleness 1, step 2 is not.
  EXPECT_TRUE(table->AwaitPullable(1, absl::InfinitePast()).ok());
  absl::Status late = table->AwaitPullable(2, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.message()), HasSubstr("worker 1 (clock 0)"));
  EXPECT_THAT(std::string(late.message()), HasSubstr("SSP"));
  EXPECT_THAT(std::string(late.message()), Not(HasSubstr("worker 0")));

  absl::Status waited = absl::UnknownError("not run");
  std::thread reader([&] { waited = table->AwaitPullable(2, absl::Now() + absl::Seconds(30)); });
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {1}).ok());
  reader.join();
  EXPECT_TRUE(waited.ok()) << waited;

  EXPECT_EQ(table->AwaitPullable(3, absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(DenseTableTest, BspPullWakesWhenTheLastWorkerPushes) {
  auto table = MakeTable(DenseSpec(2, ConsistencyConfig::BSP, 0.5f), {0, 1});
  absl::Status waited = absl::UnknownError("not run");
  std::vector<float> seen;
  std::thread reader([&] {
    waited = table->AwaitPullable(1, absl::Now() + absl::Seconds(30));
    if (waited.ok()) seen = ReadAll(*table);
  });
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {1, 2}).ok());
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {3, 4}).ok());
  reader.join();
  ASSERT_TRUE(waited.ok()) << waited;
  EXPECT_THAT(seen, ElementsAre(kInit - 2, kInit - 3));
  EXPECT_EQ(table->Stats().pulls(), 1u);
}

TEST(DenseTableTest, BspPullTimeoutNamesOnlyTheLaggingWorkers) {
  auto table = MakeTable(DenseSpec(1, ConsistencyConfig::BSP, 0.5f), {0, 1, 2});
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {1}).ok());
  ASSERT_TRUE(PushOne(*table, 2, 0, 0, {1}).ok());
  absl::Status s = table->AwaitPullable(1, absl::Now() + absl::Milliseconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr("worker 1 (clock 0)"));
  EXPECT_THAT(msg, HasSubstr("applied_steps=0"));
  EXPECT_THAT(msg, Not(HasSubstr("worker 0")));
  EXPECT_THAT(msg, Not(HasSubstr("worker 2")));
  EXPECT_EQ(table->Stats().pulls(), 0u);
  EXPECT_EQ(table->Stats().rejected_requests(), 1u);
}

TEST(DenseTableTest, ShutdownFailsWaitingPullsWithUnavailable) {
  auto table = MakeTable(DenseSpec(1, ConsistencyConfig::BSP, 0.5f), {0});
  absl::Status waited = absl::UnknownError("not run");
  std::thread reader([&] { waited = table->AwaitPullable(5, absl::Now() + absl::Seconds(30)); });
  table->Shutdown();
  reader.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(table->AwaitPullable(5, absl::InfinitePast()).code(), absl::StatusCode::kUnavailable);
}

TEST(DenseTableTest, ConcurrentAspPushesAreAllAppliedExactly) {
  constexpr int kThreads = 8, kPushes = 500, kSize = 1000;
  constexpr float kStart = 0.25f;
  auto table = MakeTable(DenseSpec(kSize, ConsistencyConfig::ASP, 1.0f, kStart), {});
  for (int w = 0; w < kThreads; ++w) table->AddWorker(w);
  const std::vector<float> grad(kSize, -1.0f);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) {
    threads.emplace_back([&, w] {
      for (int step = 0; step < kPushes; ++step) {
        if (!PushOne(*table, w, step, 0, grad).ok()) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_THAT(ReadAll(*table), Each(kStart + kThreads * kPushes));
  EXPECT_EQ(table->Stats().pushes(), uint64_t{kThreads * kPushes});
  for (int w = 0; w < kThreads; ++w) EXPECT_EQ(table->Clocks().at(w), kPushes);
}

// Pushes of >= 1M values are scanned and applied by several threads; the split must not
// change a single bit, and a NaN in any part must be found and reported at its index.
TEST(DenseTableTest, LargeMultiChunkPushAppliedInParallelMatchesSerialAdamBitwise) {
  constexpr uint64_t kSize = 3000017;  // odd, so parts and chunks do not line up
  TableSpec spec = DenseSpec(kSize, ConsistencyConfig::ASP, 0.01f);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  auto table = MakeTable(spec, {0});
  std::vector<float> grad(kSize);
  for (uint64_t i = 0; i < kSize; ++i) grad[i] = std::sin(0.001f * i) * (1 + i % 5);
  // Chunks of uneven sizes, as a stream would deliver them.
  std::vector<absl::Span<const float>> chunks;
  for (uint64_t at = 0; at < kSize;) {
    uint64_t n = std::min<uint64_t>(kSize - at, 262144 + 1000 * (chunks.size() % 3));
    chunks.push_back(absl::MakeConstSpan(grad).subspan(at, n));
    at += n;
  }
  bool skipped = false;
  for (int step = 0; step < 2; ++step) ASSERT_TRUE(table->Push(0, step, 0, chunks, &skipped).ok());

  auto optimizer = core::MakeOptimizer(spec.optimizer()).value();
  std::vector<float> w(kSize, kInit), m(kSize, 0.0f), v(kSize, 0.0f);
  float* slots[] = {m.data(), v.data()};
  for (int64_t t = 1; t <= 2; ++t) optimizer->Apply(w.data(), grad.data(), slots, kSize, t);
  EXPECT_EQ(ReadAll(*table), w);

  grad[kSize - 5] = kNaN;  // in the last part
  absl::Status s = table->Push(0, 2, 0, chunks, &skipped);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("index ", kSize - 5)));
  EXPECT_EQ(ReadAll(*table), w);
}

// Regression: a finite gradient could make a parameter infinite (a large gradient times the
// learning rate overflows), after which the table could not be exported into another mode.
TEST(DenseTableTest, FiniteGradientWhoseUpdateOverflowsIsRejectedOrSkippedPerTable) {
  constexpr float kHuge = 3e38f;  // finite; 0.5 * 3e38 added to 1.5 stays finite, 4 * it not
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::BSP}) {
    SCOPED_TRACE(ConsistencyConfig::Mode_Name(mode));
    TableSpec spec = DenseSpec(4, mode, 4.0f);
    auto table = MakeTable(spec, {0});
    absl::Status s = PushOne(*table, 0, 0, 0, {1, 1, -kHuge, 1});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("index 2"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("skip_nonfinite"));
    EXPECT_THAT(ReadAll(*table), Each(kInit)) << "a refused push changed the table";
    EXPECT_TRUE(PushOne(*table, 0, 0, 0, {1, 1, 1, 1}).ok());  // the step is still open

    spec.set_skip_nonfinite(true);
    auto skipping = MakeTable(spec, {0});
    bool skipped = false;
    ASSERT_TRUE(PushOne(*skipping, 0, 0, 0, {1, 1, kHuge, 1}, &skipped).ok());
    EXPECT_TRUE(skipped);
    EXPECT_THAT(ReadAll(*skipping), Each(kInit));
    EXPECT_EQ(skipping->Stats().nonfinite_pushes_skipped(), 1u);
  }
  // Adam: g * g overflows in v although lr * g does not.
  TableSpec adam = DenseSpec(2, ConsistencyConfig::ASP, 1e-3f);
  adam.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  auto table = MakeTable(adam, {0});
  absl::Status s = PushOne(*table, 0, 0, 0, {0.5f, 1e21f});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("index 1"));
  EXPECT_THAT(ReadAll(*table), Each(kInit));
}

// Copy on write (ASP): the capture is the state at the Capture call, whatever is pushed
// before CompleteCapture fills it; the pushes themselves apply as usual.
TEST(DenseTableTest, CaptureUnderAspIsThePointInTimeWhilePushesGoOn) {
  constexpr uint64_t kBlock = DenseTable::kCowBlockValues;
  const uint64_t size = 3 * kBlock + 100;  // 4 blocks, the last partial
  TableSpec spec = DenseSpec(size, ConsistencyConfig::ASP, 1.0f);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::MOMENTUM);  // a slot to copy too
  spec.mutable_optimizer()->set_momentum(0.5f);
  auto table = MakeTable(spec, {0});
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, std::vector<float>(size, 1.0f)).ok());
  const uint32_t at_capture = table->Fingerprint();
  absl::Duration pause;
  auto image = table->Capture(1, absl::Now() + absl::Seconds(10), &pause);
  ASSERT_TRUE(image.ok()) << image.status();
  // Pushes touching part of block 1 and the partial last block, and all of it.
  ASSERT_TRUE(PushOne(*table, 0, 1, kBlock + 7, std::vector<float>(10, 2.0f)).ok());
  ASSERT_TRUE(PushOne(*table, 0, 2, size - 3, std::vector<float>(3, 4.0f)).ok());
  ASSERT_TRUE(PushOne(*table, 0, 3, 0, std::vector<float>(size, 0.5f)).ok());
  table->CompleteCapture(image->get(), &pause);
  // The image holds the values and momentum after the first push only: v = 1.5 - 1,
  // momentum 1 (the same for every index).
  EXPECT_THAT(std::vector<float>((*image)->arrays[0].begin(), (*image)->arrays[0].end()),
              Each(kInit - 1.0f));
  EXPECT_THAT(std::vector<float>((*image)->arrays[1].begin(), (*image)->arrays[1].end()),
              Each(1.0f));
  EXPECT_EQ((*image)->header.updates(), 1);
  EXPECT_NE(table->Fingerprint(), at_capture) << "the pushes after the capture were lost";
  // And the table itself took every push.
  const std::vector<float> now = ReadAll(*table);
  EXPECT_NE(now[kBlock + 7], now[0]);
  EXPECT_NE(now[size - 1], now[0]);
}

// Regression (found by fuzz/ps_service_fuzzer): a batch whose second push would overflow
// applied the first. PushAll checks every push under every table's lock before applying.
TEST(DenseTableTest, PushAllAppliesEveryPushOrNone) {
  constexpr float kHuge = 3e38f;
  TableSpec first_spec = DenseSpec(4, ConsistencyConfig::ASP, 4.0f);
  TableSpec second_spec = first_spec;
  second_spec.set_table_id(2);
  auto first = MakeTable(first_spec, {0}), second = MakeTable(second_spec, {0});
  const std::vector<float> ok = {1, 1, 1, 1}, overflowing = {1, -kHuge, 1, 1};
  bool skipped[2];
  auto batch = [&](const std::vector<float>& a, const std::vector<float>& b, int64_t step) {
    return std::vector<DenseTable::PushArgs>{
        {second.get(), 0, step, 0, absl::MakeConstSpan(b), DenseTable::Scanned{}, &skipped[1]},
        {first.get(), 0, step, 0, absl::MakeConstSpan(a), DenseTable::Scanned{}, &skipped[0]}};
  };
  const uint32_t before_first = first->Fingerprint(), before_second = second->Fingerprint();
  size_t refused = 99;
  absl::Status s = DenseTable::PushAll(batch(overflowing, ok, 0), &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(refused, 1u);
  EXPECT_EQ(first->Fingerprint(), before_first) << "the refused batch changed a table";
  EXPECT_EQ(second->Fingerprint(), before_second) << "the refused batch changed a table";
  ASSERT_TRUE(DenseTable::PushAll(batch(ok, ok, 0), &refused).ok());
  EXPECT_THAT(ReadAll(*first), Each(kInit - 4.0f));
  EXPECT_THAT(ReadAll(*second), Each(kInit - 4.0f));
  EXPECT_NE(first->Fingerprint(), before_first);
}

// Under BSP each push is checked alone, scaled by the number of workers; should their sum
// still overflow (a worker joined after the first push), the step leaves the table as it was.
TEST(DenseTableTest, BspStepWhoseSummedUpdateWouldOverflowIsNotApplied) {
  auto table = MakeTable(DenseSpec(2, ConsistencyConfig::BSP, 1.0f), {0, 1});
  ASSERT_TRUE(PushOne(*table, 0, 0, 0, {1.5e38f, 1}).ok());  // x 2 workers: finite
  table->AddWorker(2);
  ASSERT_TRUE(PushOne(*table, 1, 0, 0, {1.1e38f, 1}).ok());  // x 3 workers: finite
  ASSERT_TRUE(PushOne(*table, 2, 0, 0, {1.1e38f, 1}).ok());  // the sum, 3.7e38, is not
  ASSERT_TRUE(table->AwaitPullable(1, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit, kInit)) << "the 4e38 step was applied";
  EXPECT_EQ(table->Stats().nonfinite_pushes_skipped(), 1u);
  for (int32_t w = 0; w < 3; ++w) ASSERT_TRUE(PushOne(*table, w, 1, 0, {1, 1}).ok());
  EXPECT_THAT(ReadAll(*table), ElementsAre(kInit - 3, kInit - 3));  // training goes on
}

}  // namespace
}  // namespace pscluster::ps
