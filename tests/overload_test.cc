// A shard's client calls run on gRPC's callback API and hold no handler thread (--threads
// bounds only the replicas' calls): client streams held open do not stop unary calls, and
// streams whose callers cancel change nothing; pulls waiting for BSP hold no thread at
// all, 64 of them wait at once on a shard with --threads=4, and all are answered.
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "client/ps/shard_stub.h"
#include "common/sharding.h"
#include "gmock/gmock.h"
#include "tests/ps_cluster_fixture.h"
#include "tests/test_tables.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr int kThreads = 3;
constexpr uint32_t kBsp = 1;
constexpr uint64_t kSize = 64;

// A BSP table (the default) under SGD with learning rate 1; dense ones of kSize values.
TableSpec SgdSpec(uint32_t id, TableSpec::Kind kind) {
  OptimizerConfig sgd;
  sgd.set_kind(OptimizerConfig::SGD);
  sgd.set_learning_rate(1.0f);
  TableSpec spec = Spec(id, kind, sgd);
  if (kind == TableSpec::DENSE) spec.set_size(kSize);
  return spec;
}

class OverloadTest : public PsClusterTest {
 protected:
  std::vector<std::string> ServerArgs() override { return {absl::StrCat("--threads=", kThreads)}; }

  // While streams hold the shard: two tables created on shard 0 by unary calls (100, 101)
  // and one export of the BSP table, all served.
  void ExpectUnaryCallsAndAnExportServed() {
    for (uint32_t id : {100, 101}) {
      ps::CreateTableRequest probe;
      *probe.mutable_spec() = SgdSpec(id, TableSpec::DENSE);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      ps::CreateTableResponse resp;
      grpc::Status s = clients_[1]->stub(0)->CreateTable(&ctx, probe, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
    ps::ExportDenseRequest probe;
    probe.set_table_id(kBsp);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = clients_[1]->stub(0)->ExportDense(&ctx, probe);
    ps::TableStateChunk chunk;
    int chunks = 0;
    while (reader->Read(&chunk)) ++chunks;
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(chunks, 1);
  }

  // Once the streams were cancelled: tables 100 and 101 on shard 0 and 500 on both, and the
  // BSP table's values as `before`.
  void ExpectTablesAndValues(const std::vector<float>& before) {
    auto describe = [&](int shard, uint32_t id) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      ps::DescribeTableRequest req;
      req.set_table_id(id);
      ps::TableInfo info;
      return clients_[0]->stub(shard)->DescribeTable(&ctx, req, &info).error_code();
    };
    EXPECT_EQ(describe(0, 500), grpc::StatusCode::OK);
    EXPECT_EQ(describe(1, 500), grpc::StatusCode::OK);
    EXPECT_EQ(describe(0, 100), grpc::StatusCode::OK);
    EXPECT_EQ(describe(0, 101), grpc::StatusCode::OK);
    std::vector<float> after(kSize);
    ASSERT_TRUE(clients_[0]->PullDense(kBsp, 0, absl::MakeSpan(after)).ok());
    EXPECT_EQ(after, before) << "a cancelled stream changed the table";
  }
};

// Client streams held open (pushes and imports), twice as many as --threads, each with one
// chunk sent and the rest never: the shard has every one (its initial metadata says so),
// holds no thread for them, and still serves unary calls and exports; the streams,
// cancelled, change nothing.
TEST_F(OverloadTest, StreamsHeldOpenTakeNoThreadAndChangeNothing) {
  ASSERT_TRUE(clients_[0]->CreateTable(SgdSpec(kBsp, TableSpec::DENSE)).ok());
  std::vector<float> bsp_before(kSize);
  ASSERT_TRUE(clients_[0]->PullDense(kBsp, 0, absl::MakeSpan(bsp_before)).ok());

  constexpr int kHeld = 2 * kThreads;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(kHeld);
  std::vector<grpc::Status> ended(kHeld);
  absl::Mutex mu;
  int held = 0;
  std::vector<std::thread> holders;
  for (int i = 0; i < kHeld; ++i) {
    contexts[i] = std::make_unique<grpc::ClientContext>();
    contexts[i]->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    holders.emplace_back([&, i] {
      grpc::ClientContext* ctx = contexts[i].get();
      auto hold = [&](auto stream, const auto& first) {
        stream->Write(first);
        stream->WaitForInitialMetadata();  // the shard took the first chunk
        {
          absl::MutexLock lock(&mu);
          ++held;
        }
        ended[i] = stream->Finish();  // the shard waits for the rest until cancelled
      };
      if (i % 2 == 0) {
        ps::ImportDenseResponse resp;
        ps::TableStateChunk first;
        first.set_table_id(kBsp);
        first.add_values(1.0f);
        hold(clients_[0]->stub(0)->ImportDense(ctx, &resp), first);
      } else {
        ps::PushDenseResponse resp;
        ps::DenseChunk first;
        first.set_worker_id(0);
        first.set_table_id(kBsp);
        first.set_total_length(kSize / 2);
        const float one = 1.0f;
        first.set_data(&one, sizeof(one));
        hold(clients_[0]->stub(0)->PushDenseStream(ctx, &resp), first);
      }
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto all_held = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return held == kHeld; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_held), absl::Seconds(30)))
        << held << " of " << kHeld << " streams reached the shard";
  }
  ExpectUnaryCallsAndAnExportServed();
  EXPECT_TRUE(clients_[1]->CreateTable(SgdSpec(500, TableSpec::DENSE)).ok());

  for (auto& ctx : contexts) ctx->TryCancel();
  for (auto& t : holders) t.join();
  for (const grpc::Status& s : ended) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  }
  ExpectTablesAndValues(bsp_before);
}

// 64 workers on one shard that 4 handler threads serve: each pulls step 1 of a BSP table,
// which waits for step 0, parked, holding no thread; the 64 pushes of step 0 are served, and
// every pull is answered with the values step 0 left. (With pulls that held a thread each,
// the fifth was refused at once, "Server Threadpool Exhausted".)
class ParkedPullsTest : public PsClusterTest {
 protected:
  static constexpr int kPullers = 64;
  std::vector<std::string> ServerArgs() override { return {"--threads=4"}; }

  void SetUp() override {
    PsClusterTest::SetUp();
    if (HasFatalFailure()) return;
    shard0_ = clients_[0]->stub(0);
    for (int w = 0; w < kPullers; ++w) {
      grpc::ClientContext ctx;
      Deadline(&ctx);
      ps::RegisterWorkerRequest req;
      req.set_worker_id(w);
      ps::RegisterWorkerResponse resp;
      ASSERT_TRUE(shard0_->RegisterWorker(&ctx, req, &resp).ok()) << w;
    }
  }
  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }
  // Shard 0's pulls parked now, summed over its tables.
  uint64_t Parked() {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ps::StatsResponse stats;
    if (!shard0_->Stats(&ctx, ps::StatsRequest(), &stats).ok()) return 0;
    uint64_t n = 0;
    for (const ps::TableStats& t : stats.tables()) n += t.pulls_parked();
    return n;
  }
  // pull(w) for every worker at once; once all are parked, push(w) for every worker in turn
  // (each must be served); then every pull must have been answered, with what pull(0)
  // answers afterwards. Answers are compared as bytes.
  void PullWhilePushing(const std::function<grpc::Status(int, std::string*)>& pull,
                        const std::function<grpc::Status(int)>& push) {
    std::vector<grpc::Status> pulled(kPullers);
    std::vector<std::string> answers(kPullers);
    std::vector<std::thread> pullers;
    for (int w = 0; w < kPullers; ++w) {
      pullers.emplace_back([&, w] { pulled[w] = pull(w, &answers[w]); });
    }
    // Bounded: a pull that could not park would have been refused at once.
    for (const absl::Time give_up = absl::Now() + absl::Seconds(60);
         Parked() < kPullers && absl::Now() < give_up;) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(Parked(), kPullers);
    for (int w = 0; w < kPullers; ++w) {
      grpc::Status s = push(w);
      EXPECT_TRUE(s.ok()) << "push of worker " << w << ": " << s.error_message();
    }
    for (auto& t : pullers) t.join();
    std::string want;
    ASSERT_TRUE(pull(0, &want).ok());
    for (int w = 0; w < kPullers; ++w) {
      ASSERT_TRUE(pulled[w].ok()) << "worker " << w << ": " << pulled[w].error_message();
      EXPECT_EQ(answers[w], want) << "worker " << w;
    }
    EXPECT_EQ(Parked(), 0u);
  }

  pscluster::ShardStub* shard0_ = nullptr;
};

TEST_F(ParkedPullsTest, SixtyFourDensePullsWaitAtOnceOnFourThreadsAndAllAreAnswered) {
  ASSERT_TRUE(clients_[0]->CreateTable(SgdSpec(kBsp, TableSpec::DENSE)).ok());
  PullWhilePushing(
      [&](int w, std::string* values) {
        grpc::ClientContext ctx;
        Deadline(&ctx);
        ps::PullDenseRequest req;
        req.set_worker_id(w);
        req.set_step(1);
        req.set_table_id(kBsp);
        req.set_length(kSize / 2);
        ps::DenseChunk chunk;
        grpc::Status s = shard0_->PullDense(&ctx, req, &chunk);
        *values = chunk.data();
        return s;
      },
      [&](int w) {
        grpc::ClientContext ctx;
        Deadline(&ctx);
        ps::DenseChunk push;
        push.set_worker_id(w);
        push.set_table_id(kBsp);
        push.set_total_length(kSize / 2);
        const std::vector<float> grad(kSize / 2, 1.0f);
        push.set_data(grad.data(), grad.size() * sizeof(float));
        ps::PushDenseResponse resp;
        return shard0_->PushDense(&ctx, push, &resp);
      });
}

TEST_F(ParkedPullsTest, SixtyFourSparsePullsWaitAtOnceOnFourThreadsAndAllAreAnswered) {
  constexpr int kDim = 4;
  TableSpec bsp = SgdSpec(kBsp, TableSpec::SPARSE);
  bsp.set_dim(kDim);
  ASSERT_TRUE(clients_[0]->CreateTable(bsp).ok());
  // Keys that live on shard 0.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; keys.size() < 8; ++k) {
    if (SparseShardOf(k, kShards) == 0) keys.push_back(k);
  }
  auto request = [&](int w, int64_t step) {
    ps::SparseRequest req;
    req.set_worker_id(w);
    req.set_step(step);
    req.set_table_id(kBsp);
    for (uint64_t k : keys) req.add_keys(k);
    return req;
  };
  PullWhilePushing(
      [&](int w, std::string* values) {
        grpc::ClientContext ctx;
        Deadline(&ctx);
        ps::PullSparseResponse rows;
        grpc::Status s = shard0_->PullSparse(&ctx, request(w, 1), &rows);
        *values = rows.values();
        return s;
      },
      [&](int w) {
        grpc::ClientContext ctx;
        Deadline(&ctx);
        ps::SparseRequest req = request(w, 0);
        const std::vector<float> grads(keys.size() * kDim, 1.0f);
        req.set_grads(grads.data(), grads.size() * sizeof(float));
        ps::PushSparseResponse resp;
        return shard0_->PushSparse(&ctx, req, &resp);
      });
}

// A parked pull ends when its caller cancels (CANCELLED) or when its deadline comes
// (DEADLINE_EXCEEDED naming the worker it waited for), and is no longer parked after.
TEST_F(ParkedPullsTest, AParkedPullEndsWhenItsCallerCancelsOrItsDeadlineComes) {
  ASSERT_TRUE(clients_[0]->CreateTable(SgdSpec(kBsp, TableSpec::DENSE)).ok());
  ps::PullDenseRequest req;
  req.set_worker_id(0);
  req.set_step(1);
  req.set_table_id(kBsp);
  req.set_length(kSize / 2);

  grpc::ClientContext cancelled;
  Deadline(&cancelled);
  grpc::Status first;
  std::thread puller([&] {
    ps::DenseChunk chunk;
    first = shard0_->PullDense(&cancelled, req, &chunk);
  });
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);
       Parked() < 1 && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Parked(), 1u);
  cancelled.TryCancel();
  puller.join();
  EXPECT_EQ(first.error_code(), grpc::StatusCode::CANCELLED) << first.error_message();
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);
       Parked() > 0 && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Parked(), 0u) << "a cancelled pull stayed parked";

  grpc::ClientContext short_deadline;
  short_deadline.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  ps::DenseChunk chunk;
  grpc::Status late = shard0_->PullDense(&short_deadline, req, &chunk);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << late.error_message();
  EXPECT_THAT(late.error_message(), HasSubstr("waited for BSP")) << "the shard's own answer";
  EXPECT_EQ(Parked(), 0u);
}

}  // namespace
}  // namespace pscluster
