// Hostile and malformed requests against real ps_server processes: each gets the right gRPC
// code and a message naming the problem, the server keeps serving, and nothing stored
// changes.
#include <cmath>
#include <limits>

#include "absl/synchronization/notification.h"
#include "client/ps/shard_stub.h"
#include "common/sharding.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tests/ps_cluster_fixture.h"

namespace pscluster {
namespace {

using ps::DenseChunk;
using ps::TableSpec;
using ::testing::HasSubstr;

constexpr uint32_t kDense = 1, kSparse = 2, kSkip = 3;
constexpr uint64_t kDenseSize = 1000;  // shard 0 holds [0, 500)
constexpr uint32_t kDim = 4;

class BadInputTest : public PsClusterTest {
 protected:
  void SetUp() override {
    PsClusterTest::SetUp();
    if (HasFatalFailure()) return;
    CreateTablesAndStepZero();
  }

  void CreateTablesAndStepZero() {
    ASSERT_TRUE(clients_[0]->CreateTable(DenseSpec()).ok());
    TableSpec sparse = DenseSpec();
    sparse.set_table_id(kSparse);
    sparse.set_kind(TableSpec::SPARSE);
    sparse.set_size(0);
    sparse.set_dim(kDim);
    sparse.set_key_space(1000);
    ASSERT_TRUE(clients_[0]->CreateTable(sparse).ok());
    TableSpec skip = DenseSpec();
    skip.set_table_id(kSkip);
    skip.set_skip_nonfinite(true);
    skip.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
    ASSERT_TRUE(clients_[0]->CreateTable(skip).ok());
    // One good BSP step from both workers, so step 0 is applied.
    OnAllWorkers([&](int w) {
      ASSERT_TRUE(clients_[w]->PushDense(kDense, 0, std::vector<float>(kDenseSize, 1.0f + w)).ok());
      std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6};
      ASSERT_TRUE(
          clients_[w]->PushSparse(kSparse, 0, keys, std::vector<float>(6 * kDim, 0.5f)).ok());
    });
    before_ = State();
  }

  static TableSpec DenseSpec() {
    TableSpec s;
    s.set_table_id(kDense);
    s.set_kind(TableSpec::DENSE);
    s.set_size(kDenseSize);
    s.mutable_optimizer()->set_kind(ps::OptimizerConfig::ADAM);
    s.mutable_optimizer()->set_learning_rate(0.01f);
    s.mutable_initializer()->set_kind(ps::InitializerConfig::UNIFORM);
    s.mutable_initializer()->set_scale(1.0f);
    return s;
  }

  // Everything a client can observe of the stored state.
  std::vector<float> State() {
    std::vector<float> out(kDenseSize * 2 + 6 * kDim);
    auto span = absl::MakeSpan(out);
    EXPECT_TRUE(clients_[0]->PullDense(kDense, 1, span.subspan(0, kDenseSize)).ok());
    EXPECT_TRUE(clients_[0]->PullDense(kSkip, 0, span.subspan(kDenseSize, kDenseSize)).ok());
    std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6};
    EXPECT_TRUE(clients_[0]->PullSparse(kSparse, 1, keys, span.subspan(2 * kDenseSize)).ok());
    return out;
  }

  pscluster::ShardStub* shard0() { return clients_[0]->stub(0); }

  static DenseChunk Chunk(uint32_t table, uint64_t offset, std::vector<float> values) {
    DenseChunk c;
    c.set_worker_id(0);
    c.set_step(1);
    c.set_table_id(table);
    c.set_offset(offset);
    c.set_begin(offset);
    c.set_total_length(values.size());
    c.set_data(values.data(), values.size() * sizeof(float));
    return c;
  }

  grpc::Status Push(const DenseChunk& c) {
    grpc::ClientContext ctx;
    ps::PushDenseResponse r;
    return shard0()->PushDense(&ctx, c, &r);
  }

  grpc::Status PushBatch(std::vector<DenseChunk> chunks) {
    ps::DenseBatch batch;
    for (auto& c : chunks) *batch.add_chunks() = std::move(c);
    grpc::ClientContext ctx;
    ps::PushDenseBatchResponse r;
    return shard0()->PushDenseBatch(&ctx, batch, &r);
  }

  grpc::Status PushStream(const std::vector<DenseChunk>& chunks,
                          pscluster::ShardStub* stub = nullptr) {
    grpc::ClientContext ctx;
    ps::PushDenseResponse r;
    auto writer = (stub ? stub : shard0())->PushDenseStream(&ctx, &r);
    for (const auto& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status Sparse(bool push, ps::SparseRequest req) {
    grpc::ClientContext ctx;
    req.set_step(1);
    if (push) {
      ps::PushSparseResponse r;
      return shard0()->PushSparse(&ctx, req, &r);
    }
    ps::PullSparseResponse r;
    return shard0()->PullSparse(&ctx, req, &r);
  }

  grpc::Status Create(const TableSpec& spec) {
    grpc::ClientContext ctx;
    ps::CreateTableRequest req;
    *req.mutable_spec() = spec;
    ps::CreateTableResponse r;
    return shard0()->CreateTable(&ctx, req, &r);
  }

  void ExpectError(const grpc::Status& s, grpc::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(text));
  }

  void TearDown() override {
    if (!HasFatalFailure()) {
      EXPECT_EQ(State(), before_) << "a rejected request changed stored state";
      auto stats = clients_[0]->Stats();
      EXPECT_TRUE(stats.ok()) << "a server stopped serving: " << stats.status();
    }
    PsClusterTest::TearDown();
  }

  std::vector<float> before_;
};

// A Stats request listing millions of tiny client ids (4 MB of them) would make a set of
// some 100 MB on the shard: refused past 64, naming the count.
TEST_F(BadInputTest, StatsListingTooManyClientsIsInvalidArgument) {
  grpc::ClientContext ctx;
  ps::StatsRequest req;
  for (int i = 0; i < 65; ++i) req.add_except_clients(absl::StrCat(i));
  ps::StatsResponse resp;
  grpc::Status s = shard0()->Stats(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("65 client ids; at most 64"));
  req.mutable_except_clients()->RemoveLast();
  grpc::ClientContext again;
  EXPECT_TRUE(shard0()->Stats(&again, req, &resp).ok());
}

TEST_F(BadInputTest, UnknownTableIsNotFound) {
  ExpectError(Push(Chunk(99, 0, {1.0f})), grpc::StatusCode::NOT_FOUND, "table_id 99");
}

TEST_F(BadInputTest, WrongKindIsFailedPrecondition) {
  ps::SparseRequest req;
  req.set_table_id(kDense);
  req.add_keys(1);
  ExpectError(Sparse(false, req), grpc::StatusCode::FAILED_PRECONDITION, "DENSE");
}

TEST_F(BadInputTest, PartialFloatIsInvalidArgument) {
  DenseChunk c = Chunk(kDense, 0, {});
  c.set_data("1234567");
  ExpectError(Push(c), grpc::StatusCode::INVALID_ARGUMENT, "7 bytes");
}

// A unary push (or a batch entry) is one whole transfer: a header that says otherwise is
// refused instead of applying the chunk as if it did not.
TEST_F(BadInputTest, SingleChunkPushWhoseHeaderDescribesAnotherTransferIsInvalidArgument) {
  DenseChunk longer = Chunk(kDense, 0, std::vector<float>(5, 1.0f));
  longer.set_total_length(10);
  ExpectError(Push(longer), grpc::StatusCode::INVALID_ARGUMENT,
              "total_length=10 but the chunk carries 5 values");
  DenseChunk elsewhere = Chunk(kDense, 0, std::vector<float>(5, 1.0f));
  elsewhere.set_begin(5);
  ExpectError(Push(elsewhere), grpc::StatusCode::INVALID_ARGUMENT, "begin=5 differs from offset=0");
  ExpectError(PushBatch({Chunk(kSkip, 0, std::vector<float>(500, 0.25f)), longer}),
              grpc::StatusCode::INVALID_ARGUMENT,
              "chunk 1 of the batch (table 1): total_length=10");
}

TEST_F(BadInputTest, DenseRangeOutsideShardIsOutOfRange) {
  ExpectError(Push(Chunk(kDense, 450, std::vector<float>(100, 1.0f))),
              grpc::StatusCode::OUT_OF_RANGE, "[450, 550)");
  grpc::ClientContext ctx;
  ps::PullDenseRequest pull;
  pull.set_table_id(kDense);
  pull.set_step(1);
  pull.set_offset(std::numeric_limits<uint64_t>::max() - 2);
  pull.set_length(10);  // offset + length overflows uint64
  DenseChunk out;
  ExpectError(shard0()->PullDense(&ctx, pull, &out), grpc::StatusCode::OUT_OF_RANGE,
              "outside this shard's range");
}

TEST_F(BadInputTest, SparseGradsOfWrongLengthAreInvalidArgument) {
  ps::SparseRequest req;
  req.set_worker_id(0);
  req.set_table_id(kSparse);
  req.add_keys(1);
  req.set_grads(std::string(3 * sizeof(float), '\0'));
  ExpectError(Sparse(true, req), grpc::StatusCode::INVALID_ARGUMENT, "grads holds 3 values");
}

TEST_F(BadInputTest, SparseKeyOfAnotherShardOrOutsideKeySpaceIsRejected) {
  uint64_t foreign = 0;
  while (SparseShardOf(foreign, kShards) != 1) ++foreign;
  ps::SparseRequest req;
  req.set_table_id(kSparse);
  req.add_keys(foreign);
  ExpectError(Sparse(false, req), grpc::StatusCode::INVALID_ARGUMENT, "belongs to shard 1");
  req.set_keys(0, 5000);
  ExpectError(Sparse(false, req), grpc::StatusCode::OUT_OF_RANGE, "key_space 1000");
}

TEST_F(BadInputTest, DuplicateTableWithAnotherSpecIsAlreadyExists) {
  TableSpec other = DenseSpec();
  other.set_size(2000);
  ExpectError(Create(other), grpc::StatusCode::ALREADY_EXISTS, "size");
}

TEST_F(BadInputTest, InvalidOrHugeSpecIsRejected) {
  TableSpec spec = DenseSpec();
  spec.set_table_id(50);
  spec.mutable_optimizer()->set_learning_rate(-1.0f);
  ExpectError(Create(spec), grpc::StatusCode::INVALID_ARGUMENT, "learning_rate");
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  // A NORMAL initializer whose draws would overflow to +-inf (scale 1e38 x 5.8 sigma).
  spec.mutable_initializer()->set_kind(ps::InitializerConfig::NORMAL);
  spec.mutable_initializer()->set_scale(1e38f);
  ExpectError(Create(spec), grpc::StatusCode::INVALID_ARGUMENT, "its values stay finite");
  spec.mutable_initializer()->set_scale(1.0f);
  spec.set_size(uint64_t{1} << 62);
  ExpectError(Create(spec), grpc::StatusCode::RESOURCE_EXHAUSTED, "max_table_bytes");
}

TEST_F(BadInputTest, NonFiniteGradientIsRejectedOrSkippedPerTable) {
  std::vector<float> g(500, 1.0f);
  g[17] = std::nanf("");
  ExpectError(Push(Chunk(kDense, 0, g)), grpc::StatusCode::INVALID_ARGUMENT, "index 17");
  g[17] = INFINITY;
  grpc::ClientContext ctx;
  ps::PushDenseResponse r;
  grpc::Status s = shard0()->PushDense(&ctx, Chunk(kSkip, 0, g), &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(r.skipped_nonfinite());
  auto stats = clients_[0]->Stats();
  ASSERT_TRUE(stats.ok());
  for (const auto& t : (*stats)[0].tables()) {
    if (t.info().spec().table_id() == kSkip) {
      EXPECT_EQ(t.nonfinite_pushes_skipped(), 1u);
    }
  }
}

// Each shard checks only its part of a push, so the client refuses what one shard would
// refuse before it sends anything: a NaN in shard 1's half of a dense gradient (PushDense
// and PushDenseMany), a sparse key outside the key space or a NaN row beside good keys of
// both shards. No shard counts a push (and TearDown: no state changed).
TEST_F(BadInputTest, ClientRefusesWhatOneShardWouldRefuseBeforeSendingAny) {
  auto pushes = [&] {
    std::vector<uint64_t> counts;
    auto stats = clients_[0]->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    for (const auto& shard : *stats) {
      for (const auto& t : shard.tables()) counts.push_back(t.pushes());
    }
    return counts;
  };
  const std::vector<uint64_t> before = pushes();
  std::vector<float> g(kDenseSize, 0.5f);
  g[kDenseSize - 3] = std::nanf("");  // in shard 1's range [500, 1000)
  absl::Status s = clients_[0]->PushDense(kDense, 1, g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("gradient index 997 is nan"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nothing was pushed to any shard"));
  const uint32_t tables[] = {kDense};
  const absl::Span<const float> grads[] = {g};
  s = clients_[0]->PushDenseMany(1, tables, grads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::vector<uint64_t> keys = {1, 2, 5000};  // 5000: outside key_space 1000
  s = clients_[0]->PushSparse(kSparse, 1, keys, std::vector<float>(3 * kDim, 0.5f));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("key 5000 is outside its key space"));
  std::vector<float> rows(3 * kDim, 0.5f);
  rows.back() = INFINITY;
  s = clients_[0]->PushSparse(kSparse, 1, {1, 2, 3}, rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(pushes(), before) << "a shard took part of a refused push";
}

TEST_F(BadInputTest, OversizedChunkIsResourceExhausted) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  auto stub = pscluster::ShardStub::New(
      grpc::CreateCustomChannel(addresses_[0], grpc::InsecureChannelCredentials(), args));
  ExpectError(PushStream({Chunk(kDense, 0, std::vector<float>(2 << 20, 1.0f))}, stub.get()),
              grpc::StatusCode::RESOURCE_EXHAUSTED, "");
}

TEST_F(BadInputTest, TruncatedStreamIsInvalidArgumentAndNotApplied) {
  DenseChunk first = Chunk(kDense, 0, std::vector<float>(100, 1.0f));
  first.set_total_length(500);
  ExpectError(PushStream({first}), grpc::StatusCode::INVALID_ARGUMENT, "truncated: got 100 of");
}

TEST_F(BadInputTest, MisorderedOrInconsistentChunksAreInvalidArgument) {
  DenseChunk a = Chunk(kDense, 0, std::vector<float>(100, 1.0f));
  a.set_total_length(200);
  DenseChunk b = a;
  b.set_offset(150);
  ExpectError(PushStream({a, b}), grpc::StatusCode::INVALID_ARGUMENT, "offset 150, expected 100");
  b.set_offset(100);
  b.set_table_id(kSkip);
  ExpectError(PushStream({a, b}), grpc::StatusCode::INVALID_ARGUMENT, "changes table_id");
  DenseChunk longer = a;
  longer.set_total_length(50);
  ExpectError(PushStream({longer}), grpc::StatusCode::INVALID_ARGUMENT,
              "more than total_length=50");
  ExpectError(PushStream({}), grpc::StatusCode::INVALID_ARGUMENT, "no chunks");
}

TEST_F(BadInputTest, UnregisteredWorkerIsFailedPrecondition) {
  DenseChunk c = Chunk(kDense, 0, {1.0f});
  c.set_worker_id(42);
  ExpectError(Push(c), grpc::StatusCode::FAILED_PRECONDITION, "worker_id 42 is not registered");
}

TEST_F(BadInputTest, StaleBspStepIsFailedPrecondition) {
  DenseChunk c = Chunk(kDense, 0, std::vector<float>(500, 1.0f));
  c.set_step(0);
  ExpectError(Push(c), grpc::StatusCode::FAILED_PRECONDITION, "step 0 is already applied");
}

TEST_F(BadInputTest, TooManySparseRowsInOnePullIsResourceExhausted) {
  ps::SparseRequest req;
  req.set_table_id(kSparse);
  for (uint64_t k = 0; k < 300000; ++k) req.add_keys(k);
  ExpectError(Sparse(false, req), grpc::StatusCode::RESOURCE_EXHAUSTED, "split the keys");
}

// A batch push is checked whole before any chunk is applied: one bad chunk (an unknown
// table, a NaN, a range off the shard, a table twice) and the good ones are not applied.
TEST_F(BadInputTest, BatchPushWithOneBadChunkAppliesNothing) {
  const DenseChunk good = Chunk(kSkip, 0, std::vector<float>(500, 0.25f));
  ExpectError(PushBatch({good, Chunk(99, 0, {1.0f})}), grpc::StatusCode::NOT_FOUND,
              "chunk 1 of the batch (table 99)");
  ExpectError(PushBatch({good, Chunk(kDense, 0, {NAN})}), grpc::StatusCode::INVALID_ARGUMENT,
              "nothing in the batch was applied");
  ExpectError(PushBatch({good, Chunk(kDense, 499, {1.0f, 2.0f})}), grpc::StatusCode::OUT_OF_RANGE,
              "chunk 1 of the batch");
  ExpectError(PushBatch({good, good}), grpc::StatusCode::INVALID_ARGUMENT, "appears twice");
}

TEST_F(BadInputTest, BatchPullOfAnUnknownTableOrTooMuchIsRejected) {
  auto pull = [&](std::vector<std::pair<uint32_t, uint64_t>> tables) {
    ps::PullDenseBatchRequest req;
    for (auto [table, length] : tables) {
      ps::PullDenseRequest* p = req.add_pulls();
      p->set_worker_id(0);
      p->set_step(1);
      p->set_table_id(table);
      p->set_length(length);
    }
    grpc::ClientContext ctx;
    ps::DenseBatch r;
    return shard0()->PullDenseBatch(&ctx, req, &r);
  };
  EXPECT_TRUE(pull({{kDense, 500}}).ok());
  ExpectError(pull({{kDense, 500}, {77, 1}}), grpc::StatusCode::NOT_FOUND,
              "pull 1 of the batch (table 77)");
  // --max_chunk_bytes is 4 MiB: 2100 pulls of 500 floats are over it.
  ExpectError(pull(std::vector<std::pair<uint32_t, uint64_t>>(2100, {kDense, 500})),
              grpc::StatusCode::RESOURCE_EXHAUSTED, "unary limit");
}

// Memory amplification (issue 49): a 4 MB batch of hundreds of thousands of tiny pulls
// (each a chunk header in the answer) made the shard build every header before refusing it,
// 44 times the request's size in memory. The answer's bytes count a header a pull, and the
// batch is refused at the limit, before the rest: here 300,000 pulls of one value (2.4 MB
// of request, 1.2 MB of values, 19 MB of headers).
TEST_F(BadInputTest, BatchOfManyTinyPullsIsRefusedByItsAnswersSize) {
  ps::PullDenseBatchRequest req;
  for (int i = 0; i < 300000; ++i) {
    ps::PullDenseRequest* p = req.add_pulls();
    p->set_step(1);
    p->set_table_id(kDense);
    p->set_length(1);
  }
  grpc::ClientContext ctx;
  ps::DenseBatch r;
  ExpectError(shard0()->PullDenseBatch(&ctx, req, &r), grpc::StatusCode::RESOURCE_EXHAUSTED,
              "64 bytes a pull");
}

// Regression: negative steps on pulls were accepted (a BSP pull at step -1 read at once).
TEST_F(BadInputTest, NegativeStepsAreInvalidArgument) {
  grpc::ClientContext ctx;
  ps::PullDenseRequest pull;
  pull.set_worker_id(0);
  pull.set_table_id(kDense);
  pull.set_step(-1);
  pull.set_length(10);
  DenseChunk out;
  ExpectError(shard0()->PullDense(&ctx, pull, &out), grpc::StatusCode::INVALID_ARGUMENT,
              "step must be >= 0, got -1");
  ps::SparseRequest sparse;
  sparse.set_table_id(kSparse);
  sparse.add_keys(0);
  grpc::ClientContext ctx2;
  sparse.set_step(-3);
  ps::PullSparseResponse rows;
  ExpectError(shard0()->PullSparse(&ctx2, sparse, &rows), grpc::StatusCode::INVALID_ARGUMENT,
              "step must be >= 0, got -3");
  DenseChunk push = Chunk(kDense, 0, std::vector<float>(500, 1.0f));
  push.set_step(-2);
  ExpectError(Push(push), grpc::StatusCode::INVALID_ARGUMENT, "step must be >= 0");
  grpc::ClientContext ctx3;
  ps::RestoreRequest restore;
  restore.set_step(-1);
  ps::RestoreResponse restored;
  EXPECT_FALSE(shard0()->Restore(&ctx3, restore, &restored).ok());
}

// Regression: a negative worker id could register, and BSP then waited for it forever;
// there was no way to unregister a worker.
TEST_F(BadInputTest, NegativeWorkerIdIsRefusedAndAWorkerCanLeaveForGood) {
  grpc::ClientContext ctx;
  ps::RegisterWorkerRequest req;
  req.set_worker_id(-1);
  ps::RegisterWorkerResponse resp;
  ExpectError(shard0()->RegisterWorker(&ctx, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
              "worker_id must be >= 0, got -1");
  // ... and so is a call naming one (it was "not registered": FAILED_PRECONDITION).
  ps::SparseRequest sparse;
  sparse.set_worker_id(-1);
  sparse.set_table_id(kSparse);
  sparse.add_keys(0);
  grpc::ClientContext sparse_ctx;
  ps::PullSparseResponse rows;
  ExpectError(shard0()->PullSparse(&sparse_ctx, sparse, &rows), grpc::StatusCode::INVALID_ARGUMENT,
              "worker_id must be >= 0, got -1");
  DenseChunk push = Chunk(kDense, 0, std::vector<float>(500, 1.0f));
  push.set_worker_id(-2);
  ExpectError(Push(push), grpc::StatusCode::INVALID_ARGUMENT, "worker_id must be >= 0, got -2");

  // A third worker joins, then leaves for good: the next BSP step waits only for 0 and 1.
  PsClientOptions o;
  o.shard_addresses = addresses_;
  o.worker_id = 5;
  o.rpc_timeout = absl::Seconds(60);
  auto third = PsClient::Create(o);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE((*third)->RegisterWorker().ok());
  ASSERT_TRUE((*third)->UnregisterWorker().ok());
  const std::vector<float> g(kDenseSize, 0.0f);
  OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->PushDense(kDense, 1, g).ok()); });
  std::vector<float> after(kDenseSize);
  ASSERT_TRUE(clients_[0]->PullDense(kDense, 2, absl::MakeSpan(after)).ok())
      << "step 1 waited for the worker that left";
  // Gone means gone: its pushes are refused until it registers again.
  EXPECT_EQ((*third)->PushDense(kDense, 2, g).code(), absl::StatusCode::kFailedPrecondition);
  // (TearDown compares state at step 1; step 1's zero gradient with Adam keeps values
  // moving, so take the new state as the reference.)
  before_ = State();
}

// Regression: unary pushes over --max_chunk_bytes were accepted.
TEST_F(BadInputTest, UnaryPushesOverTheChunkLimitAreResourceExhausted) {
  // A server with a small limit; gRPC's own message limit sits 64 KiB above it.
  StopServers(SIGTERM);
  StartServers(kShards, {"--max_chunk_bytes=65536"});
  ASSERT_FALSE(HasFatalFailure());
  ConnectClients();
  CreateTablesAndStepZero();
  ASSERT_FALSE(HasFatalFailure());
  TableSpec big = DenseSpec();
  big.set_table_id(9);
  big.set_size(200000);  // 100000 values (400 KB) per shard
  big.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  ASSERT_TRUE(clients_[0]->CreateTable(big).ok());
  std::vector<float> initial(200000), w(200000);
  ASSERT_TRUE(clients_[0]->PullDense(9, 0, absl::MakeSpan(initial)).ok());
  DenseChunk c = Chunk(9, 0, std::vector<float>(20000, 1.0f));  // 80000 bytes > 65536
  ExpectError(Push(c), grpc::StatusCode::RESOURCE_EXHAUSTED, "max_chunk_bytes");
  ExpectError(PushBatch({Chunk(9, 0, std::vector<float>(16000, 1.0f)),  // 64000 + 2000
                         Chunk(kDense, 0, std::vector<float>(500, 1.0f))}),
              grpc::StatusCode::RESOURCE_EXHAUSTED, "nothing in the batch was applied");
  ASSERT_TRUE(clients_[0]->PullDense(9, 0, absl::MakeSpan(w)).ok());
  EXPECT_EQ(w, initial) << "a refused push was applied";
  before_ = State();
}

// Regression: a body that did not parse as the request got INTERNAL with an empty message.
TEST_F(BadInputTest, UnparsableRequestIsInvalidArgumentNamingTheMethod) {
  auto channel = grpc::CreateChannel(addresses_[0], grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  const std::string garbage = "\xff\xff\xff\xff\x0f not a protobuf";
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1), response;
  for (const char* method :
       {"/pscluster.ps.ShardData/PullDense", "/pscluster.ps.ShardData/RegisterWorker",
        "/pscluster.ps.ShardData/PullDenseStream", "/pscluster.ps.ShardData/PushDense",
        "/pscluster.ps.ShardData/PushSparse"}) {
    SCOPED_TRACE(method);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status;
    absl::Notification done;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    ExpectError(status, grpc::StatusCode::INVALID_ARGUMENT, method);
    EXPECT_THAT(status.error_message(), HasSubstr("did not parse"));
  }
}

}  // namespace
}  // namespace pscluster
