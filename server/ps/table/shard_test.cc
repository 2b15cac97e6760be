#include "server/ps/table/shard.h"

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sharding.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"

namespace pscluster::ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TableSpec DenseSpec(uint32_t id, uint64_t size,
                    ConsistencyConfig::Mode mode = ConsistencyConfig::ASP) {
  TableSpec spec;
  spec.set_table_id(id);
  spec.set_name("dense");
  spec.set_kind(TableSpec::DENSE);
  spec.set_size(size);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_initializer()->set_kind(InitializerConfig::CONSTANT);
  spec.mutable_initializer()->set_value(1.0f);
  return spec;
}

TableSpec SparseSpec(uint32_t id, uint32_t dim,
                     ConsistencyConfig::Mode mode = ConsistencyConfig::ASP) {
  TableSpec spec = DenseSpec(id, 0, mode);
  spec.set_name("sparse");
  spec.set_kind(TableSpec::SPARSE);
  spec.set_dim(dim);
  return spec;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ShardTest, RegisterWorkerIsIdempotentAndListsEveryWorker) {
  Shard shard(ShardOptions{1, 3});
  RegisterWorkerResponse r = shard.RegisterWorker(4);
  EXPECT_EQ(r.shard_id(), 1u);
  EXPECT_EQ(r.num_shards(), 3u);
  EXPECT_THAT(r.registered_workers(), ElementsAre(4));
  shard.RegisterWorker(2);
  r = shard.RegisterWorker(4);
  EXPECT_THAT(r.registered_workers(), ElementsAre(2, 4));
}

TEST(ShardTest, UnregisteredWorkerCannotGetTables) {
  Shard shard(ShardOptions{});
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 4)).ok());
  ASSERT_TRUE(shard.CreateTable(SparseSpec(2, 4)).ok());

  absl::Status dense = shard.GetDense(1, 7).status();
  EXPECT_EQ(dense.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(dense), HasSubstr("worker_id 7"));
  EXPECT_THAT(Message(dense), HasSubstr("RegisterWorker"));
  EXPECT_EQ(shard.GetSparse(2, 7).status().code(), absl::StatusCode::kFailedPrecondition);

  shard.RegisterWorker(7);
  EXPECT_TRUE(shard.GetDense(1, 7).ok());
  EXPECT_TRUE(shard.GetSparse(2, 7).ok());
  EXPECT_EQ(shard.GetDense(1, 8).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShardTest, CreatingAnIdenticalTableAgainIsOkWithCreatedFalse) {
  Shard shard(ShardOptions{0, 2});
  shard.RegisterWorker(0);
  const TableSpec spec = DenseSpec(1, 10);
  auto first = shard.CreateTable(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created());
  EXPECT_EQ(first->info().shard_begin(), 0u);
  EXPECT_EQ(first->info().shard_end(), 5u);
  DenseTable* table = shard.GetDense(1, 0).value();

  bool skipped = false;
  const std::vector<float> g = {2, 2, 2, 2, 2};
  ASSERT_TRUE(table->Push(0, 0, 0, {absl::MakeConstSpan(g)}, &skipped).ok());

  auto second = shard.CreateTable(spec);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->created());
  EXPECT_EQ(second->info().spec().size(), 10u);
  // The existing table is kept, state and all.
  EXPECT_EQ(shard.GetDense(1, 0).value(), table);
  std::vector<float> out(5);
  ASSERT_TRUE(table->Read(0, absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ::testing::Each(0.0f));
  EXPECT_EQ(shard.Stats().tables_size(), 1);
}

TEST(ShardTest, SameIdWithAnotherSpecIsAlreadyExistsNamingTheField) {
  Shard shard(ShardOptions{});
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 10)).ok());

  absl::Status size = shard.CreateTable(DenseSpec(1, 20)).status();
  EXPECT_EQ(size.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(size), HasSubstr("size"));
  EXPECT_THAT(Message(size), HasSubstr("table 1"));

  TableSpec lr = DenseSpec(1, 10);
  lr.mutable_optimizer()->set_learning_rate(0.25f);
  absl::Status lr_status = shard.CreateTable(lr).status();
  EXPECT_EQ(lr_status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(lr_status), HasSubstr("learning_rate"));

  TableSpec mode = DenseSpec(1, 10, ConsistencyConfig::BSP);
  EXPECT_EQ(shard.CreateTable(mode).status().code(), absl::StatusCode::kAlreadyExists);

  // A different kind under the same id too.
  absl::Status kind = shard.CreateTable(SparseSpec(1, 4)).status();
  EXPECT_EQ(kind.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(kind), HasSubstr("kind"));

  EXPECT_EQ(shard.GetTable(1).value()->spec().size(), 10u);
}

TEST(ShardTest, InvalidSpecsAreInvalidArgumentNamingTheField) {
  struct Case {
    const char* field;
    TableSpec spec;
  };
  std::vector<Case> cases;
  cases.push_back({"size", DenseSpec(1, 0)});
  cases.push_back({"dim", SparseSpec(1, 0)});
  {
    TableSpec s = DenseSpec(1, 4, ConsistencyConfig::SSP);
    s.mutable_consistency()->set_staleness(-1);
    cases.push_back({"staleness", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_optimizer()->set_learning_rate(0.0f);
    cases.push_back({"learning_rate", s});
  }
  {
    TableSpec s = SparseSpec(1, 4);
    s.mutable_optimizer()->set_learning_rate(-1.0f);
    cases.push_back({"learning_rate", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_optimizer()->set_learning_rate(std::numeric_limits<float>::infinity());
    cases.push_back({"learning_rate", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
    s.mutable_optimizer()->set_beta1(1.5f);
    cases.push_back({"beta1", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_optimizer()->set_kind(OptimizerConfig::MOMENTUM);
    s.mutable_optimizer()->set_momentum(1.0f);
    cases.push_back({"momentum", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
    s.mutable_initializer()->set_scale(-1.0f);
    cases.push_back({"scale", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_initializer()->set_value(std::numeric_limits<float>::quiet_NaN());
    cases.push_back({"value", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.set_kind(static_cast<TableSpec::Kind>(7));
    cases.push_back({"kind", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_consistency()->set_mode(static_cast<ConsistencyConfig::Mode>(9));
    cases.push_back({"mode", s});
  }
  {
    TableSpec s = DenseSpec(1, 4);
    s.mutable_optimizer()->set_kind(static_cast<OptimizerConfig::Kind>(42));
    cases.push_back({"optimizer.kind", s});
  }

  Shard shard(ShardOptions{});
  for (const Case& c : cases) {
    EXPECT_EQ(ValidateTableSpec(c.spec).code(), absl::StatusCode::kInvalidArgument) << c.field;
    absl::Status s = shard.CreateTable(c.spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(Message(s), HasSubstr(c.field));
  }
  EXPECT_EQ(shard.GetTable(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shard.Stats().tables_size(), 0);
}

TEST(ShardTest, UnknownTableIsNotFound) {
  Shard shard(ShardOptions{2, 4});
  shard.RegisterWorker(0);
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 8)).ok());
  absl::Status s = shard.GetTable(99).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), HasSubstr("99"));
  EXPECT_THAT(Message(s), Not(HasSubstr("holds no table")));
  // A shard with no table at all says how that happens (a restart without --restore).
  EXPECT_THAT(Message(Shard(ShardOptions{2, 4}).GetTable(1).status()),
              HasSubstr("it holds no table: restarted empty? start it with --restore"));
  EXPECT_EQ(shard.GetDense(99, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shard.GetSparse(99, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShardTest, GettingATableAsTheOtherKindIsFailedPrecondition) {
  Shard shard(ShardOptions{});
  shard.RegisterWorker(0);
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 8)).ok());
  ASSERT_TRUE(shard.CreateTable(SparseSpec(2, 8)).ok());
  absl::Status sparse_as_dense = shard.GetDense(2, 0).status();
  EXPECT_EQ(sparse_as_dense.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(sparse_as_dense), HasSubstr("SPARSE"));
  absl::Status dense_as_sparse = shard.GetSparse(1, 0).status();
  EXPECT_EQ(dense_as_sparse.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(dense_as_sparse), HasSubstr("DENSE"));
}

TEST(ShardTest, TablesLargerThanMaxTableBytesAreResourceExhausted) {
  ShardOptions options;
  options.max_table_bytes = 400;  // 100 floats
  options.max_sparse_dim = 16;
  Shard shard(options);
  EXPECT_TRUE(shard.CreateTable(DenseSpec(1, 100)).ok());

  absl::Status too_big = shard.CreateTable(DenseSpec(2, 101)).status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(too_big), HasSubstr("400"));

  // Optimizer state counts: Adam keeps two more floats per value.
  TableSpec adam = DenseSpec(3, 34);
  adam.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  EXPECT_EQ(shard.CreateTable(adam).status().code(), absl::StatusCode::kResourceExhausted);
  adam.set_size(33);
  EXPECT_TRUE(shard.CreateTable(adam).ok());

  // A huge tensor does not overflow the computation.
  EXPECT_EQ(shard.CreateTable(DenseSpec(4, std::numeric_limits<uint64_t>::max())).status().code(),
            absl::StatusCode::kResourceExhausted);

  // Only this shard's slice counts.
  ShardOptions split = options;
  split.shard_id = 1;
  split.num_shards = 2;
  Shard half(split);
  EXPECT_TRUE(half.CreateTable(DenseSpec(1, 200)).ok());
  EXPECT_EQ(half.CreateTable(DenseSpec(2, 202)).status().code(),
            absl::StatusCode::kResourceExhausted);

  EXPECT_TRUE(shard.CreateTable(SparseSpec(10, 16)).ok());
  absl::Status wide = shard.CreateTable(SparseSpec(11, 17)).status();
  EXPECT_EQ(wide.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(wide), HasSubstr("dim"));
  EXPECT_EQ(shard.GetTable(2).status().code(), absl::StatusCode::kNotFound);
}

// Many tables, each under max_table_bytes, cannot together pass max_memory_bytes: the one
// that would is refused, and the shard keeps the others.
TEST(ShardTest, DenseTablesPastMaxMemoryBytesTogetherAreResourceExhausted) {
  ShardOptions options;
  options.max_table_bytes = 400;    // 100 floats each
  options.max_memory_bytes = 1000;  // 250 floats in all
  Shard shard(options);
  EXPECT_TRUE(shard.CreateTable(DenseSpec(1, 100)).ok());
  EXPECT_TRUE(shard.CreateTable(DenseSpec(2, 100)).ok());
  absl::Status third = shard.CreateTable(DenseSpec(3, 100)).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(third), HasSubstr("table 3 needs 400 bytes on this shard beside the 800"));
  EXPECT_THAT(Message(third), HasSubstr("--max_memory_bytes"));
  EXPECT_TRUE(shard.CreateTable(DenseSpec(3, 50)).ok());
  EXPECT_TRUE(shard.CreateTable(DenseSpec(1, 100)).ok()) << "the same spec again: no new table";
}

TEST(ShardTest, StatsReportTablesAndWorkerClocks) {
  Shard shard(ShardOptions{1, 2});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 10)).ok());
  ASSERT_TRUE(shard.CreateTable(SparseSpec(2, 2)).ok());
  shard.RegisterWorker(3);  // registered, never pushed

  bool skipped = false;
  DenseTable* dense = shard.GetDense(1, 0).value();
  const std::vector<float> g = {1, 1, 1};
  ASSERT_TRUE(dense->Push(0, 4, 5, {absl::MakeConstSpan(g)}, &skipped).ok());
  SparseTable* sparse = shard.GetSparse(2, 1).value();
  uint64_t key = 0;
  while (SparseShardOf(key, 2) != 1) ++key;
  const std::vector<uint64_t> keys = {key};
  const std::vector<float> row = {1, 1};
  ASSERT_TRUE(sparse->Push(1, 2, keys, row, &skipped).ok());
  std::vector<float> out(2);
  ASSERT_TRUE(sparse->Read(keys, absl::MakeSpan(out)).ok());

  StatsResponse stats = shard.Stats();
  EXPECT_EQ(stats.shard_id(), 1u);
  EXPECT_EQ(stats.num_shards(), 2u);
  ASSERT_EQ(stats.tables_size(), 2);
  const TableStats& d = stats.tables(0);
  EXPECT_EQ(d.info().spec().table_id(), 1u);
  EXPECT_EQ(d.info().shard_begin(), 5u);
  EXPECT_EQ(d.info().shard_end(), 10u);
  EXPECT_EQ(d.pushes(), 1u);
  EXPECT_EQ(d.bytes_pushed(), 3 * sizeof(float));
  const TableStats& s = stats.tables(1);
  EXPECT_EQ(s.info().spec().table_id(), 2u);
  EXPECT_EQ(s.info().num_rows(), 1u);
  EXPECT_EQ(s.pushes(), 1u);
  EXPECT_EQ(s.bytes_pulled(), 2 * sizeof(float));

  ASSERT_EQ(stats.workers_size(), 3);
  EXPECT_EQ(stats.workers(0).worker_id(), 0);
  EXPECT_EQ(stats.workers(0).clock(), 5);
  EXPECT_EQ(stats.workers(1).worker_id(), 1);
  EXPECT_EQ(stats.workers(1).clock(), 3);
  EXPECT_EQ(stats.workers(2).worker_id(), 3);
  EXPECT_EQ(stats.workers(2).clock(), 0);
  // How long since each worker's last call here: workers 0 and 1 were just served (a
  // bound, not a time: the test may be slow), worker 3 never was.
  for (int i : {0, 1}) {
    EXPECT_GE(stats.workers(i).idle_ms(), 0) << i;
    EXPECT_LT(stats.workers(i).idle_ms(), 60'000) << i;
  }
  EXPECT_EQ(stats.workers(2).idle_ms(), -1);
}

// A handler's Visit: the workers whose tables it got count as in a call of its client until
// it ends; Stats can leave a client's calls out. The pairs kept stay bounded.
TEST(ShardTest, VisitsTellWhoseCallsAreInProgress) {
  Shard shard(ShardOptions{});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 10)).ok());
  auto worker = [](const StatsResponse& s, int32_t id) {
    for (const WorkerClock& w : s.workers()) {
      if (w.worker_id() == id) return w;
    }
    return WorkerClock();
  };
  {
    Shard::Visit visit(&shard, "a");
    ASSERT_TRUE(shard.GetDense(1, 0).ok());
    ASSERT_TRUE(shard.GetDense(1, 0).ok());  // the same call: counted once
    {
      Shard::Visit nested(&shard, "b");
      ASSERT_TRUE(shard.GetDense(1, 0).ok());
      EXPECT_EQ(worker(shard.Stats(), 0).calls(), 2);
    }
    const StatsResponse all = shard.Stats();
    EXPECT_EQ(worker(all, 0).calls(), 1);
    EXPECT_EQ(worker(all, 0).idle_ms(), 0);
    EXPECT_EQ(worker(all, 1).idle_ms(), -1);
    const StatsResponse others = shard.Stats({"a"});
    EXPECT_EQ(worker(others, 0).calls(), 0) << "b's call ended";
    EXPECT_GE(worker(others, 0).idle_ms(), 0);
    EXPECT_EQ(worker(shard.Stats({"a", "b"}), 0).idle_ms(), -1) << "no other client's calls";
  }
  EXPECT_EQ(worker(shard.Stats(), 0).calls(), 0);
  // A client naming a new id on every call: the pairs stay bounded, and no recent one is
  // forgotten for it (a flood of ids hid other clients' calls from a restore); past the
  // bound its calls count where no client can leave them out.
  shard.RegisterWorker(2);
  {
    Shard::Visit visit(&shard, "real");
    ASSERT_TRUE(shard.GetDense(1, 2).ok());
  }
  Shard::Visit kept(&shard, "in progress");
  ASSERT_TRUE(shard.GetDense(1, 1).ok());
  for (int i = 0; i < 5000; ++i) {
    Shard::Visit visit(&shard, absl::StrCat("hostile ", i));
    ASSERT_TRUE(shard.GetDense(1, 0).ok());
  }
  EXPECT_GE(worker(shard.Stats(), 2).idle_ms(), 0) << "the real client's call was forgotten";
  EXPECT_EQ(worker(shard.Stats({"real"}), 2).idle_ms(), -1);
  EXPECT_EQ(worker(shard.Stats(), 1).calls(), 1);
  EXPECT_EQ(worker(shard.Stats({"in progress"}), 1).idle_ms(), -1);
  EXPECT_EQ(worker(shard.Stats(), 0).calls(), 0) << "every call counted ended";
  {
    Shard::Visit visit(&shard, "hostile 4999");  // past the bound: counted for all to see
    ASSERT_TRUE(shard.GetDense(1, 0).ok());
    EXPECT_EQ(worker(shard.Stats({"hostile 4999"}), 0).calls(), 1);
  }
}

TEST(ShardTest, TableCreatedAfterWorkersRegisteredWaitsForThemUnderBsp) {
  Shard shard(ShardOptions{});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  shard.RegisterWorker(2);
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 2, ConsistencyConfig::BSP)).ok());
  DenseTable* table = shard.GetDense(1, 0).value();
  EXPECT_EQ(table->Clocks().size(), 3u);

  bool skipped = false;
  const std::vector<float> g = {1, 1};
  ASSERT_TRUE(table->Push(0, 0, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
  EXPECT_EQ(table->Info().applied_steps(), 0);
  absl::Status wait = table->AwaitPullable(1, absl::InfinitePast());
  EXPECT_EQ(wait.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Message(wait), HasSubstr("worker 1 (clock 0)"));
  EXPECT_THAT(Message(wait), HasSubstr("worker 2 (clock 0)"));

  ASSERT_TRUE(table->Push(1, 0, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
  ASSERT_TRUE(table->Push(2, 0, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  EXPECT_TRUE(table->AwaitPullable(1, absl::InfinitePast()).ok());

  // A worker registered after creation joins the existing table too.
  shard.RegisterWorker(3);
  EXPECT_EQ(table->Clocks().size(), 4u);
  for (int32_t w : {0, 1, 2})
    ASSERT_TRUE(table->Push(w, 1, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
  EXPECT_EQ(table->Info().applied_steps(), 1);
  ASSERT_TRUE(table->Push(3, 1, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
  EXPECT_EQ(table->Info().applied_steps(), 2);
}

TEST(ShardTest, LateWorkerJoiningAnSspTableDoesNotHoldOthersBack) {
  Shard shard(ShardOptions{});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 1, ConsistencyConfig::SSP)).ok());
  DenseTable* table = shard.GetDense(1, 0).value();
  bool skipped = false;
  const std::vector<float> g = {1};
  for (int64_t step = 0; step < 3; ++step) {
    for (int32_t w : {0, 1}) {
      ASSERT_TRUE(table->Push(w, step, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
    }
  }
  shard.RegisterWorker(2);
  EXPECT_EQ(table->Clocks().at(2), 3);
  EXPECT_TRUE(table->AwaitPullable(3, absl::InfinitePast()).ok());
  // From now on it counts like the others (staleness 0).
  ASSERT_TRUE(table->Push(0, 3, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
  ASSERT_TRUE(table->Push(1, 3, 0, {absl::MakeConstSpan(g)}, &skipped).ok());
  absl::Status s = table->AwaitPullable(4, absl::InfinitePast());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Message(s), HasSubstr("worker 2 (clock 3)"));
}

TEST(ShardTest, ShutdownFailsWaitingAndLaterPullsWithUnavailable) {
  Shard shard(ShardOptions{});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(DenseSpec(1, 2, ConsistencyConfig::BSP)).ok());
  DenseTable* table = shard.GetDense(1, 0).value();
  absl::Status waited = absl::UnknownError("not run");
  std::thread reader([&] { waited = table->AwaitPullable(1, absl::Now() + absl::Seconds(30)); });
  shard.Shutdown();
  reader.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(table->AwaitPullable(1, absl::InfinitePast()).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pscluster::ps
