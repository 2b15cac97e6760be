// A shard at its --threads bound refuses further calls at once with RESOURCE_EXHAUSTED
// (gRPC's synchronous server, before any handler runs), saying what to do, and the refused
// calls change nothing; pulls waiting for BSP whose callers cancel give their threads back,
// and the shard serves again.
#include <thread>

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
  std::vector<std::string> ServerArgs() override {
    return {absl::StrCat("--threads=", kThreads)};
  }
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
  // a handler thread of shard 0 until it is cancelled.
  std::vector<std::unique_ptr<grpc::ClientContext>> waits;
  std::vector<std::thread> pullers;
  for (int i = 0; i < kThreads; ++i) {
    waits.push_back(std::make_unique<grpc::ClientContext>());
    waits.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pullers.emplace_back([this, ctx = waits.back().get()] {
      ps::PullDenseRequest req;
      req.set_worker_id(0);
      req.set_step(1);
      req.set_table_id(kBsp);
      ps::DenseChunk resp;
      clients_[0]->stub(0)->PullDense(ctx, req, &resp);
    });
  }
  // Until every thread is taken some probes still get one; then they are refused. Bounded.
  const std::vector<float> grad(kSize, 1.0f);
  int accepted = 0;
  absl::Status refused;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    absl::Status s = clients_[1]->PushDense(kAsp, accepted, grad);
    if (s.ok()) {
      ++accepted;
      continue;
    }
    refused = s;
    break;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("Server Threadpool Exhausted"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("retry after a backoff"));
  // Cancelled, the waiting pulls give their threads back (within Table::kCancelCheckEvery):
  // the shard serves again. Bounded.
  for (auto& ctx : waits) ctx->TryCancel();
  for (auto& t : pullers) t.join();
  std::vector<float> after(kSize);
  absl::Status served;
  for (const absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;) {
    served = clients_[0]->PullDense(kAsp, 0, absl::MakeSpan(after));
    if (served.code() != absl::StatusCode::kResourceExhausted) break;
  }
  ASSERT_TRUE(served.ok()) << served;

  // The refused push changed nothing on shard 0; the accepted ones applied whole.
  for (uint64_t i = 0; i < kSize; ++i) {
    const bool on_shard0 = i < kSize / 2;  // the refusal came from shard 0 (shard 1 applied)
    EXPECT_EQ(after[i], before[i] - accepted - (on_shard0 ? 0 : 1)) << "index " << i;
  }
}

}  // namespace
}  // namespace pscluster
