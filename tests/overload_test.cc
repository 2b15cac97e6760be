// A shard at its --threads bound refuses further calls at once with RESOURCE_EXHAUSTED
// (gRPC's synchronous server, before any handler runs), and the refused calls change
// nothing; the client says what to do and retries them itself; pulls waiting for BSP whose
// callers cancel give their threads back, and the shard serves again.
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "tests/ps_cluster_fixture.h"
#include "tests/test_tables.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr int kThreads = 3;
constexpr uint32_t kBsp = 1, kAsp = 2;
constexpr uint64_t kSize = 64;

class OverloadTest : public PsClusterTest {
 protected:
  std::vector<std::string> ServerArgs() override { return {absl::StrCat("--threads=", kThreads)}; }
};

TEST_F(OverloadTest, CallsPastTheThreadBoundAreRefusedAtOnceAndChangeNothing) {
  OptimizerConfig sgd;
  sgd.set_kind(OptimizerConfig::SGD);
  sgd.set_learning_rate(1.0f);
  TableSpec bsp = Spec(kBsp, TableSpec::DENSE, sgd), asp = Spec(kAsp, TableSpec::DENSE, sgd);
  bsp.set_size(kSize);
  asp.set_size(kSize);
  asp.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  ASSERT_TRUE(clients_[0]->CreateTable(bsp).ok());
  ASSERT_TRUE(clients_[0]->CreateTable(asp).ok());
  std::vector<float> before(kSize);
  ASSERT_TRUE(clients_[0]->PullDense(kAsp, 0, absl::MakeSpan(before)).ok());

  // Worker 0's BSP pulls of step 1 wait for worker 1, which never pushes step 0: each holds
  // a handler thread of shard 0 until it is cancelled. A pull refused because the probes
  // below hold the threads for the moment is made again (else the probes got threads
  // for ever, up to the 1024-step limit: seen under load).
  struct Puller {
    absl::Mutex mu;
    grpc::ClientContext* ctx ABSL_GUARDED_BY(mu) = nullptr;
    bool stop ABSL_GUARDED_BY(mu) = false;
    void Cancel() {
      absl::MutexLock lock(&mu);
      stop = true;
      if (ctx != nullptr) ctx->TryCancel();
    }
  };
  std::vector<std::unique_ptr<Puller>> waits;
  std::vector<std::thread> pullers;
  for (int i = 0; i < kThreads; ++i) {
    waits.push_back(std::make_unique<Puller>());
    pullers.emplace_back([this, puller = waits.back().get()] {
      for (grpc::Status s;;) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        {
          absl::MutexLock lock(&puller->mu);
          if (puller->stop) return;
          puller->ctx = &ctx;
        }
        ps::PullDenseRequest req;
        req.set_worker_id(0);
        req.set_step(1);
        req.set_table_id(kBsp);
        ps::DenseChunk resp;
        s = clients_[0]->stub(0)->PullDense(&ctx, req, &resp);
        absl::MutexLock lock(&puller->mu);
        puller->ctx = nullptr;
        if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return;
      }
    });
  }
  // Until every thread is taken some probes (worker 1's unary pushes to shard 0's half)
  // still get one; then they are refused. Bounded.
  int accepted = 0;
  grpc::Status refused;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30); absl::Now() < give_up;) {
    ps::DenseChunk probe;
    probe.set_worker_id(1);
    probe.set_step(accepted);
    probe.set_table_id(kAsp);
    probe.set_total_length(kSize / 2);
    const std::vector<float> ones(kSize / 2, 1.0f);
    probe.set_data(ones.data(), ones.size() * sizeof(float));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ps::PushDenseResponse resp;
    grpc::Status s = clients_[1]->stub(0)->PushDense(&ctx, probe, &resp);
    if (s.ok()) {
      ++accepted;
      continue;
    }
    refused = s;
    break;
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_EQ(refused.error_message(), "Server Threadpool Exhausted");
  const absl::Status said = FromGrpcStatus(refused, "shard 0");
  EXPECT_THAT(std::string(said.message()), HasSubstr("retry after a backoff"));

  // The client retries a refused call (it changed nothing): its push of both halves waits
  // out the overload and is applied once on each shard, not on shard 1 alone.
  absl::Status pushed;
  std::thread pusher(
      [&] { pushed = clients_[1]->PushDense(kAsp, accepted, std::vector<float>(kSize, 1.0f)); });
  // Cancelled, the waiting pulls give their threads back (within Table::kCancelCheckEvery).
  for (auto& puller : waits) puller->Cancel();
  for (auto& t : pullers) t.join();
  pusher.join();
  EXPECT_TRUE(pushed.ok()) << pushed;
  std::vector<float> after(kSize);
  ASSERT_TRUE(clients_[0]->PullDense(kAsp, 0, absl::MakeSpan(after)).ok());
  for (uint64_t i = 0; i < kSize; ++i) {
    // The shard's SGD steps in float, in order: each accepted probe, then the retried push.
    float want = before[i];
    for (int k = 0; k < (i < kSize / 2 ? accepted : 0); ++k) want -= 1.0f;
    want -= 1.0f;
    EXPECT_EQ(after[i], want) << "index " << i << " (" << accepted << " probes accepted)";
  }
}

}  // namespace
}  // namespace pscluster
