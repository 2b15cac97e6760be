// Moving a dense table's full state (values, optimizer slots, update count) out of and into
// two real ps_server processes, as workers switching training modes do: an export equals a
// reference trained in this process; an import followed by more BSP steps is bitwise the
// table trained there all along; every malformed import is rejected with a message naming
// the problem and leaves the table as it was.
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps/ps_client.h"
#include "core/init/initializer.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/ps/table/dense_table.h"
#include "server/ps/table/table.h"
#include "tests/ps_cluster_fixture.h"
#include "tests/test_tables.h"

namespace pscluster {
namespace {

using ps::OptimizerConfig;
using ps::TableSpec;
using ps::TableStateChunk;
using ::testing::HasSubstr;

constexpr uint64_t kSize = 40001;  // odd: the shards hold 20001 and 20000 values
constexpr int kBefore = 3;         // BSP steps trained before the export
constexpr int kAfter = 3;          // BSP steps trained after the import

OptimizerConfig Adam() {
  OptimizerConfig c;
  c.set_kind(OptimizerConfig::ADAM);
  c.set_learning_rate(0.01f);
  return c;
}

OptimizerConfig Momentum() {
  OptimizerConfig c;
  c.set_kind(OptimizerConfig::MOMENTUM);
  c.set_learning_rate(0.1f);
  c.set_momentum(0.9f);
  return c;
}

int NumSlots(const OptimizerConfig& c) { return (*core::MakeOptimizer(c))->num_slots(); }

// A table's full state as the client sees it.
struct State {
  State(size_t n, int num_slots) : values(n), slots(num_slots, std::vector<float>(n)) {}
  std::vector<absl::Span<float>> SlotSpans() {
    std::vector<absl::Span<float>> out;
    for (auto& s : slots) out.push_back(absl::MakeSpan(s));
    return out;
  }
  std::vector<absl::Span<const float>> ConstSlotSpans() const {
    std::vector<absl::Span<const float>> out;
    for (const auto& s : slots) out.push_back(absl::MakeConstSpan(s));
    return out;
  }
  bool operator==(const State& o) const {  // bitwise for finite floats
    return values == o.values && slots == o.slots && updates == o.updates;
  }

  std::vector<float> values;
  std::vector<std::vector<float>> slots;
  int64_t updates = -1;
};

// The reference: one core::Optimizer over plain vectors, fed the BSP sum (worker-id order).
struct Reference {
  explicit Reference(const TableSpec& spec) : state(spec.size(), NumSlots(spec.optimizer())) {
    opt = *core::MakeOptimizer(spec.optimizer());
    core::InitDense(spec.initializer(), 0, absl::MakeSpan(state.values));
    for (int k = 0; k < opt->num_slots(); ++k) {
      state.slots[k].assign(spec.size(), opt->slot_initial_value(k));
    }
    state.updates = 0;
  }
  // One BSP step t: both workers' gradients summed, then one optimizer update.
  void Step(int t) {
    const size_t n = state.values.size();
    std::vector<float> sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = Grad(0, t, i) + Grad(1, t, i);
    float* s[8];
    for (size_t k = 0; k < state.slots.size(); ++k) s[k] = state.slots[k].data();
    opt->Apply(state.values.data(), sum.data(), s, n, ++state.updates);
  }

  std::unique_ptr<core::Optimizer> opt;
  State state;
};

class TableStateTest : public PsClusterTest {
 protected:
  // Small chunks, so exports (5461 values per chunk for Adam) stream several per shard too.
  std::vector<std::string> ServerArgs() override { return {"--max_chunk_bytes=65536"}; }

  TableSpec Create(uint32_t id, const OptimizerConfig& opt, uint64_t size = kSize) {
    TableSpec spec = Spec(id, TableSpec::DENSE, opt);
    spec.set_size(size);
    absl::Status s = clients_[0]->CreateTable(spec);
    EXPECT_TRUE(s.ok()) << s;
    return spec;
  }

  // BSP steps [from, to) by both workers: pull at t, push Grad(w, t, .).
  void Train(const TableSpec& spec, int from, int to) {
    for (int t = from; t < to; ++t) {
      OnAllWorkers([&](int w) {
        std::vector<float> values(spec.size()), grad(spec.size());
        absl::Status s = clients_[w]->PullDense(spec.table_id(), t, absl::MakeSpan(values));
        ASSERT_TRUE(s.ok()) << "step " << t << ": " << s;
        for (uint64_t i = 0; i < spec.size(); ++i) grad[i] = Grad(w, t, i);
        s = clients_[w]->PushDense(spec.table_id(), t, grad);
        ASSERT_TRUE(s.ok()) << "step " << t << ": " << s;
      });
    }
  }

  State Export(const TableSpec& spec, int64_t step, PsClient* client = nullptr) {
    State state(spec.size(), NumSlots(spec.optimizer()));
    absl::Status s = (client ? client : clients_[0].get())
                         ->ExportDense(spec.table_id(), step, absl::MakeSpan(state.values),
                                       state.SlotSpans(), &state.updates);
    EXPECT_TRUE(s.ok()) << s;
    return state;
  }

  absl::Status Import(const TableSpec& spec, int64_t step, const State& state) {
    return clients_[0]->ImportDense(spec.table_id(), step, state.updates, state.values,
                                    state.ConstSlotSpans());
  }

  std::vector<float> Pull(const TableSpec& spec, int64_t step) {
    std::vector<float> out(spec.size());
    absl::Status s = clients_[0]->PullDense(spec.table_id(), step, absl::MakeSpan(out));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // A client of both shards with a short deadline: a wait that would never end fails fast.
  std::unique_ptr<PsClient> ShortDeadlineClient(absl::Duration timeout) {
    PsClientOptions o;
    o.shard_addresses = addresses_;
    o.worker_id = 0;
    o.rpc_timeout = timeout;
    o.chunk_bytes = 64 << 10;  // within the servers' --max_chunk_bytes
    return *PsClient::Create(o);
  }
};

TEST_F(TableStateTest, ExportAtStepMatchesReference) {
  uint32_t id = 1;
  for (const OptimizerConfig& opt : {Adam(), Momentum()}) {
    SCOPED_TRACE(OptimizerConfig::Kind_Name(opt.kind()));
    TableSpec spec = Create(id++, opt);
    Reference ref(spec);
    EXPECT_TRUE(Export(spec, 0) == ref.state) << "before training";
    Train(spec, 0, kBefore);
    for (int t = 0; t < kBefore; ++t) ref.Step(t);
    State exported = Export(spec, kBefore);
    EXPECT_EQ(exported.updates, kBefore);
    EXPECT_EQ(exported.values, ref.state.values);  // bitwise
    ASSERT_EQ(exported.slots.size(), ref.state.slots.size());
    for (size_t k = 0; k < exported.slots.size(); ++k) {
      EXPECT_EQ(exported.slots[k], ref.state.slots[k]) << "slot " << k;
    }
  }
}

TEST_F(TableStateTest, ImportThenContinueMatchesContinuousTraining) {
  uint32_t id = 1;
  for (const OptimizerConfig& opt : {Adam(), Momentum()}) {
    SCOPED_TRACE(OptimizerConfig::Kind_Name(opt.kind()));
    TableSpec continuous = Create(id++, opt);
    TableSpec moved = Create(id++, opt);  // another seed: other initial values
    ASSERT_NE(Pull(continuous, 0), Pull(moved, 0));
    Train(continuous, 0, kBefore);
    State at_switch = Export(continuous, kBefore);
    ASSERT_TRUE(Import(moved, kBefore, at_switch).ok());
    EXPECT_TRUE(Export(moved, kBefore) == at_switch);

    Train(continuous, kBefore, kBefore + kAfter);
    Train(moved, kBefore, kBefore + kAfter);
    EXPECT_EQ(Pull(moved, kBefore + kAfter), Pull(continuous, kBefore + kAfter));  // bitwise
    State a = Export(continuous, kBefore + kAfter), b = Export(moved, kBefore + kAfter);
    EXPECT_TRUE(a == b);
    EXPECT_EQ(b.updates, kBefore + kAfter);
    Reference ref(continuous);
    for (int t = 0; t < kBefore + kAfter; ++t) ref.Step(t);
    EXPECT_TRUE(b == ref.state);
  }
}

TEST_F(TableStateTest, ImportWithoutUpdateCountDiverges) {
  // The control for the test above: Adam's bias correction needs the update count.
  TableSpec continuous = Create(1, Adam()), moved = Create(2, Adam());
  Train(continuous, 0, kBefore);
  State at_switch = Export(continuous, kBefore);
  at_switch.updates = 0;
  ASSERT_TRUE(Import(moved, kBefore, at_switch).ok());
  Train(continuous, kBefore, kBefore + 1);
  Train(moved, kBefore, kBefore + 1);
  EXPECT_NE(Pull(moved, kBefore + 1), Pull(continuous, kBefore + 1));
}

TEST_F(TableStateTest, PullAtImportedStepReturnsAtOnce) {
  constexpr int64_t kStep = 7;
  TableSpec spec = Create(1, Adam());
  State state(spec.size(), 2);
  for (uint64_t i = 0; i < spec.size(); ++i) {
    state.values[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
    state.slots[0][i] = 0.01f * std::sin(0.1f * i);
    state.slots[1][i] = 0.02f + 0.001f * (i % 13);
  }
  state.updates = 42;
  ASSERT_TRUE(Import(spec, kStep, state).ok());

  auto infos = clients_[0]->DescribeTable(spec.table_id());
  ASSERT_TRUE(infos.ok()) << infos.status();
  for (const auto& info : *infos) EXPECT_EQ(info.applied_steps(), kStep);
  // Without the import this pull would wait for steps 0..6 and fail at the deadline.
  auto fast = ShortDeadlineClient(absl::Seconds(20));
  std::vector<float> pulled(spec.size());
  absl::Status s = fast->PullDense(spec.table_id(), kStep, absl::MakeSpan(pulled));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(pulled, state.values);
  EXPECT_TRUE(Export(spec, kStep, fast.get()) == state);

  // Step 6 counts as pushed; step 7 is the next one and applies with update count 43.
  s = clients_[0]->PushDense(spec.table_id(), kStep - 1, std::vector<float>(spec.size(), 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("already applied"));
  Train(spec, kStep, kStep + 1);
  State after = Export(spec, kStep + 1);
  EXPECT_EQ(after.updates, 43);

  Reference ref(spec);
  ref.state = state;
  ref.Step(kStep);
  EXPECT_TRUE(after == ref.state);
}

TEST_F(TableStateTest, ImportDropsGradientsPushedButNotApplied) {
  TableSpec spec = Create(1, Momentum());
  Train(spec, 0, 1);
  State at_one = Export(spec, 1);
  // Worker 0 pushes steps 1 and 2 alone: staged, never applied.
  for (int t = 1; t <= 2; ++t) {
    ASSERT_TRUE(clients_[0]->PushDense(spec.table_id(), t, std::vector<float>(kSize, 5.0f)).ok());
  }
  ASSERT_TRUE(Import(spec, 1, at_one).ok());
  // Both push steps 1 and 2 again: were worker 0's earlier pushes kept, its new ones would
  // be refused as duplicates, or its 5.0 gradients would be summed in.
  Train(spec, 1, 3);

  Reference ref(spec);
  for (int t = 0; t < 3; ++t) ref.Step(t);
  EXPECT_TRUE(Export(spec, 3) == ref.state);
}

TEST_F(TableStateTest, EmptyShardRangeRoundTrips) {
  // One value over two shards: shard 1 holds nothing but still reports the update count.
  TableSpec spec = Create(1, Adam(), /*size=*/1);
  Train(spec, 0, 2);
  State state = Export(spec, 2);
  EXPECT_EQ(state.updates, 2);
  TableSpec other = Create(2, Adam(), /*size=*/1);
  ASSERT_TRUE(Import(other, 2, state).ok());
  EXPECT_TRUE(Export(other, 2) == state);
}

TEST_F(TableStateTest, ExportOfAnAppliedStepFailsAndOfAFutureStepTimesOut) {
  TableSpec spec = Create(1, Adam());
  Train(spec, 0, 2);
  State state(spec.size(), 2);
  absl::Status s = clients_[0]->ExportDense(spec.table_id(), 1, absl::MakeSpan(state.values),
                                            state.SlotSpans(), &state.updates);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("already applied"));

  auto fast = ShortDeadlineClient(absl::Seconds(1));
  s = fast->ExportDense(spec.table_id(), 3, absl::MakeSpan(state.values), state.SlotSpans(),
                        &state.updates);
  // The client's deadline may fire first, so only the code is certain here (the server's
  // own message is checked in DenseTableStateTest below).
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

// The same methods on one in-process DenseTable, for what the cluster cannot show exactly.
class DenseTableStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TableSpec spec = Spec(1, TableSpec::DENSE, Adam());
    spec.set_size(kValues);
    table_ = *ps::DenseTable::Create(spec, Range{0, kValues});
    table_->AddWorker(0);
    table_->AddWorker(1);
  }

  ps::DenseState State(float fill) {
    ps::DenseState state;
    state.range = Range{0, kValues};
    state.updates = 9;
    state.values.assign(kValues, fill);
    state.slots.assign(2, std::vector<float>(kValues, fill / 2));
    return state;
  }

  static constexpr uint64_t kValues = 10;
  std::unique_ptr<ps::DenseTable> table_;
};

TEST_F(DenseTableStateTest, ExportWaitNamesTheWorkersWaitedFor) {
  bool skipped = false;
  ASSERT_TRUE(table_->Push(0, 0, 0, {std::vector<float>(kValues, 1.0f)}, &skipped).ok());
  auto state = table_->ExportState(1, absl::Now());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(state.status().message(),
              HasSubstr("table 1: export at step 1 waited for BSP on: worker 1 (clock 0)"));
}

TEST_F(DenseTableStateTest, ImportWakesAWaitingPullAndResetsEveryClock) {
  // Whether the pull is already waiting when the import lands or starts after it, it must
  // succeed: the import makes step 5 readable.
  absl::Status pulled;
  std::thread pull([&] { pulled = table_->AwaitPullable(5, absl::Now() + absl::Minutes(5)); });
  ASSERT_TRUE(table_->ImportState(5, State(0.5f)).ok());
  pull.join();
  EXPECT_TRUE(pulled.ok()) << pulled;
  EXPECT_EQ(table_->Info().applied_steps(), 5);
  EXPECT_EQ(table_->Clocks(), (std::map<int32_t, int64_t>{{0, 5}, {1, 5}}));
  auto state = table_->ExportState(5, absl::Now());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->values, std::vector<float>(kValues, 0.5f));
  EXPECT_EQ(state->slots[1], std::vector<float>(kValues, 0.25f));
  EXPECT_EQ(state->updates, 9);
}

TEST_F(DenseTableStateTest, ImportOfAStateShapedForAnotherTableChangesNothing) {
  ps::DenseState other = State(0.5f);
  other.range = Range{0, kValues - 1};
  other.values.pop_back();
  absl::Status s = table_->ImportState(3, std::move(other));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("this shard holds [0, 10)"));
  other = State(0.5f);
  other.slots.pop_back();
  s = table_->ImportState(3, std::move(other));
  EXPECT_THAT(s.message(), HasSubstr("has 1 optimizer slots; the table's optimizer keeps 2"));
  EXPECT_EQ(table_->Info().applied_steps(), 0);
  auto state = table_->ExportState(0, absl::Now());
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->updates, 0);
  EXPECT_NE(state->values, std::vector<float>(kValues, 0.5f));
}

// Malformed imports straight to shard 0 (holding [0, 500) of the table); each must leave the
// table exactly as it was.
class TableStateBadInputTest : public TableStateTest {
 protected:
  static constexpr uint32_t kDense = 1, kSparse = 2, kUnknown = 99;
  static constexpr uint64_t kDenseSize = 1000;
  static constexpr uint64_t kShard0End = 500;

  void SetUp() override {
    TableStateTest::SetUp();
    if (HasFatalFailure()) return;
    spec_ = Create(kDense, Adam(), kDenseSize);
    TableSpec sparse = Spec(kSparse, TableSpec::SPARSE, Adam());
    sparse.set_dim(4);
    ASSERT_TRUE(clients_[0]->CreateTable(sparse).ok());
    Train(spec_, 0, 1);
    before_ = Export(spec_, 1);
    before_pull_ = Pull(spec_, 1);
  }

  void TearDown() override {
    if (!HasFatalFailure()) {
      EXPECT_TRUE(Export(spec_, 1) == before_) << "a rejected import changed the table";
      EXPECT_EQ(Pull(spec_, 1), before_pull_);
    }
    TableStateTest::TearDown();
  }

  // A well-formed chunk of the Adam table for [begin, begin + n), at step 1.
  static TableStateChunk Chunk(uint64_t begin, uint64_t n, uint32_t table = kDense) {
    TableStateChunk c;
    c.set_table_id(table);
    c.set_step(1);
    c.set_updates(1);
    c.set_begin(begin);
    c.set_num_slots(2);
    for (uint64_t i = 0; i < n; ++i) c.add_values(0.25f);
    for (uint64_t i = 0; i < 2 * n; ++i) c.add_slots(0.5f);
    return c;
  }

  grpc::Status ImportRaw(const std::vector<TableStateChunk>& chunks, int shard = 0) {
    grpc::ClientContext ctx;
    ps::ImportDenseResponse resp;
    auto writer = clients_[0]->stub(shard)->ImportDense(&ctx, &resp);
    for (const auto& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status ExportRaw(uint32_t table, int64_t step) {
    grpc::ClientContext ctx;
    ps::ExportDenseRequest req;
    req.set_table_id(table);
    req.set_step(step);
    auto reader = clients_[0]->stub(0)->ExportDense(&ctx, req);
    TableStateChunk c;
    while (reader->Read(&c)) {
    }
    return reader->Finish();
  }

  void ExpectError(const grpc::Status& s, grpc::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(text));
  }

  TableSpec spec_;
  State before_{0, 0};
  std::vector<float> before_pull_;
};

TEST_F(TableStateBadInputTest, WellFormedImportIsAccepted) {
  // The control: the same helpers with nothing wrong succeed (then the state is put back).
  ASSERT_TRUE(ImportRaw({Chunk(0, 200), Chunk(200, 300)}).ok());
  ASSERT_TRUE(Import(spec_, 1, before_).ok());
}

TEST_F(TableStateBadInputTest, UnknownTableIsNotFound) {
  ExpectError(ImportRaw({Chunk(0, kShard0End, kUnknown)}), grpc::StatusCode::NOT_FOUND,
              "table_id 99 does not exist");
  ExpectError(ExportRaw(kUnknown, 1), grpc::StatusCode::NOT_FOUND, "table_id 99 does not exist");
}

TEST_F(TableStateBadInputTest, SparseTableIsFailedPrecondition) {
  ExpectError(ImportRaw({Chunk(0, kShard0End, kSparse)}), grpc::StatusCode::FAILED_PRECONDITION,
              "is a SPARSE table");
  ExpectError(ExportRaw(kSparse, 0), grpc::StatusCode::FAILED_PRECONDITION, "is a SPARSE table");
}

TEST_F(TableStateBadInputTest, WrongSlotCountIsRejected) {
  TableStateChunk c = Chunk(0, kShard0End);
  c.set_num_slots(1);
  c.mutable_slots()->Truncate(kShard0End);
  ExpectError(ImportRaw({c}), grpc::StatusCode::INVALID_ARGUMENT,
              "carries 1 optimizer slots; the table's optimizer keeps 2");
  c = Chunk(0, kShard0End);
  c.mutable_slots()->Truncate(kShard0End + 3);
  ExpectError(ImportRaw({c}), grpc::StatusCode::INVALID_ARGUMENT, "503 slot values");
  // Through the client: one slot buffer for an Adam table.
  std::vector<float> values(kDenseSize), slot(kDenseSize);
  absl::Status s = clients_[0]->ImportDense(kDense, 1, 1, values, {absl::MakeConstSpan(slot)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("optimizer keeps 2"));
  int64_t updates = 0;
  s = clients_[0]->ExportDense(kDense, 1, absl::MakeSpan(values), {absl::MakeSpan(slot)}, &updates);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("keeps 2 slots"));
}

TEST_F(TableStateBadInputTest, GapIsRejected) {
  ExpectError(ImportRaw({Chunk(0, 200), Chunk(300, 200)}), grpc::StatusCode::INVALID_ARGUMENT,
              "leave values [200, 300) of this shard's range [0, 500) missing");
  ExpectError(ImportRaw({Chunk(0, 499)}), grpc::StatusCode::INVALID_ARGUMENT,
              "leave values [499, 500)");
}

TEST_F(TableStateBadInputTest, OverlapIsRejected) {
  ExpectError(ImportRaw({Chunk(0, 300), Chunk(200, 300)}), grpc::StatusCode::INVALID_ARGUMENT,
              "chunk [200, 500) overlaps the earlier chunk [0, 300)");
  ExpectError(ImportRaw({Chunk(0, kShard0End), Chunk(100, 1)}), grpc::StatusCode::INVALID_ARGUMENT,
              "overlaps");
}

TEST_F(TableStateBadInputTest, NonFiniteValueIsRejected) {
  TableStateChunk c = Chunk(0, kShard0End);
  c.set_values(17, std::numeric_limits<float>::quiet_NaN());
  ExpectError(ImportRaw({c}), grpc::StatusCode::INVALID_ARGUMENT,
              "imported values holds a non-finite value (nan) at index 17");
  c = Chunk(0, kShard0End);
  c.set_slots(kShard0End + 3, std::numeric_limits<float>::infinity());
  ExpectError(ImportRaw({c}), grpc::StatusCode::INVALID_ARGUMENT,
              "optimizer slot 1 holds a non-finite value (inf) at index 3");
}

TEST_F(TableStateBadInputTest, NegativeStepOrUpdatesIsRejected) {
  TableStateChunk c = Chunk(0, kShard0End);
  c.set_step(-1);
  ExpectError(ImportRaw({c}), grpc::StatusCode::INVALID_ARGUMENT, "step must be >= 0, got -1");
  c = Chunk(0, kShard0End);
  c.set_updates(-5);
  ExpectError(ImportRaw({c}), grpc::StatusCode::INVALID_ARGUMENT, "updates must be >= 0, got -5");
  ExpectError(ExportRaw(kDense, -1), grpc::StatusCode::INVALID_ARGUMENT,
              "step must be >= 0, got -1");
}

TEST_F(TableStateBadInputTest, RangeNotMatchingTheShardIsRejected) {
  ExpectError(ImportRaw({Chunk(0, 600)}), grpc::StatusCode::INVALID_ARGUMENT,
              "chunk [0, 600) lies outside this shard's range [0, 500)");
  // Shard 1 holds [500, 1000): shard 0's range (a client that assumed other shards).
  ExpectError(ImportRaw({Chunk(0, kShard0End)}, /*shard=*/1), grpc::StatusCode::INVALID_ARGUMENT,
              "outside this shard's range [500, 1000)");
}

TEST_F(TableStateBadInputTest, OversizedChunkIsResourceExhausted) {
  ExpectError(ImportRaw({Chunk(0, 6000)}), grpc::StatusCode::RESOURCE_EXHAUSTED,
              "import chunk 0 holds 72000 bytes of floats; the limit is 65536");
}

TEST_F(TableStateBadInputTest, ChunksDisagreeingOnTheirHeaderAreRejected) {
  TableStateChunk second = Chunk(200, 300);
  second.set_step(2);
  ExpectError(ImportRaw({Chunk(0, 200), second}), grpc::StatusCode::INVALID_ARGUMENT,
              "import chunk 1 changes step from 1 to 2");
  second = Chunk(200, 300);
  second.set_updates(7);
  ExpectError(ImportRaw({Chunk(0, 200), second}), grpc::StatusCode::INVALID_ARGUMENT,
              "changes updates from 1 to 7");
  ExpectError(ImportRaw({}), grpc::StatusCode::INVALID_ARGUMENT, "carried no chunks");
}

}  // namespace
}  // namespace pscluster
