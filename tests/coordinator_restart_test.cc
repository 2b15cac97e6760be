// The coordinator survives SIGKILL: a coordinator with --data_dir, 2 ps_server shards and
// 2 ps_worker processes train in PS mode with a switch to ALLREDUCE scheduled late in the
// run. Once the coordinator has recorded a checkpoint it is killed with SIGKILL and
// restarted with the same flags and port. The members keep retrying meanwhile; the
// restarted coordinator reloads its state (members and their incarnations, the switch
// schedule, the manifest), so the run completes, the switch happens at its step on both
// workers, and the checkpoint recorded before the kill is still listed.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/coordinator/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"
#include "tests/summary_json.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

// 20000 / (2 x 32) = 312 steps per epoch, 12 epochs; the kill comes at the first
// checkpoint (at least 100 steps in), the switch well after it.
constexpr int kSwitchStep = 3000, kSteps = 12 * 312;

// Every line a short-lived command prints, after it exited 0.
std::string Output(std::vector<std::string> argv) {
  absl::StatusOr<std::string> out = testing::OutputOf(std::move(argv));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.value_or("");
}

class CoordinatorRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // The coordinator on `port` (0: any); returns its address.
  std::string StartCoordinator(const std::string& port) {
    auto c = testing::Subprocess::Start(
        {"server/coordinator/ps_coordinator", "--port=" + port, "--num_shards=2", "--num_workers=2",
         "--mode=ps", "--heartbeat_timeout_ms=2000", "--data_dir=" + dir_ + "/coordinator",
         "--checkpoint_every_steps=100", "--keep_checkpoints=100"});
    EXPECT_TRUE(c.ok()) << c.status();
    auto line = c->WaitForLine("listening on", absl::Seconds(60));
    EXPECT_TRUE(line.ok()) << line.status();
    coordinator_.emplace(*std::move(c));
    if (!line.ok()) return "";
    return testing::ListeningAddress(*line).value_or("");
  }

  std::vector<std::string> Psctl(const std::string& address, std::vector<std::string> args) {
    args.insert(args.begin(), {"tools/psctl/psctl", "--coordinator=" + address});
    return args;
  }

  const std::string dir_ = ::testing::TempDir() + "/coordinator_restart";
  std::optional<testing::Subprocess> coordinator_;
};

TEST_F(CoordinatorRestartTest,
       RunCompletesSwitchHappensAndCheckpointsSurviveASigkillAndPsctlCheckpointsWhileTraining) {
  const std::string address = StartCoordinator("0");
  const std::string port = address.substr(address.rfind(':') + 1);
  std::vector<testing::Subprocess> shards, workers;
  for (int s = 0; s < 2; ++s) {
    auto p = testing::Subprocess::Start(
        {"server/ps/ps_server", "--port=0", absl::StrCat("--shard_id=", s), "--num_shards=2",
         "--coordinator=" + address, "--data_dir=" + dir_ + "/ckpt"});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p->WaitForLine("registered with the coordinator", absl::Seconds(60)).ok());
    shards.push_back(*std::move(p));
  }
  EXPECT_THAT(Output(Psctl(address, {"switch-mode", "--mode=allreduce",
                                     absl::StrCat("--at_step=", kSwitchStep)})),
              HasSubstr(absl::StrCat("scheduled at step ", kSwitchStep)));
  for (int r = 0; r < 2; ++r) {
    auto p = testing::Subprocess::Start(
        {"worker/ps_worker", "--coordinator=" + address, absl::StrCat("--rank=", r), "--world=2",
         "--synthetic=20000", "--layers=20,32,4", "--epochs=12", "--batch_size=32", "--lr=0.01",
         "--progress_every=1s", absl::StrCat("--summary_json=", dir_, "/worker", r, ".json")});
    ASSERT_TRUE(p.ok());
    workers.push_back(*std::move(p));
  }

  // Kill once a checkpoint is complete (the coordinator says so after its manifest is
  // written), and restart with the same flags on the same port.
  auto line = coordinator_->WaitForLine("checkpoint of step", absl::Minutes(3));
  ASSERT_TRUE(line.ok()) << line.status();
  int64_t kept = -1;
  const std::string after = line->substr(line->find("checkpoint of step ") + 19);
  ASSERT_TRUE(absl::SimpleAtoi(after.substr(0, after.find(' ')), &kept)) << *line;
  ASSERT_LT(kept, kSwitchStep) << "the kill must come before the switch";
  ASSERT_TRUE(coordinator_->Stop(SIGKILL, absl::Seconds(20)).ok());
  coordinator_.reset();
  ASSERT_EQ(StartCoordinator(port), address);
  // An operator's checkpoint while the workers train goes through the coordinator too.
  const std::string asked = Output(Psctl(address, {"checkpoint"}));
  int64_t on_demand = -1;
  ASSERT_TRUE(absl::SimpleAtoi(
      asked.substr(asked.find("checkpoint of step ") + 19,
                   asked.find(" is complete") - asked.find("checkpoint of step ") - 19),
      &on_demand))
      << asked;
  // The restarted coordinator reports the switch done only if it was still pending when
  // its predecessor died: the schedule survived, and the workers took it from the new one.
  EXPECT_TRUE(
      coordinator_
          ->WaitForLine(absl::StrCat("switch 1 done: ps -> allreduce at step ", kSwitchStep),
                        absl::Minutes(3))
          .ok());

  for (int r = 0; r < 2; ++r) {
    auto status = workers[r].Wait(absl::Minutes(5));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "worker " << r;
    const std::string json = testing::ReadSummary(absl::StrCat(dir_, "/worker", r, ".json"));
    SCOPED_TRACE(json);
    EXPECT_THAT(json, HasSubstr(absl::StrCat("{\"step\": ", kSwitchStep,
                                             ", \"from\": \"ps\", \"to\": \"allreduce\"")));
    EXPECT_THAT(json, HasSubstr("\"final_mode\": \"allreduce\""));
    EXPECT_THAT(json, HasSubstr(absl::StrCat("\"steps\": ", kSteps)));
  }
  std::set<std::string> listed;
  for (absl::string_view row :
       absl::StrSplit(Output(Psctl(address, {"checkpoints"})), '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> cells = absl::StrSplit(row, ' ', absl::SkipEmpty());
    if (!cells.empty()) listed.insert(std::string(cells[0]));
  }
  EXPECT_EQ(listed.count(absl::StrCat(kept)), 1) << "the checkpoint before the kill was forgotten";
  EXPECT_EQ(listed.count(absl::StrCat(on_demand)), 1) << "psctl checkpoint's is not listed";
  const std::string status = Output(Psctl(address, {"status"}));
  EXPECT_THAT(status, HasSubstr("mode allreduce")) << status;
  for (auto& s : shards) s.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  coordinator_->Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
}

// A coordinator restarted without its state (here: a fresh data dir) does not know the
// members: their heartbeats are answered NOT_FOUND and they register again by themselves.
TEST_F(CoordinatorRestartTest, MembersRegisterAgainWithACoordinatorThatLostThem) {
  const std::string address = StartCoordinator("0");
  const std::string port = address.substr(address.rfind(':') + 1);
  std::vector<std::unique_ptr<CoordinatorClient>> members;
  for (int s = 0; s < 2; ++s) {
    CoordinatorClientOptions o;
    o.coordinator = address;
    o.role = coord::SHARD;
    o.id = s;
    o.address = absl::StrCat("127.0.0.1:", 6000 + s);  // only announced, never dialled
    auto c = CoordinatorClient::Register(o);
    ASSERT_TRUE(c.ok()) << c.status();
    members.push_back(*std::move(c));
  }
  for (int r = 0; r < 2; ++r) {
    CoordinatorClientOptions o;
    o.coordinator = address;
    o.role = coord::WORKER;
    o.id = r;
    o.address = absl::StrCat("pid:", r);
    auto c = CoordinatorClient::Register(o);
    ASSERT_TRUE(c.ok()) << c.status();
    members.push_back(*std::move(c));
  }
  ASSERT_TRUE(coordinator_->Stop(SIGKILL, absl::Seconds(20)).ok());
  coordinator_.reset();
  std::filesystem::remove_all(dir_ + "/coordinator");  // its state is gone
  ASSERT_EQ(StartCoordinator(port), address);
  // Blocks (retrying while the port is closed) until all four registered again.
  auto view = members[2]->AwaitView(0, /*complete=*/true, absl::Seconds(60));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->members_size(), 4);
  EXPECT_EQ(view->shard_addresses(1), "127.0.0.1:6001");
  EXPECT_TRUE(members[3]->ReportProgress(view->version(), 5, 1.0, 0).ok())
      << "a worker's calls use its new incarnation";
}

}  // namespace
}  // namespace pscluster
