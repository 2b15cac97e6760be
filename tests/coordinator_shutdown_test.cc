// Regression: a coordinator told to stop (SIGTERM) never finished while GetView or KvGet
// calls were blocked in it with long deadlines. Every blocking handler is woken on
// shutdown: they fail with UNAVAILABLE, and the process exits 0 at once.
#include <signal.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "tests/subprocess.h"

namespace pscluster {
namespace {

TEST(CoordinatorShutdownTest, SigtermWakesBlockedGetViewAndKvGetAndExits) {
  auto c = testing::Subprocess::Start(
      {"server/coordinator/ps_coordinator", "--port=0", "--num_shards=1", "--num_workers=1"});
  ASSERT_TRUE(c.ok()) << c.status();
  auto line = c->WaitForLine("listening on", absl::Seconds(60));
  ASSERT_TRUE(line.ok()) << line.status();
  const std::string address = *testing::ListeningAddress(*line);
  auto stub =
      coord::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

  // Two calls that would block for 10 minutes (a view that never comes, a key never set),
  // started in order on one connection before a probe whose answer shows the server has
  // read them.
  grpc::CompletionQueue cq;
  grpc::ClientContext view_ctx, kv_ctx;
  view_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(10)));
  kv_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(10)));
  coord::GetViewRequest view_req;
  view_req.set_wait_until_complete(true);
  coord::KvGetRequest kv_req;
  kv_req.set_key("never/set");
  kv_req.set_wait(true);
  coord::ClusterView view_resp;
  coord::KvGetResponse kv_resp;
  grpc::Status view_status, kv_status;
  auto view_call = stub->AsyncGetView(&view_ctx, view_req, &cq);
  view_call->Finish(&view_resp, &view_status, reinterpret_cast<void*>(1));
  auto kv_call = stub->AsyncKvGet(&kv_ctx, kv_req, &cq);
  kv_call->Finish(&kv_resp, &kv_status, reinterpret_cast<void*>(2));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    coord::KvPutRequest req;
    req.set_key("probe");
    coord::KvPutResponse resp;
    ASSERT_TRUE(stub->KvPut(&ctx, req, &resp).ok());
  }
  auto status = c->Stop(SIGTERM, absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << "the coordinator did not exit within 30 s of SIGTERM: "
                           << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  for (int i = 0; i < 2; ++i) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_EQ(cq.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + absl::Seconds(30))),
              grpc::CompletionQueue::GOT_EVENT);
  }
  cq.Shutdown();
  for (const grpc::Status* s : {&view_status, &kv_status}) {
    EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAVAILABLE) << s->error_message();
  }
}

}  // namespace
}  // namespace pscluster
