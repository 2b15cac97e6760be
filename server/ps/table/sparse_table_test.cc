#include "server/ps/table/sparse_table.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sharding.h"
#include "core/init/initializer.h"
#include "core/optimizer/adam_reference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "server/ps/table/shard.h"
#include "server/ps/table/sparse_table_testing.h"

namespace pscluster::ps {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TableSpec UniformSpec(uint32_t dim, uint64_t seed) {
  TableSpec spec = SparseSpec(dim, ConsistencyConfig::ASP, 0.5f);
  spec.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
  spec.mutable_initializer()->set_scale(2.0f);
  spec.mutable_initializer()->set_seed(seed);
  return spec;
}

// The first key >= `from` that SparseShardOf places on `shard` of `num_shards`.
uint64_t KeyOnShard(uint32_t shard, uint32_t num_shards, uint64_t from = 0) {
  for (uint64_t k = from;; ++k) {
    if (SparseShardOf(k, num_shards) == shard) return k;
  }
}

std::vector<float> InitRow(const TableSpec& spec, uint64_t key) {
  std::vector<float> row(spec.dim());
  core::InitSparseRow(spec.initializer(), key, absl::MakeSpan(row));
  return row;
}

using core::testing::AdamRef;

TableSpec SkippingAdamSpec(uint32_t dim, ConsistencyConfig::Mode mode) {
  TableSpec spec = SparseSpec(dim, mode, 0.1f);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  spec.set_skip_nonfinite(true);
  return spec;
}

// Regression: a sparse table grew through pulls past --max_table_bytes. Rows never pushed
// read as the seeded initializer's values and are not stored.
TEST(SparseTableTest, RowsNeverPushedReadAsTheSeededInitializerAndAreNotStored) {
  const TableSpec spec = UniformSpec(4, 7);
  auto table = MakeTable(spec, {0});
  EXPECT_EQ(table->Info().num_rows(), 0u);

  const uint64_t a = 3, b = 1000000007;
  std::vector<float> out = ReadRows(*table, {a, b, a});
  EXPECT_EQ(table->Info().num_rows(), 0u);
  std::vector<float> ra = InitRow(spec, a), rb = InitRow(spec, b);
  EXPECT_THAT(std::vector<float>(out.begin(), out.begin() + 4), ElementsAreArray(ra));
  EXPECT_THAT(std::vector<float>(out.begin() + 4, out.begin() + 8), ElementsAreArray(rb));
  EXPECT_THAT(std::vector<float>(out.begin() + 8, out.end()), ElementsAreArray(ra));
  EXPECT_NE(ra, rb);
  EXPECT_NE(ra[0], ra[1]);
  EXPECT_THAT(out, Each(::testing::AllOf(::testing::Ge(-2.0f), ::testing::Lt(2.0f))));

  // Reading again gives the same values and still stores nothing.
  EXPECT_THAT(ReadRows(*table, {a}), ElementsAreArray(ra));
  EXPECT_EQ(table->Info().num_rows(), 0u);
  EXPECT_EQ(table->Stats().bytes_pulled(), (12 + 4) * sizeof(float));
}

TEST(SparseTableTest, SameKeyInitialisesIdenticallyOnAnotherShardInstance) {
  const TableSpec spec = UniformSpec(8, 99);
  const uint64_t key = KeyOnShard(1, 2, 12345);

  Shard first(ShardOptions{1, 2});
  first.RegisterWorker(0);
  ASSERT_TRUE(first.CreateTable(spec).ok());
  SparseTable* t1 = first.GetSparse(spec.table_id(), 0).value();
  std::vector<float> v1 = ReadRows(*t1, {key});

  // Another instance that materialises other rows first.
  Shard second(ShardOptions{1, 2});
  second.RegisterWorker(5);
  ASSERT_TRUE(second.CreateTable(spec).ok());
  SparseTable* t2 = second.GetSparse(spec.table_id(), 5).value();
  const uint64_t other = KeyOnShard(1, 2, key + 1);
  ReadRows(*t2, {other});
  std::vector<float> v2 = ReadRows(*t2, {other, key});
  EXPECT_THAT(std::vector<float>(v2.begin() + 8, v2.end()), ElementsAreArray(v1));
  EXPECT_NE(std::vector<float>(v2.begin(), v2.begin() + 8), v1);

  // The value depends on (seed, key) only, not on the shard layout; another seed differs.
  Shard single(ShardOptions{0, 1});
  single.RegisterWorker(0);
  ASSERT_TRUE(single.CreateTable(spec).ok());
  EXPECT_THAT(ReadRows(*single.GetSparse(spec.table_id(), 0).value(), {key}), ElementsAreArray(v1));
  auto reseeded = MakeTable(UniformSpec(8, 100), {0});
  EXPECT_NE(ReadRows(*reseeded, {key}), v1);
}

TEST(SparseTableTest, KeyOfAnotherShardIsRejected) {
  auto table = MakeTable(SparseSpec(2, ConsistencyConfig::ASP, 0.5f), {0}, 0, 2);
  const uint64_t mine = KeyOnShard(0, 2), theirs = KeyOnShard(1, 2);

  std::vector<float> out(4);
  absl::Status read = table->Read({mine, theirs}, absl::MakeSpan(out));
  EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(read.message()), HasSubstr("keys[1]"));
  EXPECT_THAT(std::string(read.message()), HasSubstr("belongs to shard 1"));

  absl::Status push = PushRows(*table, 0, 0, {theirs}, {1, 1});
  EXPECT_EQ(push.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(push.message()), HasSubstr("belongs to shard 1"));

  // All or nothing: not even the valid key was materialised, and the clock did not move.
  EXPECT_EQ(table->Info().num_rows(), 0u);
  EXPECT_EQ(table->Clocks().at(0), 0);
  EXPECT_EQ(table->Stats().rejected_requests(), 2u);
  EXPECT_TRUE(table->CheckKeys({mine}).ok());
}

TEST(SparseTableTest, KeysOutsideKeySpaceAreOutOfRange) {
  TableSpec spec = SparseSpec(1, ConsistencyConfig::ASP, 0.5f);
  spec.set_key_space(100);
  auto table = MakeTable(spec, {0});
  EXPECT_THAT(ReadRows(*table, {0, 99}), ElementsAre(kInit, kInit));

  std::vector<float> out(1);
  absl::Status read = table->Read({100}, absl::MakeSpan(out));
  EXPECT_EQ(read.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(read.message()), HasSubstr("key_space 100"));
  EXPECT_EQ(table->Read({std::numeric_limits<uint64_t>::max()}, absl::MakeSpan(out)).code(),
            absl::StatusCode::kOutOfRange);

  absl::Status push = PushRows(*table, 0, 0, {5, 1000}, {1, 1});
  EXPECT_EQ(push.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(push.message()), HasSubstr("keys[1]=1000"));
  EXPECT_EQ(table->Info().num_rows(), 0u);  // reads store nothing, the push was refused
  EXPECT_THAT(ReadRows(*table, {99}), ElementsAre(kInit));
}

TEST(SparseTableTest, DuplicateKeysInOnePushAreSummed) {
  auto table = MakeTable(SparseSpec(2, ConsistencyConfig::ASP, 0.5f), {0});
  ASSERT_TRUE(PushRows(*table, 0, 0, {5, 7, 5}, {1, 2, 10, 20, 3, 4}).ok());
  EXPECT_EQ(table->Info().num_rows(), 2u);
  EXPECT_THAT(ReadRows(*table, {5, 7}), ElementsAre(kInit - 0.5f * (1 + 3), kInit - 0.5f * (2 + 4),
                                                    kInit - 0.5f * 10, kInit - 0.5f * 20));
  EXPECT_EQ(table->Stats().pushes(), 1u);
  EXPECT_EQ(table->Stats().bytes_pushed(), 6 * sizeof(float));
}

TEST(SparseTableTest, DuplicateKeysInOnePushAreOneAdamUpdate) {
  TableSpec spec = SparseSpec(1, ConsistencyConfig::ASP, 0.1f);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  auto table = MakeTable(spec, {0});

  AdamRef once{kInit};
  once.Step(1.0 + 3.0, 0.1);
  AdamRef twice{kInit};
  twice.Step(1.0, 0.1);
  twice.Step(3.0, 0.1);
  ASSERT_GT(std::fabs(once.w - twice.w), 1e-2);

  ASSERT_TRUE(PushRows(*table, 0, 0, {9, 9}, {1, 3}).ok());
  EXPECT_NEAR(ReadRows(*table, {9})[0], once.w, 1e-5);
}

TEST(SparseTableTest, BspAppliesTheSumOfBothWorkersRowsOnceBothPushed) {
  auto table = MakeTable(SparseSpec(2, ConsistencyConfig::BSP, 0.5f), {0, 1});
  const uint64_t a = 11, b = 22;
  ASSERT_TRUE(PushRows(*table, 1, 0, {a}, {1, 2}).ok());
  EXPECT_THAT(ReadRows(*table, {a}), ElementsAre(kInit, kInit));
  absl::Status wait = table->AwaitPullable(1, absl::InfinitePast());
  EXPECT_EQ(wait.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(wait.message()), HasSubstr("worker 0 (clock 0)"));

  ASSERT_TRUE(PushRows(*table, 0, 0, {b, a}, {10, 10, 3, 4}).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  EXPECT_TRUE(table->AwaitPullable(1, absl::InfinitePast()).ok());
  EXPECT_THAT(ReadRows(*table, {a, b}), ElementsAre(kInit - 0.5f * (3 + 1), kInit - 0.5f * (4 + 2),
                                                    kInit - 0.5f * 10, kInit - 0.5f * 10));

  // Duplicate and stale pushes are refused as for dense tables.
  EXPECT_EQ(PushRows(*table, 0, 0, {a}, {1, 1}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(PushRows(*table, 0, 1, {a}, {1, 1}).ok());
  EXPECT_EQ(PushRows(*table, 0, 1, {a}, {1, 1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table->Info().applied_steps(), 1);
}

// A BSP push too large for one message comes in parts: it counts once its last part has
// come, its rows summed in arrival order (key a is in two parts); a repeated part is refused
// as already pushed, a part count that changes mid-push is invalid.
TEST(SparseTableTest, BspPushInPartsCountsAtItsLastPart) {
  auto table = MakeTable(SparseSpec(2, ConsistencyConfig::BSP, 0.5f), {0, 1});
  const uint64_t a = 11, b = 22, c = 33;
  bool skipped = false;
  ASSERT_TRUE(PushRows(*table, 1, 0, {a}, {1, 2}).ok());
  ASSERT_TRUE(
      table->Push(0, 0, std::vector<uint64_t>{a, b}, std::vector<float>{1, 1, 5, 5}, &skipped, 0, 3)
          .ok());
  absl::Status again =
      table->Push(0, 0, std::vector<uint64_t>{a}, std::vector<float>{9, 9}, &skipped, 0, 3);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.message()), HasSubstr("already pushed step 0 (part 0 of 3)"));
  EXPECT_EQ(
      table->Push(0, 0, std::vector<uint64_t>{c}, std::vector<float>{1, 1}, &skipped, 1, 2).code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      table->Push(0, 0, std::vector<uint64_t>{c, a}, std::vector<float>{7, 7, 2, 2}, &skipped, 2, 3)
          .ok());
  EXPECT_EQ(table->Info().applied_steps(), 0) << "applied before the push's last part";
  ASSERT_TRUE(
      table->Push(0, 0, std::vector<uint64_t>{}, std::vector<float>{}, &skipped, 1, 3).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  EXPECT_THAT(ReadRows(*table, {a, b, c}),
              ElementsAre(kInit - 0.5f * (1 + 2 + 1), kInit - 0.5f * (1 + 2 + 2), kInit - 0.5f * 5,
                          kInit - 0.5f * 5, kInit - 0.5f * 7, kInit - 0.5f * 7));
  EXPECT_EQ(PushRows(*table, 0, 0, {a}, {1, 1}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SparseTableTest, BspSumsRowsInWorkerIdOrderWhateverThePushOrder) {
  const std::vector<std::vector<float>> g = {{1e8f}, {1.0f}, {-1e8f}};
  float sum = g[0][0];
  sum += g[1][0];
  sum += g[2][0];
  for (const std::vector<int32_t>& order :
       {std::vector<int32_t>{0, 1, 2}, std::vector<int32_t>{2, 0, 1}}) {
    auto table = MakeTable(SparseSpec(1, ConsistencyConfig::BSP, 0.5f), {0, 1, 2});
    for (int32_t w : order) ASSERT_TRUE(PushRows(*table, w, 0, {4}, g[w]).ok());
    EXPECT_THAT(ReadRows(*table, {4}), ElementsAre(kInit - 0.5f * sum));
  }
}

TEST(SparseTableTest, GradsLengthMismatchIsInvalidArgument) {
  auto table = MakeTable(SparseSpec(3, ConsistencyConfig::ASP, 0.5f), {0});
  absl::Status s = PushRows(*table, 0, 0, {1, 2}, {1, 1, 1, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("holds 5 values"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("= 6"));
  EXPECT_EQ(PushRows(*table, 0, 0, {1}, {1, 1, 1, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->Info().num_rows(), 0u);
  EXPECT_EQ(table->Clocks().at(0), 0);
  EXPECT_EQ(table->Stats().pushes(), 0u);
  EXPECT_EQ(table->Stats().rejected_requests(), 2u);
}

TEST(SparseTableTest, NonFiniteGradientIsRejectedUnlessSkipNonfinite) {
  TableSpec spec = SparseSpec(2, ConsistencyConfig::ASP, 0.5f);
  auto strict = MakeTable(spec, {0});
  absl::Status s = PushRows(*strict, 0, 0, {1, 2}, {1, 1, 1, kNaN});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("index 3"));
  EXPECT_EQ(strict->Info().num_rows(), 0u);
  EXPECT_EQ(strict->Clocks().at(0), 0);

  spec.set_skip_nonfinite(true);
  auto lenient = MakeTable(spec, {0});
  ASSERT_TRUE(PushRows(*lenient, 0, 0, {1}, {1, 1}).ok());
  bool skipped = false;
  ASSERT_TRUE(PushRows(*lenient, 0, 1, {1, 2}, {1, 1, 1, kNaN}, &skipped).ok());
  EXPECT_TRUE(skipped);
  EXPECT_EQ(lenient->Info().num_rows(), 1u);
  EXPECT_THAT(ReadRows(*lenient, {1}), ElementsAre(kInit - 0.5f, kInit - 0.5f));
  EXPECT_EQ(lenient->Stats().nonfinite_pushes_skipped(), 1u);
  EXPECT_EQ(lenient->Clocks().at(0), 2);
}

TEST(SparseTableTest, AdamBiasCorrectionCountsUpdatesPerRow) {
  TableSpec spec = SparseSpec(1, ConsistencyConfig::ASP, 0.1f);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  spec.mutable_initializer()->set_value(0.5f);
  auto table = MakeTable(spec, {0});
  const uint64_t a = 100, b = 200;

  AdamRef ra{0.5}, rb{0.5};
  ASSERT_TRUE(PushRows(*table, 0, 0, {a}, {1.0f}).ok());
  ra.Step(1.0, 0.1);
  ASSERT_TRUE(PushRows(*table, 0, 1, {a, b}, {0.5f, 0.5f}).ok());
  ra.Step(0.5, 0.1);  // row a's second update: t = 2
  rb.Step(0.5, 0.1);  // row b's first update: t = 1

  // Had row b been corrected with the table's push count (t = 2), it would differ clearly.
  AdamRef wrong{0.5};
  wrong.t = 1;
  wrong.Step(0.5, 0.1);
  ASSERT_GT(std::fabs(wrong.w - rb.w), 1e-2);

  std::vector<float> out = ReadRows(*table, {a, b});
  EXPECT_NEAR(out[0], ra.w, 1e-5);
  EXPECT_NEAR(out[1], rb.w, 1e-5);
  EXPECT_NEAR(out[1], 0.5 - 0.1, 1e-5);  // first Adam step moves by lr * sign(g)
}

// Regression: the first part of a push in parts did not count its new rows as staged, so
// the later parts' check let the whole push store more than max_rows.
TEST(SparseTableTest, APushInPartsCountsEveryPartsNewRowsAgainstMaxRows) {
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::BSP}) {
    SCOPED_TRACE(ConsistencyConfig::Mode_Name(mode));
    auto table = SparseTable::Create(SparseSpec(1, mode, 0.5f), 0, 1, /*max_rows=*/3).value();
    table->AddWorker(0);
    bool skipped = false;
    ASSERT_TRUE(
        table->Push(0, 0, std::vector<uint64_t>{1, 2}, std::vector<float>{1, 1}, &skipped, 0, 2)
            .ok());
    const absl::Status s = table->Push(0, 0, std::vector<uint64_t>{3, 4}, std::vector<float>{1, 1},
                                       &skipped, 1, 2);  // 4 > 3
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    ASSERT_TRUE(table->Push(0, 0, std::vector<uint64_t>{3}, std::vector<float>{1}, &skipped, 1, 2)
                    .ok());  // exactly 3
    ASSERT_TRUE(table->AwaitPullable(1, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(table->Info().num_rows(), 3u);
  }
}

// Regression: nothing bounded a sparse table's rows; pushes may store at most max_rows.
TEST(SparseTableTest, PushesPastMaxRowsAreResourceExhaustedAndChangeNothing) {
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::BSP}) {
    SCOPED_TRACE(ConsistencyConfig::Mode_Name(mode));
    auto table = SparseTable::Create(SparseSpec(1, mode, 0.5f), 0, 1, /*max_rows=*/3).value();
    table->AddWorker(0);
    ASSERT_TRUE(PushRows(*table, 0, 0, {1, 2}, {1, 1}).ok());
    absl::Status s = PushRows(*table, 0, 1, {1, 3, 4}, {1, 1, 1});  // 2 new: 4 > 3
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("max_table_bytes"));
    ASSERT_TRUE(PushRows(*table, 0, 1, {1, 3}, {1, 1}).ok());  // 1 new: exactly 3
    ASSERT_TRUE(table->AwaitPullable(2, absl::Now() + absl::Seconds(10)).ok());
    EXPECT_EQ(table->Info().num_rows(), 3u);
    EXPECT_EQ(PushRows(*table, 0, 2, {9}, {1}).code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(PushRows(*table, 0, 2, {1, 2, 3}, {1, 1, 1}).ok());  // stored rows: fine
    EXPECT_EQ(table->Info().num_rows(), 3u);
    std::vector<float> out(100);  // pulls of unknown keys store nothing
    std::vector<uint64_t> keys(100);
    for (uint64_t k = 0; k < 100; ++k) keys[k] = 1000 + k;
    ASSERT_TRUE(table->Read(keys, absl::MakeSpan(out)).ok());
    EXPECT_THAT(out, Each(kInit));
    EXPECT_EQ(table->Info().num_rows(), 3u);
  }
}

// Regression: a finite gradient could make a row infinite.
TEST(SparseTableTest, FiniteGradientWhoseUpdateOverflowsIsRejectedOrSkippedPerTable) {
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::BSP}) {
    SCOPED_TRACE(ConsistencyConfig::Mode_Name(mode));
    TableSpec spec = SparseSpec(2, mode, 4.0f);
    auto table = MakeTable(spec, {0});
    absl::Status s = PushRows(*table, 0, 0, {5, 7}, {1, 1, 3e38f, 1});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("key 7"));
    EXPECT_EQ(table->Info().num_rows(), 0u);
    spec.set_skip_nonfinite(true);
    auto skipping = MakeTable(spec, {0});
    bool skipped = false;
    ASSERT_TRUE(PushRows(*skipping, 0, 0, {5, 7}, {1, 1, 3e38f, 1}, &skipped).ok());
    EXPECT_TRUE(skipped);
    EXPECT_EQ(skipping->Info().num_rows(), 0u);
  }
}

// Regression: under ASP and SSP each part of a push in parts was applied as it came, so a
// skip_nonfinite push with a NaN in one part, answered OK and counted as dropped, still
// changed the rows of its other parts: their values, Adam slots and update counts, and
// stored a new row. A dropped push now changes no stored row in any mode; it still counts
// as the worker's push of its step, and the next push gives what it gives on a table that
// never saw the dropped one.
TEST(SparseTableTest, NonFinitePartOfAPushInPartsDropsTheWholePushInEveryMode) {
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::SSP, ConsistencyConfig::BSP}) {
    SCOPED_TRACE(ConsistencyConfig::Mode_Name(mode));
    const TableSpec spec = SkippingAdamSpec(2, mode);
    auto table = MakeTable(spec, {0});
    auto reference = MakeTable(spec, {0});
    const uint64_t a = 11, b = 22, c = 33;
    ASSERT_TRUE(PushRows(*table, 0, 0, {a, b}, {0.5f, -1, 2, 0.25f}).ok());
    ASSERT_TRUE(PushRows(*reference, 0, 0, {a, b}, {0.5f, -1, 2, 0.25f}).ok());
    const std::map<uint64_t, StoredRow> before = StoredRows(*table);

    bool skipped = true;
    ASSERT_TRUE(table
                    ->Push(0, 1, std::vector<uint64_t>{a, c}, std::vector<float>{3, 3, 1, 1},
                           &skipped, 0, 2)
                    .ok());
    EXPECT_FALSE(skipped) << "a finite part is not dropped by itself";
    ASSERT_TRUE(
        table->Push(0, 1, std::vector<uint64_t>{b}, std::vector<float>{kNaN, 1}, &skipped, 1, 2)
            .ok());
    EXPECT_TRUE(skipped);
    EXPECT_EQ(StoredRows(*table), before) << "the dropped push changed stored rows";
    EXPECT_EQ(table->Info().num_rows(), 2u);
    EXPECT_EQ(table->Stats().nonfinite_pushes_skipped(), 1u);
    EXPECT_EQ(table->Clocks().at(0), 2) << "the dropped push is the worker's push of step 1";
    EXPECT_EQ(table->Info().applied_steps(), 2);

    ASSERT_TRUE(PushRows(*table, 0, 2, {a, c}, {-0.75f, 4, 1, -2}).ok());
    ASSERT_TRUE(PushRows(*reference, 0, 1, {a, c}, {-0.75f, 4, 1, -2}).ok());
    EXPECT_EQ(StoredRows(*table), StoredRows(*reference));
  }
}

// Regression: under ASP and SSP each part of a push in parts was an optimizer update of its
// own, so a key in two parts was updated twice (two Adam steps, its update count 2) where
// one push of the same rows updates it once with their sum. A push in parts now is one
// update per key in every mode, applied at its last part.
TEST(SparseTableTest, PushInPartsIsOneUpdatePerKeyInEveryMode) {
  for (auto mode : {ConsistencyConfig::ASP, ConsistencyConfig::SSP, ConsistencyConfig::BSP}) {
    SCOPED_TRACE(ConsistencyConfig::Mode_Name(mode));
    const TableSpec spec = SkippingAdamSpec(2, mode);
    auto in_parts = MakeTable(spec, {0});
    auto whole = MakeTable(spec, {0});
    const uint64_t a = 11, b = 22;
    bool skipped = false;
    ASSERT_TRUE(
        in_parts->Push(0, 0, std::vector<uint64_t>{a}, std::vector<float>{1, -2}, &skipped, 0, 2)
            .ok());
    EXPECT_EQ(in_parts->Info().num_rows(), 0u) << "applied before the push's last part";
    EXPECT_EQ(in_parts->CaptureNow().status().code(), absl::StatusCode::kUnavailable)
        << "a state transfer would lose the part already taken";
    ASSERT_TRUE(in_parts
                    ->Push(0, 0, std::vector<uint64_t>{b, a}, std::vector<float>{3, 3, 5, 7},
                           &skipped, 1, 2)
                    .ok());
    ASSERT_TRUE(PushRows(*whole, 0, 0, {a, b, a}, {1, -2, 3, 3, 5, 7}).ok());
    const std::map<uint64_t, StoredRow> rows = StoredRows(*in_parts);
    EXPECT_EQ(rows, StoredRows(*whole));
    ASSERT_EQ(rows.count(a), 1u);
    EXPECT_EQ(rows.at(a).first, 1) << "key a was updated once per part";
    EXPECT_EQ(in_parts->Stats().pushes(), 1u);
  }
}

}  // namespace
}  // namespace pscluster::ps
