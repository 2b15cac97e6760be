// The coordinator with real processes: shards register and heartbeat, a worker finds them
// through the view, a killed shard is declared dead and its restart changes the shard map
// (stale progress reports are refused), bad requests get clear errors, and psctl reports
// the cluster with exit codes a script can rely on.
#include <signal.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "tests/subprocess.h"
#include "worker/client/coordinator_client.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr int kShards = 2;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = testing::Subprocess::Start({"server/coordinator/ps_coordinator", "--port=0",
                                         absl::StrCat("--num_shards=", kShards), "--num_workers=1",
                                         "--heartbeat_timeout_ms=600"});
    ASSERT_TRUE(c.ok());
    auto line = c->WaitForLine("listening on", absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << line.status();
    coordinator_ = line->substr(line->find("listening on ") + 13);
    coordinator_ = coordinator_.substr(0, coordinator_.find(' '));
    processes_.push_back(*std::move(c));
    for (int s = 0; s < kShards; ++s) shard_addresses_.push_back(StartShard(s));
    stub_ = coord::Coordinator::NewStub(
        grpc::CreateChannel(coordinator_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    for (auto& p : processes_) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  }

  // Starts shard `s` registered with the coordinator; returns its address.
  std::string StartShard(int s) {
    auto p = testing::Subprocess::Start(
        {"server/ps/ps_server", "--port=0", absl::StrCat("--shard_id=", s),
         absl::StrCat("--num_shards=", kShards), "--coordinator=" + coordinator_});
    EXPECT_TRUE(p.ok());
    auto line = p->WaitForLine("listening on", absl::Seconds(60));
    EXPECT_TRUE(line.ok()) << line.status();
    EXPECT_TRUE(p->WaitForLine("registered with the coordinator", absl::Seconds(60)).ok());
    shard_index_[s] = processes_.size();
    processes_.push_back(*std::move(p));
    return line->substr(line->find("listening on ") + 13);
  }

  std::unique_ptr<CoordinatorClient> JoinAsWorker() {
    CoordinatorClientOptions o;
    o.coordinator = coordinator_;
    o.role = coord::WORKER;
    o.id = 0;
    o.address = "test-worker";
    o.heartbeat_interval = absl::Milliseconds(100);
    auto c = CoordinatorClient::Register(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Blocks until the view changes past `version` and satisfies `pred` (bounded).
  coord::ClusterView AwaitViewWhere(CoordinatorClient* c, int64_t version,
                                    const std::function<bool(const coord::ClusterView&)>& pred) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      auto v = c->AwaitView(version + 1, false, deadline - absl::Now());
      EXPECT_TRUE(v.ok()) << v.status();
      if (!v.ok() || pred(*v)) return v.ok() ? *v : coord::ClusterView();
      version = v->version();
    }
    ADD_FAILURE() << "the view never reached the expected state";
    return {};
  }

  int Psctl(const std::string& command, std::string* first_line) {
    auto p =
        testing::Subprocess::Start({"tools/psctl/psctl", "--coordinator=" + coordinator_, command});
    EXPECT_TRUE(p.ok());
    auto line = p->WaitForLine("", absl::Seconds(60));
    *first_line = line.ok() ? *line : "";
    auto status = p->Wait(absl::Seconds(60));
    EXPECT_TRUE(status.ok());
    return status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
  }

  std::string coordinator_;
  std::vector<std::string> shard_addresses_;
  std::map<int, size_t> shard_index_;
  std::vector<testing::Subprocess> processes_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
};

TEST_F(CoordinatorTest, WorkerFindsTheShardsThroughTheCompleteView) {
  auto worker = JoinAsWorker();
  ASSERT_NE(worker, nullptr);
  auto view = worker->AwaitView(0, /*complete=*/true, absl::Seconds(60));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->complete());
  EXPECT_THAT(view->shard_addresses(), ::testing::ElementsAreArray(shard_addresses_));
  EXPECT_EQ(view->mode(), "ps");
  std::string line;
  EXPECT_EQ(Psctl("status", &line), 0);
  EXPECT_THAT(line, HasSubstr("complete"));
}

TEST_F(CoordinatorTest, KilledShardIsDeclaredDeadAndItsRestartChangesTheShardMap) {
  auto worker = JoinAsWorker();
  ASSERT_NE(worker, nullptr);
  auto view = worker->AwaitView(0, true, absl::Seconds(60));
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(worker->ReportProgress(view->version(), 10, 0.5, 100).ok());

  ASSERT_TRUE(processes_[shard_index_[1]].Stop(SIGKILL, absl::Seconds(20)).ok());
  auto shard1_dead = [](const coord::ClusterView& v) {
    for (const auto& m : v.members()) {
      if (m.role() == coord::SHARD && m.id() == 1) return !m.alive();
    }
    return false;
  };
  // Wait for shard 1 itself: under load the test's own worker may also miss a heartbeat.
  coord::ClusterView dead = AwaitViewWhere(worker.get(), view->version(), shard1_dead);
  EXPECT_TRUE(shard1_dead(dead));
  EXPECT_FALSE(dead.complete());
  std::string line;
  EXPECT_EQ(Psctl("status", &line), 1) << "psctl must report the dead shard with exit code 1";
  EXPECT_THAT(line, HasSubstr("INCOMPLETE"));

  const std::string restarted = StartShard(1);  // a new port: the shard map changes
  auto healed = worker->AwaitView(dead.version() + 1, true, absl::Seconds(60));
  ASSERT_TRUE(healed.ok()) << healed.status();
  EXPECT_EQ(healed->shard_addresses(1), restarted);
  absl::Status stale = worker->ReportProgress(view->version(), 11, 0.5, 100);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_THAT(std::string(stale.message()), HasSubstr("stale"));
  EXPECT_TRUE(worker->ReportProgress(healed->version(), 11, 0.5, 100).ok());
}

TEST_F(CoordinatorTest, BadRequestsGetClearErrors) {
  auto worker = JoinAsWorker();
  ASSERT_NE(worker, nullptr);
  auto call = [&](auto rpc, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return ((*stub_).*rpc)(&ctx, req, resp);
  };
  coord::RegisterRequest dup;  // worker 0 is alive at "test-worker"
  dup.set_role(coord::WORKER);
  dup.set_id(0);
  dup.set_address("impostor");
  coord::RegisterResponse rr;
  grpc::Status s = call(&coord::Coordinator::Stub::Register, dup, &rr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(s.error_message(), HasSubstr("test-worker"));

  coord::RegisterRequest out_of_range = dup;
  out_of_range.set_id(5);
  s = call(&coord::Coordinator::Stub::Register, out_of_range, &rr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("--num_workers=1"));

  coord::HeartbeatRequest unknown;
  unknown.set_role(coord::SHARD);
  unknown.set_id(1);
  unknown.set_incarnation(99);
  coord::HeartbeatResponse hr;
  s = call(&coord::Coordinator::Stub::Heartbeat, unknown, &hr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("incarnation 99"));

  coord::KvGetRequest missing;
  missing.set_key("nccl/unique_id");
  coord::KvGetResponse kr;
  s = call(&coord::Coordinator::Stub::KvGet, missing, &kr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(worker->KvPut("nccl/unique_id", std::string("\0\1\2", 3)).ok());
  auto got = worker->KvGet("nccl/unique_id", true, absl::Seconds(30));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, std::string("\0\1\2", 3));

  std::string line;
  EXPECT_EQ(Psctl("frobnicate", &line), 2);
}

}  // namespace
}  // namespace pscluster
