// The coordinator with real processes: shards register and heartbeat, a worker finds them
// through the view, a killed shard is declared dead and its restart changes the shard map
// (stale progress reports are refused), bad requests get clear errors, and psctl reports
// the cluster with exit codes a script can rely on. Live mode switches: psctl schedules,
// workers poll and report, the view records the switch; refusals get their codes.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/coordinator/coordinator_client.h"
#include "client/ps/ps_client.h"
#include "client/ps/shard_stub.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/ps.grpc.pb.h"
#include "tests/subprocess.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kShards = 2;

// Runs `argv` to its end; returns its exit code (-1: it did not exit) and its stdout lines.
int RunToExit(const std::vector<std::string>& argv, std::vector<std::string>* lines) {
  auto p = testing::Subprocess::Start(argv);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return -1;
  for (auto line = p->WaitForLine("", absl::Seconds(60)); line.ok();
       line = p->WaitForLine("", absl::Seconds(60))) {
    lines->push_back(*line);
  }
  auto status = p->Wait(absl::Seconds(60));
  EXPECT_TRUE(status.ok()) << status.status();
  return status.ok() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

// Runs psctl with `args`; returns its exit code (-1: it did not exit) and its stdout lines.
int RunPsctl(const std::vector<std::string>& args, std::vector<std::string>* lines) {
  std::vector<std::string> argv = {"tools/psctl/psctl"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunToExit(argv, lines);
}

// psctl top's output cut into its frames, each from its "psctl top:" header on.
std::vector<std::vector<std::string>> TopFrames(const std::vector<std::string>& lines) {
  std::vector<std::vector<std::string>> frames;
  for (const std::string& line : lines) {
    if (line.rfind("psctl top:", 0) == 0) frames.emplace_back();
    if (!frames.empty()) frames.back().push_back(line);
  }
  return frames;
}

// Starts `argv` plus `flags` into `processes` and waits for its "listening on" line (and then
// for `also`, unless null); returns its address, or "" (failing the test) when it does not
// serve.
std::string StartServer(std::vector<std::string> argv, const std::vector<std::string>& flags,
                        const char* also, std::vector<testing::Subprocess>* processes) {
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto p = testing::Subprocess::Start(argv);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return "";
  auto line = p->WaitForLine("listening on", absl::Seconds(60));
  EXPECT_TRUE(line.ok()) << line.status();
  if (also != nullptr) {
    auto also_line = p->WaitForLine(also, absl::Seconds(60));
    EXPECT_TRUE(also_line.ok()) << also_line.status();
  }
  processes->push_back(*std::move(p));
  return line.ok() ? testing::ListeningAddress(*line).value_or("") : "";
}

// Starts ps_coordinator with `flags` (besides --port=0) into `processes`; returns its
// address, or "" (failing the test) when it does not serve.
std::string StartCoordinator(const std::vector<std::string>& flags,
                             std::vector<testing::Subprocess>* processes) {
  return StartServer({"server/coordinator/ps_coordinator", "--port=0"}, flags, nullptr, processes);
}

// Starts shard `s` of `num_shards` registered with `coordinator` (with `flags` besides) into
// `processes`; returns its address, or "" (failing the test) when it does not serve.
std::string StartRegisteredShard(const std::string& coordinator, int s, int num_shards,
                                 const std::vector<std::string>& flags,
                                 std::vector<testing::Subprocess>* processes) {
  return StartServer({"server/ps/ps_server", "--port=0", absl::StrCat("--shard_id=", s),
                      absl::StrCat("--num_shards=", num_shards), "--coordinator=" + coordinator},
                     flags, "registered with the coordinator", processes);
}

coord::ClusterView GetView(coord::Coordinator::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  coord::ClusterView view;
  grpc::Status s = stub->GetView(&ctx, coord::GetViewRequest(), &view);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return view;
}

// Calls `rpc` on `stub` with a deadline.
template <typename Rpc, typename Req, typename Resp>
grpc::Status Call(coord::Coordinator::Stub* stub, Rpc rpc, const Req& req, Resp* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  return (stub->*rpc)(&ctx, req, resp);
}

// Registers with `coordinator` as worker `id`, heartbeating every 100 ms (until it is
// destroyed); null (failing the test) when it cannot.
std::unique_ptr<CoordinatorClient> JoinAsWorkerId(const std::string& coordinator, int id = 0) {
  CoordinatorClientOptions o;
  o.coordinator = coordinator;
  o.role = coord::WORKER;
  o.id = id;
  o.address = id == 0 ? "test-worker" : absl::StrCat("test-worker-", id);
  o.heartbeat_interval = absl::Milliseconds(100);
  auto c = CoordinatorClient::Register(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = testing::Subprocess::Start({"server/coordinator/ps_coordinator", "--port=0",
                                         absl::StrCat("--num_shards=", kShards), "--num_workers=1",
                                         "--heartbeat_timeout_ms=600"});
    ASSERT_TRUE(c.ok());
    auto line = c->WaitForLine("listening on", absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << line.status();
    coordinator_ = *testing::ListeningAddress(*line);
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
    shard_index_[s] = processes_.size();
    return StartRegisteredShard(coordinator_, s, kShards, {}, &processes_);
  }

  std::unique_ptr<CoordinatorClient> JoinAsWorker() { return JoinAsWorkerId(coordinator_); }

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
  EXPECT_EQ(view->mode(), coord::PS);
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

// The gRPC health protocol (what compose healthchecks and Kubernetes grpc probes ask):
// SERVING on every shard and the coordinator; a dead shard is unreachable (exit 3).
TEST_F(CoordinatorTest, ShardsAndCoordinatorAnswerTheGrpcHealthProtocol) {
  std::vector<std::string> out;
  for (const std::string& address : {shard_addresses_[0], shard_addresses_[1], coordinator_}) {
    EXPECT_EQ(RunPsctl({"--address=" + address, "health"}, &out), 0) << address;
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), address + ": SERVING");
  }
  EXPECT_EQ(RunPsctl({"--coordinator=" + coordinator_, "health"}, &out), 0)
      << "health defaults to the coordinator";
  ASSERT_TRUE(processes_[shard_index_[0]].Stop(SIGTERM, absl::Seconds(20)).ok());
  out.clear();  // (stderr onto the pipe, through a shell)
  EXPECT_EQ(RunToExit({"/bin/sh", "-c",
                       "tools/psctl/psctl --address=" + shard_addresses_[0] +
                           " health --timeout_seconds=2 2>&1"},
                      &out),
            3);
  EXPECT_THAT(absl::StrJoin(out, "\n"), HasSubstr("is it running at that address"))
      << "an unreachable address says what to check";
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

TEST_F(CoordinatorTest, StatusJsonParsesIntoTheViewWithEveryMemberTheModeAndHeartbeatAges) {
  auto worker = JoinAsWorker();
  ASSERT_NE(worker, nullptr);
  auto view = worker->AwaitView(0, /*complete=*/true, absl::Seconds(60));
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(worker->ReportProgress(view->version(), 7, 0.5, 100).ok());
  std::vector<std::string> out;
  const int code = RunPsctl({"--coordinator=" + coordinator_, "status", "--json"}, &out);
  ASSERT_EQ(out.size(), 1u) << "one JSON object on one line: " << absl::StrJoin(out, "\n");

  coord::ClusterView parsed;
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;  // the derived fields
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out[0], &parsed, lenient).ok()) << out[0];
  EXPECT_EQ(code, parsed.complete() ? 0 : 1) << "status's exit codes";
  EXPECT_EQ(parsed.mode(), coord::PS);
  EXPECT_THAT(parsed.shard_addresses(), ::testing::ElementsAreArray(shard_addresses_));
  ASSERT_EQ(parsed.members_size(), kShards + 1);
  const coord::Member& w = parsed.members(kShards);
  EXPECT_EQ(w.role(), coord::WORKER);
  EXPECT_EQ(w.address(), "test-worker");
  EXPECT_EQ(w.step(), 7);
  EXPECT_DOUBLE_EQ(w.loss(), 0.5);

  google::protobuf::Struct object;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out[0], &object).ok());
  EXPECT_EQ(object.fields().at("mode_name").string_value(), "ps");
  for (const auto& member : object.fields().at("members").list_value().values()) {
    const auto& fields = member.struct_value().fields();
    ASSERT_EQ(fields.count("heartbeat_age_seconds"), 1u);
    EXPECT_GE(fields.at("heartbeat_age_seconds").number_value(), 0);
  }
}

TEST_F(CoordinatorTest, TopDrawsTheRequestedFramesWithEveryMemberAndExitsZero) {
  auto worker = JoinAsWorker();
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->AwaitView(0, /*complete=*/true, absl::Seconds(60)).ok());
  std::vector<std::string> out;
  EXPECT_EQ(RunToExit({"/bin/sh", "-c",
                       "tools/psctl/psctl --coordinator=" + coordinator_ +
                           " top --iterations=2 --interval_seconds=0.01 </dev/null"},
                      &out),
            0);
  const auto frames = TopFrames(out);
  ASSERT_EQ(frames.size(), 2u) << absl::StrJoin(out, "\n");
  for (const auto& frame : frames) {
    const std::string text = absl::StrJoin(frame, "\n");
    EXPECT_THAT(text, HasSubstr("mode ps"));
    EXPECT_THAT(text, ::testing::Not(HasSubstr("\033["))) << "no screen control on a pipe";
    std::vector<std::string> rows;
    for (const std::string& line : frame) {
      if (line.rfind("shard ", 0) == 0 || line.rfind("worker ", 0) == 0) rows.push_back(line);
    }
    ASSERT_EQ(rows.size(), kShards + 1u) << text;
    for (int s = 0; s < kShards; ++s) EXPECT_THAT(rows[s], HasSubstr(shard_addresses_[s]));
    EXPECT_THAT(rows[kShards], HasSubstr("test-worker"));
  }
}

// A coordinator that is down (restarting, say) is a line in the view, retried each redraw.
TEST(PsctlTopTest, AnUnreachableCoordinatorIsShownAndRetriedNotAnExit) {
  std::vector<std::string> out;
  EXPECT_EQ(RunToExit({"/bin/sh", "-c",
                       "tools/psctl/psctl --coordinator=127.0.0.1:1 top --iterations=2 "
                       "--interval_seconds=0.01 --timeout_seconds=5 </dev/null"},
                      &out),
            0);
  const auto frames = TopFrames(out);
  ASSERT_EQ(frames.size(), 2u) << absl::StrJoin(out, "\n");
  for (const auto& frame : frames) {
    EXPECT_THAT(absl::StrJoin(frame, "\n"),
                HasSubstr("waiting for the coordinator at 127.0.0.1:1 to answer GetView"));
  }
}

TEST(PsctlTopTest, CtrlCEndsTopWithExitZero) {
  auto top = testing::Subprocess::Start(
      {"/bin/sh", "-c", "exec tools/psctl/psctl --coordinator=127.0.0.1:1 top </dev/null"});
  ASSERT_TRUE(top.ok()) << top.status();
  ASSERT_TRUE(top->WaitForLine("psctl top:", absl::Seconds(60)).ok()) << "the first frame";
  auto status = top->Stop(SIGINT, absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
}

// ---------------------------------------------------------------------------------------
// Live mode switches: a coordinator with one shard and two workers (this test's clients).

class ModeSwitchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_ = StartCoordinator({"--num_shards=1", "--num_workers=2"}, &processes_);
    ASSERT_FALSE(coordinator_.empty());
    ASSERT_FALSE(StartRegisteredShard(coordinator_, 0, 1, {}, &processes_).empty());
    for (int rank = 0; rank < 2; ++rank) {
      CoordinatorClientOptions o;
      o.coordinator = coordinator_;
      o.id = rank;
      o.address = absl::StrCat("worker-", rank);
      auto c = CoordinatorClient::Register(o);
      ASSERT_TRUE(c.ok()) << c.status();
      workers_.push_back(*std::move(c));
    }
    stub_ = coord::Coordinator::NewStub(
        grpc::CreateChannel(coordinator_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    workers_.clear();
    for (auto& p : processes_) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  }

  PendingSwitch MustPoll(int rank, int64_t step) {
    auto p = workers_[rank]->PollSwitch(step);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : PendingSwitch();
  }

  int Psctl(std::vector<std::string> args, std::vector<std::string>* lines) {
    args.insert(args.begin(), "--coordinator=" + coordinator_);
    return RunPsctl(args, lines);
  }

  std::string coordinator_;
  std::vector<testing::Subprocess> processes_;
  std::vector<std::unique_ptr<CoordinatorClient>> workers_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
};

TEST_F(ModeSwitchTest, PsctlSwitchIsPolledReportedByEveryWorkerAndRecordedInTheView) {
  EXPECT_FALSE(MustPoll(0, 12).pending);
  EXPECT_FALSE(MustPoll(1, 10).pending);
  std::vector<std::string> out;
  ASSERT_EQ(Psctl({"switch-mode", "--mode=fsdp"}, &out), 0);
  EXPECT_THAT(out, ElementsAre("switch 1 to fsdp scheduled at step 13"))
      << "the next boundary: one past the furthest polled step";

  for (int rank : {0, 1}) {  // rank 1 is behind: it sees the same switch ahead of it
    PendingSwitch p = MustPoll(rank, rank == 0 ? 13 : 11);
    EXPECT_TRUE(p.pending);
    EXPECT_EQ(p.switch_id, 1);
    EXPECT_EQ(p.at_step, 13);
    EXPECT_EQ(p.mode, coord::FSDP);
  }
  coord::ClusterView before = GetView(stub_.get());
  EXPECT_EQ(before.mode(), coord::PS);
  ASSERT_EQ(before.pending_switches_size(), 1);
  EXPECT_EQ(before.pending_switches(0).at_step(), 13);

  PendingSwitch sw = MustPoll(0, 13);
  auto done = workers_[0]->ReportSwitch(sw, coord::PS, 0.25);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(*done) << "rank 1 has not reported yet";
  coord::ClusterView half = GetView(stub_.get());
  EXPECT_EQ(half.mode(), coord::PS);
  EXPECT_THAT(half.pending_switches(0).acked_ranks(), ElementsAre(0));

  absl::StatusOr<coord::ClusterView> woken;
  std::thread reader([&] {  // a blocking reader wakes when the switch is done
    woken = workers_[1]->AwaitView(half.version() + 1, false, absl::Seconds(60));
  });
  done = workers_[1]->ReportSwitch(MustPoll(1, 13), coord::PS, 0.75);
  reader.join();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(woken->mode(), coord::FSDP);
  ASSERT_EQ(woken->switches_size(), 1);
  const coord::SwitchRecord& r = woken->switches(0);
  EXPECT_EQ(r.switch_id(), 1);
  EXPECT_EQ(r.at_step(), 13);
  EXPECT_EQ(r.from_mode(), coord::PS);
  EXPECT_EQ(r.to_mode(), coord::FSDP);
  EXPECT_DOUBLE_EQ(r.handoff_seconds(), 0.75);
  EXPECT_GT(r.unix_ms(), 0);
  EXPECT_EQ(woken->pending_switches_size(), 0);
  EXPECT_FALSE(MustPoll(0, 14).pending);

  out.clear();
  EXPECT_EQ(Psctl({"status"}, &out), 0);
  ASSERT_FALSE(out.empty());
  EXPECT_THAT(out[0], HasSubstr("mode fsdp"));
  bool listed = false;
  for (const std::string& line : out) {
    listed |= line.find(" 13 ps ") != std::string::npos && line.find("fsdp") != std::string::npos &&
              line.find("done") != std::string::npos;
  }
  EXPECT_TRUE(listed) << "psctl status lists the switch: " << absl::StrJoin(out, "\n");
}

TEST_F(ModeSwitchTest, ExplicitStepsAreKeptInOrderAndTheModeInEffectIsANoOp) {
  MustPoll(0, 20);
  auto late = workers_[0]->SwitchMode(coord::PIPELINE, 100);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->switch_id, 1);
  EXPECT_EQ(late->at_step, 100);
  std::vector<std::string> out;
  EXPECT_EQ(Psctl({"switch-mode", "--mode=allreduce", "--at_step=50"}, &out), 0);
  EXPECT_THAT(out, ElementsAre("switch 2 to allreduce scheduled at step 50"));

  PendingSwitch p = MustPoll(1, 21);
  EXPECT_EQ(p.switch_id, 2) << "the earliest switch ahead";
  EXPECT_EQ(p.at_step, 50);
  coord::ClusterView v = GetView(stub_.get());
  ASSERT_EQ(v.pending_switches_size(), 2);
  EXPECT_EQ(v.pending_switches(0).at_step(), 50);
  EXPECT_EQ(v.pending_switches(1).at_step(), 100);

  auto noop = workers_[0]->SwitchMode(coord::ALLREDUCE, 60);  // allreduce from 50 on
  ASSERT_TRUE(noop.ok()) << noop.status();
  EXPECT_TRUE(noop->no_op);
  EXPECT_EQ(noop->switch_id, 2);
  EXPECT_EQ(noop->at_step, 50);
  out.clear();
  EXPECT_EQ(Psctl({"switch-mode", "--mode=ps", "--at_step=30"}, &out), 0);
  EXPECT_THAT(out, ElementsAre(HasSubstr("already in effect")));
  EXPECT_EQ(GetView(stub_.get()).pending_switches_size(), 2) << "no-ops schedule nothing";
}

TEST_F(ModeSwitchTest, RefusedSwitchesGetTheirCodesMessagesAndPsctlExitCodes) {
  MustPoll(0, 57);
  auto passed = workers_[0]->SwitchMode(coord::FSDP, 40);
  EXPECT_EQ(passed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(passed.status().message()),
              HasSubstr("step 40 already passed: workers are at step 57; use a later step or 0 "
                        "for the next boundary"));
  std::vector<std::string> out;
  EXPECT_EQ(Psctl({"switch-mode", "--mode=fsdp", "--at_step=40"}, &out), 1);

  auto unknown = workers_[0]->SwitchMode(static_cast<coord::TrainingMode>(17), 0);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("use one of ps, allreduce, fsdp, pipeline or tensor"));
  EXPECT_EQ(Psctl({"switch-mode", "--mode=zero3"}, &out), 2);
  EXPECT_EQ(workers_[0]->SwitchMode(coord::FSDP, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Psctl({"switch-mode", "--mode=fsdp", "--at_step=-1"}, &out), 2);
  EXPECT_EQ(Psctl({"switch-mode"}, &out), 2) << "--mode is required";

  ASSERT_TRUE(workers_[0]->SwitchMode(coord::FSDP, 100).ok());
  auto twice = workers_[1]->SwitchMode(coord::PIPELINE, 100);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("switch 1 to fsdp"));
  EXPECT_EQ(Psctl({"switch-mode", "--mode=pipeline", "--at_step=100"}, &out), 1);
  EXPECT_TRUE(out.empty()) << "refusals print nothing on stdout";

  PendingSwitch bogus{true, 99, 100, coord::FSDP};
  EXPECT_EQ(workers_[0]->ReportSwitch(bogus, coord::PS, 0.1).status().code(),
            absl::StatusCode::kNotFound);

  // A replaced incarnation: the same error ReportProgress gives it.
  coord::ReportProgressRequest progress;
  progress.set_rank(1);
  progress.set_incarnation(7);
  progress.set_view_version(GetView(stub_.get()).version());
  coord::ReportProgressResponse progress_resp;
  grpc::Status expected =
      Call(stub_.get(), &coord::Coordinator::Stub::ReportProgress, progress, &progress_resp);
  ASSERT_EQ(expected.error_code(), grpc::StatusCode::NOT_FOUND);
  coord::ReportSwitchRequest report;
  report.set_rank(1);
  report.set_incarnation(7);
  report.set_switch_id(1);
  report.set_at_step(100);
  report.set_from_mode(coord::PS);
  report.set_to_mode(coord::FSDP);
  coord::ReportSwitchResponse report_resp;
  grpc::Status s = Call(stub_.get(), &coord::Coordinator::Stub::ReportSwitch, report, &report_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), expected.error_message());
  coord::PollSwitchRequest poll;
  poll.set_rank(1);
  poll.set_incarnation(7);
  poll.set_step(58);
  coord::PollSwitchResponse poll_resp;
  s = Call(stub_.get(), &coord::Coordinator::Stub::PollSwitch, poll, &poll_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), expected.error_message());

  EXPECT_EQ(RunPsctl({"--coordinator=127.0.0.1:1", "switch-mode", "--mode=fsdp"}, &out), 3)
      << "nothing listens there";
}

// Every usage error exits 2 with a line naming the problem and the usage line, before
// psctl contacts anyone (the address is one nothing listens on: reaching for it would be
// exit 3). absl's own flag parsing would exit 1 on an unknown flag or a bad value.
TEST(PsctlUsageTest, EveryUsageErrorExitsTwoSayingWhatToDo) {
  const std::string nowhere = "--coordinator=127.0.0.1:1";
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{nowhere, "--no_such_flag", "status"}, "unknown flag --no_such_flag"},
           {{nowhere, "--nostatus", "status"}, "unknown flag --nostatus"},
           {{nowhere, "switch-mode", "--mode=fsdp", "--at_step=abc"}, "--at_step=abc"},
           {{nowhere, "--timeout_seconds=soon", "status"}, "--timeout_seconds=soon"},
           {{nowhere, "status", "--timeout_seconds"}, "--timeout_seconds needs a value"},
           {{nowhere, "--timeout_seconds=0", "status"}, "--timeout_seconds=0 must be positive"},
           {{nowhere, "switch-mode", "--mode=fsdp", "--at_step=-1"}, "--at_step=-1 is negative"},
           {{nowhere, "switch-mode", "--mode=zero3"}, "mode 'zero3' is unknown"},
           {{nowhere, "switch-mode"}, "switch-mode needs --mode="},
           {{nowhere, "top", "--interval_seconds=0"},
            "--interval_seconds=0 is not a positive number of seconds"},
           {{nowhere, "top", "--interval_seconds=-1"}, "--interval_seconds=-1 is not a positive"},
           {{nowhere, "top", "--interval_seconds=soon"}, "--interval_seconds=soon"},
           {{nowhere, "top", "--iterations=-1"}, "--iterations=-1 is negative"},
           {{nowhere, "status", "--json=maybe"}, "--json=maybe"},
           {{nowhere},
            "give one command: status, top, checkpoint, checkpoints, restore, switch-mode, health, "
            "plan, export or help"},
           {{"help", "nope"}, "help: no command 'nope'"},
           {{nowhere, "restore"}, "restore needs --step=N"},
           {{nowhere, "restore", "--step=-1"}, "--step=-1 is negative"},
           {{"health"}, "health: give --address=HOST:PORT (or --coordinator)"},
           {{nowhere, "stats"}, "unknown command 'stats'"},
           {{"status"}, "--coordinator=HOST:PORT is required"},
           // Not HOST:PORT: gRPC dials 34463, then 443, then looks up "http://127.0.0.1:4000".
           {{"--coordinator=localhost:99999", "status"},
            "--coordinator 'localhost:99999' has port 99999, outside 1-65535; give HOST:PORT"},
           {{"--coordinator=localhost", "status"}, "--coordinator 'localhost' has no port"},
           {{"--coordinator=http://127.0.0.1:4000", "status"},
            "--coordinator 'http://127.0.0.1:4000' has a scheme ('http://')"},
           {{"--coordinator=localhost", "top", "--iterations=1"},
            "--coordinator 'localhost' has no port"},
           {{"--address=localhost:99999", "health"}, "--address 'localhost:99999' has port 99999"},
           {{"--address=localhost", "health"}, "--address 'localhost' has no port"},
           {{"--address=http://127.0.0.1:4000", "health"},
            "--address 'http://127.0.0.1:4000' has a scheme ('http://')"},
           {{"--coordinator=localhost", "health"}, "--coordinator 'localhost' has no port"},
       }) {
    // psctl writes its errors to stderr: through a shell, onto the pipe.
    std::string command = "tools/psctl/psctl";
    for (const std::string& a : c.args) absl::StrAppend(&command, " '", a, "'");
    std::vector<std::string> out;
    EXPECT_EQ(RunToExit({"/bin/sh", "-c", command + " 2>&1"}, &out), 2) << command;
    const std::string said = absl::StrJoin(out, "\n");
    EXPECT_THAT(said, ::testing::StartsWith("psctl: ")) << command;
    EXPECT_THAT(said, HasSubstr(c.says)) << command;
    EXPECT_THAT(said, HasSubstr("usage: psctl --coordinator=HOST:PORT status|")) << command;
  }
  // The flag syntax absl accepts still parses: "--flag value", "-flag", "--": nothing
  // listens at the address, so these get as far as trying it.
  std::vector<std::string> out;
  EXPECT_EQ(RunToExit({"/bin/sh", "-c",
                       "tools/psctl/psctl -coordinator 127.0.0.1:1 --timeout_seconds 5 -- status "
                       "2>&1"},
                      &out),
            3);
  EXPECT_THAT(absl::StrJoin(out, "\n"), HasSubstr("is it running at that address, and reachable"));
}

// A shard started with --coordinator serves no data call before it has registered: a
// restarted shard took its workers' pushes while the view still showed its old incarnation,
// and they stopped on the refusal of a step its restored tables had not reached instead of
// rolling back (docker shard_crash, once). Here the coordinator never answers.
TEST(ShardRegistrationTest, AShardServesNoDataCallBeforeItHasRegistered) {
  auto shard = testing::Subprocess::Start({"server/ps/ps_server", "--port=0", "--shard_id=0",
                                           "--num_shards=1", "--coordinator=127.0.0.1:1"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto line = shard->WaitForLine("listening on", absl::Seconds(60));
  ASSERT_TRUE(line.ok()) << line.status();
  auto stub = pscluster::ShardStub::New(
      grpc::CreateChannel(*testing::ListeningAddress(*line), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pscluster::ps::RegisterWorkerRequest req;
  pscluster::ps::RegisterWorkerResponse resp;
  grpc::Status s = stub->RegisterWorker(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("registering with the coordinator"));
  grpc::ClientContext stats_ctx;
  pscluster::ps::StatsResponse stats;
  EXPECT_TRUE(stub->Stats(&stats_ctx, pscluster::ps::StatsRequest(), &stats).ok())
      << "what it holds it still tells";
  EXPECT_EQ(stats.workers_size(), 0) << "nothing was registered";
  // SIGTERM stops it while it still waits for the coordinator (before, only after its
  // minute of registering).
  auto status = shard->Stop(SIGTERM, absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
}

// A coordinator (`flags` besides --num_shards=2 and its --data_dir) and its 2 shards, each
// with a --data_dir under `dir`, into `processes`; false (failing the test) when one does
// not serve.
bool StartCheckpointingCluster(const std::string& dir, std::vector<std::string> flags,
                               std::vector<testing::Subprocess>* processes,
                               std::string* coordinator, std::vector<std::string>* shards) {
  std::filesystem::remove_all(dir);
  flags.push_back("--num_shards=2");
  flags.push_back("--data_dir=" + dir + "/coordinator");
  *coordinator = StartCoordinator(flags, processes);
  if (coordinator->empty()) return false;
  for (int s = 0; s < 2; ++s) {
    shards->push_back(StartRegisteredShard(
        *coordinator, s, 2, {absl::StrCat("--data_dir=", dir, "/shard", s)}, processes));
    if (shards->back().empty()) return false;
  }
  return true;
}

// A BSP table of 64 values, plain SGD.
ps::TableSpec SmallBspTable() {
  ps::TableSpec spec;
  spec.set_table_id(1);
  spec.set_kind(ps::TableSpec::DENSE);
  spec.set_name("w");
  spec.set_size(64);
  spec.mutable_optimizer()->set_kind(ps::OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::BSP);
  return spec;
}

// An operator's checkpoint while a worker trains as fast as a BSP step can go (a pull and
// a push a step, one worker: each push applies at once): every one is taken, at ascending
// steps.
// Before, the checkpointer asked the shards for the step they reached and snapshotted it
// 4 times; tables that had moved on by then refused, and psctl checkpoint failed.
TEST(CheckpointWhileTrainingTest, EveryCheckpointIsTakenWhileTheTablesStepFast) {
  std::vector<testing::Subprocess> processes;
  std::string coordinator;
  std::vector<std::string> shards;
  ASSERT_TRUE(StartCheckpointingCluster(::testing::TempDir() + "/checkpoint_while_training",
                                        {"--num_workers=1"}, &processes, &coordinator, &shards));
  auto joined = JoinAsWorkerId(coordinator);  // the view is complete with it
  ASSERT_NE(joined, nullptr);

  PsClientOptions o;
  o.shard_addresses = shards;
  auto client = PsClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->RegisterWorker().ok());
  const ps::TableSpec spec = SmallBspTable();
  ASSERT_TRUE((*client)->CreateTable(spec).ok());

  std::atomic<bool> stop{false};
  std::atomic<int64_t> pushed{0};
  absl::Status training;
  std::thread worker([&] {
    std::vector<float> params(spec.size());
    const std::vector<float> grad(spec.size(), 0.001f);
    for (int64_t step = 0; !stop.load() && training.ok(); ++step) {  // as ps_worker's steps
      training = (*client)->PullDense(1, step, absl::MakeSpan(params));
      if (training.ok()) training = (*client)->PushDense(1, step, grad);
      pushed = step + 1;
    }
  });
  absl::Cleanup join = [&] {
    stop = true;
    worker.join();
  };
  auto stub = coord::Coordinator::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  int64_t last = -1;
  for (int i = 0; i < 8; ++i) {
    coord::Checkpoint taken;
    grpc::Status s =
        Call(stub.get(), &coord::Coordinator::Stub::Checkpoint, coord::CheckpointRequest(), &taken);
    ASSERT_TRUE(s.ok()) << "checkpoint " << i << " after " << pushed.load()
                        << " steps: " << s.error_message();
    EXPECT_GT(taken.step(), last) << "checkpoint " << i;
    last = taken.step();
  }
  std::move(join).Invoke();
  EXPECT_TRUE(training.ok()) << training;
  EXPECT_GT(pushed.load(), last) << "the checkpoints were taken while the steps went on";
  for (auto& p : processes) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
}

// A worker dies between its pushes of a step to the two shards (it reached shard 0 only)
// while a checkpoint's capture waits on shard 1 for that push: the checkpoint ends once the
// coordinator declares the worker dead, naming it, instead of waiting out its timeout (10
// minutes) while rank 0, which asked for it, cannot start the rollback.
TEST(CheckpointWhileTrainingTest, ACaptureWaitingForADeadWorkersPushEndsNamingTheWorker) {
  std::vector<testing::Subprocess> processes;
  absl::Cleanup stop = [&] {
    for (auto& p : processes) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  };
  std::string coordinator;
  std::vector<std::string> shards;
  ASSERT_TRUE(StartCheckpointingCluster(::testing::TempDir() + "/checkpoint_dead_worker",
                                        {"--num_workers=2", "--heartbeat_timeout_ms=600"},
                                        &processes, &coordinator, &shards));
  auto worker0 = JoinAsWorkerId(coordinator, 0);
  auto worker1 = JoinAsWorkerId(coordinator, 1);  // the view is complete with both
  ASSERT_TRUE(worker0 != nullptr && worker1 != nullptr);

  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < 2; ++w) {
    PsClientOptions o;
    o.shard_addresses = shards;
    o.worker_id = w;
    auto c = PsClient::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->RegisterWorker().ok());
    clients.push_back(*std::move(c));
  }
  const ps::TableSpec spec = SmallBspTable();
  ASSERT_TRUE(clients[0]->CreateTable(spec).ok());
  const std::vector<float> grad(spec.size(), 0.001f);
  ASSERT_TRUE(clients[0]->PushDense(1, 0, grad).ok());
  // Worker 1's push of step 0 reaches shard 0 and not shard 1 (an address nothing serves).
  PsClientOptions half;
  half.shard_addresses = {shards[0], "127.0.0.1:1"};
  half.worker_id = 1;
  half.rpc_timeout = absl::Seconds(1);
  auto partial = PsClient::Create(half);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_FALSE((*partial)->PushDense(1, 0, grad).ok());

  // The checkpoint takes step 1 (shard 0 applied it) and waits on shard 1 for worker 1.
  auto stub = coord::Coordinator::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  grpc::Status checkpoint;
  std::thread asker([&] {
    coord::Checkpoint taken;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    checkpoint = stub->Checkpoint(&ctx, coord::CheckpointRequest(), &taken);
  });
  absl::Cleanup join = [&] { asker.join(); };
  // Once shard 0 holds its capture of step 1, the checkpoint is waiting on shard 1.
  PsClientOptions one;
  one.shard_addresses = {shards[0]};
  auto shard0 = PsClient::Create(one);
  ASSERT_TRUE(shard0.ok()) << shard0.status();
  bool captured = false;
  for (const absl::Time end = absl::Now() + absl::Seconds(30); !captured && absl::Now() < end;) {
    auto lists = (*shard0)->ListSnapshots();
    ASSERT_TRUE(lists.ok()) << lists.status();
    for (const auto& snap : (*lists)[0].snapshots()) captured |= snap.step() == 1;
    if (!captured) absl::SleepFor(absl::Milliseconds(20));  // polled, bounded above
  }
  ASSERT_TRUE(captured) << "shard 0 never captured step 1 for the checkpoint";
  worker1.reset();  // worker 1's heartbeats stop: the coordinator declares it dead
  std::move(join).Invoke();
  EXPECT_EQ(checkpoint.error_code(), grpc::StatusCode::UNAVAILABLE) << checkpoint.error_message();
  EXPECT_THAT(checkpoint.error_message(), HasSubstr("checkpoint of step 1 abandoned"));
  EXPECT_THAT(checkpoint.error_message(), HasSubstr("worker rank 1"));
  EXPECT_THAT(checkpoint.error_message(), HasSubstr("is down"));
}

// A 3 MiB shard address was accepted and grew the view to 9 MiB: GetView failed with
// RESOURCE_EXHAUSTED for every default client, psctl status included. Refused at registration.
TEST(CoordinatorRegistrationTest, AThreeMebibyteShardAddressIsRefusedAndStatusStillWorks) {
  std::vector<testing::Subprocess> processes;
  // No shard process heartbeats here: a long timeout keeps the registered one alive.
  const std::string coordinator = StartCoordinator(
      {"--num_shards=1", "--num_workers=0", "--heartbeat_timeout_ms=600000"}, &processes);
  ASSERT_FALSE(coordinator.empty());
  auto stub = coord::Coordinator::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  coord::RegisterRequest shard;
  shard.set_role(coord::SHARD);
  shard.set_address(std::string(3 << 20, 'a') + ":5000");
  coord::RegisterResponse resp;
  grpc::Status s = Call(stub.get(), &coord::Coordinator::Stub::Register, shard, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("shard 0 replica 0's address"));
  EXPECT_THAT(s.error_message(), HasSubstr("at most 253"));
  std::vector<std::string> out;
  EXPECT_EQ(RunPsctl({"--coordinator=" + coordinator, "status"}, &out), 1) << "no shard yet";
  ASSERT_FALSE(out.empty()) << "psctl status printed no view";
  EXPECT_THAT(out[0], HasSubstr("INCOMPLETE"));

  shard.set_address("127.0.0.1:5000");  // only announced, never dialled
  s = Call(stub.get(), &coord::Coordinator::Stub::Register, shard, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  out.clear();
  EXPECT_EQ(RunPsctl({"--coordinator=" + coordinator, "status"}, &out), 0)
      << absl::StrJoin(out, "\n");
  for (auto& p : processes) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
}

// ps_server's and ps_worker's --coordinator (and ps_worker's --ps) are checked at start as
// psctl's are: exit 2 naming the flag, instead of a minute of retrying a port nobody named.
TEST(CoordinatorFlagTest, AShardOrWorkerGivenAnAddressThatIsNotHostPortExitsSayingSo) {
  struct Case {
    std::vector<std::string> argv;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"server/ps/ps_server", "--port=0", "--coordinator=localhost:99999"},
            " E ps_server --coordinator 'localhost:99999' has port 99999, outside 1-65535"},
           {{"worker/ps_worker", "--coordinator=localhost", "--rank=0", "--world=1"},
            " E ps_worker --coordinator 'localhost' has no port"},
           {{"worker/ps_worker", "--ps=127.0.0.1:1,http://127.0.0.1:2", "--rank=0", "--world=1"},
            " E ps_worker --ps 'http://127.0.0.1:2' has a scheme ('http://')"},
       }) {
    std::string command;
    for (const std::string& a : c.argv) absl::StrAppend(&command, " '", a, "'");
    std::vector<std::string> out;
    EXPECT_EQ(RunToExit({"/bin/sh", "-c", command + " 2>&1"}, &out), 2) << command;
    EXPECT_THAT(absl::StrJoin(out, "\n"), HasSubstr(c.says)) << command;
    EXPECT_THAT(absl::StrJoin(out, "\n"), HasSubstr("give HOST:PORT")) << command;
  }
}

TEST(CoordinatorModeFlagTest, StartsInTheGivenModeAndRefusesPsWithoutShards) {
  std::vector<testing::Subprocess> processes;
  const std::string no_shards = StartCoordinator({"--num_shards=0", "--num_workers=1"}, &processes);
  ASSERT_FALSE(no_shards.empty());
  auto stub = coord::Coordinator::NewStub(
      grpc::CreateChannel(no_shards, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(GetView(stub.get()).mode(), coord::ALLREDUCE) << "the default without shards";
  coord::SwitchModeRequest to_ps;
  to_ps.set_mode(coord::PS);
  coord::SwitchModeResponse resp;
  grpc::Status s = Call(stub.get(), &coord::Coordinator::Stub::SwitchMode, to_ps, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("--num_shards=0"));
  std::vector<std::string> out;
  EXPECT_EQ(RunPsctl({"--coordinator=" + no_shards, "switch-mode", "--mode=ps"}, &out), 1);

  const std::string fsdp =
      StartCoordinator({"--num_shards=0", "--num_workers=1", "--mode=fsdp"}, &processes);
  ASSERT_FALSE(fsdp.empty());
  auto fsdp_stub =
      coord::Coordinator::NewStub(grpc::CreateChannel(fsdp, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(GetView(fsdp_stub.get()).mode(), coord::FSDP);

  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--num_shards=0", "--mode=ps"}, {"--num_shards=1", "--mode=horovod"}}) {
    std::vector<std::string> argv = {"server/coordinator/ps_coordinator", "--port=0"};
    argv.insert(argv.end(), bad.begin(), bad.end());
    auto c = testing::Subprocess::Start(argv);
    ASSERT_TRUE(c.ok());
    auto status = c->Wait(absl::Seconds(60));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << absl::StrJoin(bad, " ");
  }
  for (auto& p : processes) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
}

}  // namespace
}  // namespace pscluster
