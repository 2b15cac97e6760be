// Recovery with real processes: a coordinator, 2 shards with snapshots and 2 workers train
// (synthetic data). A shard killed with SIGKILL after a checkpoint is restarted with
// --restore=latest; a worker killed in the middle of ALLREDUCE training (inside a
// collective) is replaced. Either way the others stop with an error naming what failed,
// wait, roll every shard back to the checkpoint, load it into the current mode and finish.
// Determinism: the final parameters are bitwise those of an uninterrupted run.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace pscluster {
namespace {

constexpr int kShards = 2, kWorkers = 2;
constexpr int kStepsPerEpoch = 20000 / (32 * kWorkers);  // --synthetic=20000 --batch_size=32

std::string AddressIn(const std::string& line) {
  std::string a = line.substr(line.find("listening on ") + 13);
  return a.substr(0, a.find(' '));
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// One cluster run in its own directory.
class Cluster {
 public:
  // coordinator_checkpoints: the coordinator checkpoints every 100 steps and on a better
  // metric; otherwise rank 0 snapshots every epoch.
  // mode: the workers' training mode (the coordinator's --mode); switches: "STEP:MODE"
  // scheduled with psctl before the workers start.
  explicit Cluster(const std::string& dir, bool coordinator_checkpoints = false,
                   const std::string& mode = "ps", const std::vector<std::string>& switches = {})
      : dir_(dir), mode_(mode), coordinator_checkpoints_(coordinator_checkpoints) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::vector<std::string> coordinator = {
        "server/coordinator/ps_coordinator",    "--port=0",
        absl::StrCat("--num_shards=", kShards), absl::StrCat("--num_workers=", kWorkers),
        "--heartbeat_timeout_ms=500",           "--mode=" + mode};
    if (coordinator_checkpoints) {
      coordinator.push_back("--data_dir=" + dir + "/coordinator");
      coordinator.push_back("--checkpoint_every_steps=100");
    }
    auto c = testing::Subprocess::Start(coordinator);
    EXPECT_TRUE(c.ok());
    coordinator_ = AddressIn(c->WaitForLine("listening on", absl::Seconds(60)).value_or(""));
    processes_.push_back(*std::move(c));
    for (int s = 0; s < kShards; ++s) StartShard(s, false);
    for (const std::string& sw : switches) {
      auto psctl = testing::Subprocess::Start(
          {"tools/psctl/psctl", "--coordinator=" + coordinator_, "switch-mode",
           "--mode=" + sw.substr(sw.find(':') + 1), "--at_step=" + sw.substr(0, sw.find(':'))});
      EXPECT_TRUE(psctl.ok());
      auto status = psctl->Wait(absl::Seconds(30));
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << sw;
    }
    for (int r = 0; r < kWorkers; ++r) StartWorker(r);
  }

  // Starts (or, after a kill, replaces) worker r.
  void StartWorker(int r) {
    auto w = testing::Subprocess::Start(
        {"worker/ps_worker", "--coordinator=" + coordinator_, absl::StrCat("--rank=", r),
         absl::StrCat("--world=", kWorkers), "--synthetic=20000", "--layers=20,32,4", "--epochs=4",
         "--batch_size=32", "--lr=0.01",
         coordinator_checkpoints_ ? "--snapshot_every_epochs=0" : "--snapshot_every_epochs=1",
         "--collective_timeout=20s", "--progress_every=1s",
         absl::StrCat("--summary_json=", dir_, "/worker", r, ".json")});
    EXPECT_TRUE(w.ok());
    worker_[r] = workers_.size();
    workers_.push_back(*std::move(w));
  }
  ~Cluster() {
    for (auto& p : processes_) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  }

  void StartShard(int s, bool restore) {
    std::vector<std::string> argv = {
        "server/ps/ps_server",           "--port=0",
        absl::StrCat("--shard_id=", s),  absl::StrCat("--num_shards=", kShards),
        "--coordinator=" + coordinator_, "--data_dir=" + dir_ + "/ckpt"};
    if (restore) argv.push_back("--restore=latest");
    auto p = testing::Subprocess::Start(argv);
    EXPECT_TRUE(p.ok());
    EXPECT_TRUE(p->WaitForLine("registered with the coordinator", absl::Seconds(60)).ok());
    shard_[s] = processes_.size();
    processes_.push_back(*std::move(p));
  }

  testing::Subprocess& coordinator() { return processes_[0]; }
  testing::Subprocess& shard(int s) { return processes_[shard_[s]]; }
  testing::Subprocess& worker(int r) { return workers_[worker_[r]]; }

  // Waits for every worker to finish; returns their summaries.
  std::vector<std::string> Finish() {
    std::vector<std::string> out;
    for (int r = 0; r < kWorkers; ++r) {
      auto status = worker(r).Wait(absl::Minutes(5));
      EXPECT_TRUE(status.ok()) << status.status();
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << "worker " << r << " failed";
      out.push_back(ReadFile(absl::StrCat(dir_, "/worker", r, ".json")));
    }
    return out;
  }

 private:
  std::string dir_, mode_, coordinator_;
  bool coordinator_checkpoints_;
  std::vector<testing::Subprocess> processes_;
  std::deque<testing::Subprocess> workers_;  // replacements are appended
  std::map<int, size_t> shard_, worker_;
};

std::string Field(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\": ");
  if (at == std::string::npos) return "";
  at += key.size() + 4;
  size_t end = json[at] == '[' ? json.find("]]", at) : json.find_first_of(",}", at);
  if (json[at] == '[' && json.compare(at, 2, "[]") == 0) return "[]";
  return json.substr(at, end - at + (json[at] == '[' ? 2 : 0));
}

TEST(RecoveryTest, KilledShardIsRestoredAndTrainingEndsBitwiseAsIfUninterrupted) {
  std::vector<std::string> clean = Cluster(::testing::TempDir() + "/clean").Finish();
  ASSERT_EQ(Field(clean[0], "rollbacks"), "[]") << clean[0];

  std::vector<std::string> recovered;
  {
    Cluster cluster(::testing::TempDir() + "/killed");
    // Once the coordinator has recorded the first checkpoint, kill shard 1, then bring it back.
    ASSERT_TRUE(cluster.coordinator()
                    .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                                 absl::Minutes(2))
                    .ok());
    ASSERT_TRUE(cluster.shard(1).Stop(SIGKILL, absl::Seconds(20)).ok());
    cluster.StartShard(1, /*restore=*/true);
    recovered = cluster.Finish();
  }
  for (int r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE(recovered[r]);
    const std::string rollbacks = Field(recovered[r], "rollbacks");
    EXPECT_NE(rollbacks, "[]") << "worker " << r << " never rolled back";
    EXPECT_THAT(rollbacks, ::testing::HasSubstr(absl::StrCat(", ", kStepsPerEpoch, "]")))
        << "the rollback did not go to the checkpoint of step " << kStepsPerEpoch;
    EXPECT_EQ(Field(recovered[r], "param_crc32c"), Field(clean[r], "param_crc32c"))
        << "the recovered run's final parameters differ from the uninterrupted run's";
    EXPECT_GT(std::stod(Field(recovered[r], "test_accuracy")), 0.9);
  }
}

TEST(RecoveryTest, WorkerKilledInACollectiveIsReplacedAndTrainingEndsBitwiseAsIfUninterrupted) {
  const std::string dir = ::testing::TempDir() + "/worker_killed";
  std::vector<std::string> clean = Cluster(dir + "/clean", false, "allreduce").Finish();
  ASSERT_EQ(Field(clean[0], "rollbacks"), "[]") << clean[0];

  std::vector<std::string> recovered;
  {
    Cluster cluster(dir + "/killed", false, "allreduce");
    ASSERT_TRUE(cluster.coordinator()
                    .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                                 absl::Minutes(2))
                    .ok());
    // Every step is an all-reduce: rank 1 dies inside one (or between two).
    ASSERT_TRUE(cluster.worker(1).Stop(SIGKILL, absl::Seconds(20)).ok());
    auto failed = cluster.worker(0).WaitForLine("failed (", absl::Minutes(1));
    ASSERT_TRUE(failed.ok()) << "rank 0 did not notice rank 1's death: " << failed.status();
    EXPECT_THAT(*failed, ::testing::ContainsRegex("(to|from) rank 1"));
    auto named = cluster.worker(0).WaitForLine("rank 1 is down", absl::Minutes(1));
    ASSERT_TRUE(named.ok()) << "rank 0 did not name the failed worker: " << named.status();
    std::printf("rank 0 said: %s\nrank 0 said: %s\n", failed->c_str(), named->c_str());
    cluster.StartWorker(1);
    recovered = cluster.Finish();
  }
  SCOPED_TRACE(recovered[0]);
  EXPECT_THAT(Field(recovered[0], "rollbacks"),
              ::testing::HasSubstr(absl::StrCat(", ", kStepsPerEpoch, "]")))
      << "rank 0 did not roll back to the checkpoint of step " << kStepsPerEpoch;
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(Field(recovered[r], "param_crc32c"), Field(clean[r], "param_crc32c"))
        << "rank " << r << ": the recovered run's final parameters differ from the clean run's";
    EXPECT_GT(std::stod(Field(recovered[r], "test_accuracy")), 0.9);
  }
}

// A checkpoint taken in one mode restores in another: the cluster trains in FSDP, takes
// the checkpoint of step kStepsPerEpoch, switches to PIPELINE at kStepsPerEpoch + 10; a
// worker killed after the switch makes everyone roll back to the FSDP-mode checkpoint,
// which they (the replacement too) load into the cluster's current mode, PIPELINE.
TEST(RecoveryTest, CheckpointTakenInOneModeRestoresInAnother) {
  std::vector<std::string> recovered;
  {
    Cluster cluster(::testing::TempDir() + "/cross_mode", false, "fsdp",
                    {absl::StrCat(kStepsPerEpoch + 10, ":pipeline")});
    ASSERT_TRUE(cluster.coordinator()
                    .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                                 absl::Minutes(2))
                    .ok());
    ASSERT_TRUE(
        cluster.worker(0).WaitForLine("switched from fsdp to pipeline", absl::Minutes(1)).ok());
    ASSERT_TRUE(cluster.worker(1).Stop(SIGKILL, absl::Seconds(20)).ok());
    ASSERT_TRUE(cluster.worker(0).WaitForLine("rank 1 is down", absl::Minutes(1)).ok());
    cluster.StartWorker(1);
    recovered = cluster.Finish();
  }
  SCOPED_TRACE(recovered[0]);
  EXPECT_THAT(Field(recovered[0], "rollbacks"),
              ::testing::HasSubstr(absl::StrCat(", ", kStepsPerEpoch, "]")));
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_THAT(recovered[r], ::testing::HasSubstr("\"final_mode\": \"pipeline\""));
    EXPECT_GT(std::stod(Field(recovered[r], "test_accuracy")), 0.9);
  }
}

TEST(RecoveryTest, CoordinatorCheckpointsTheClusterAndReloadsItsManifestOnRestart) {
  const std::string dir = ::testing::TempDir() + "/coordinated";
  {
    Cluster cluster(dir, /*coordinator_checkpoints=*/true);
    cluster.Finish();
  }
  const std::string listed = ReadFile(dir + "/coordinator/checkpoints.json");
  ASSERT_THAT(listed, ::testing::MatchesRegex("\\[[0-9]+(, [0-9]+)*\\]\n"))
      << "checkpoints.json of " << dir << " holds '" << listed << "'";
  const int64_t last =
      std::stoll(listed.substr(listed.rfind(' ') == std::string::npos ? 1 : listed.rfind(' ') + 1));
  EXPECT_GT(last, 0);
  EXPECT_LE(last, 4 * kStepsPerEpoch);
  // Every listed checkpoint is a snapshot the shards hold: restoring the last one works.
  auto shard = testing::Subprocess::Start(
      {"server/ps/ps_server", "--port=0", "--shard_id=0", absl::StrCat("--num_shards=", kShards),
       "--data_dir=" + dir + "/ckpt", absl::StrCat("--restore=", last)});
  ASSERT_TRUE(shard.ok());
  EXPECT_TRUE(
      shard->WaitForLine(absl::StrCat("restored snapshot of step ", last), absl::Seconds(60)).ok());
  shard->Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  // A restarted coordinator reloads its manifest.
  auto coordinator = testing::Subprocess::Start(
      {"server/coordinator/ps_coordinator", "--port=0", "--data_dir=" + dir + "/coordinator"});
  ASSERT_TRUE(coordinator.ok());
  auto line = coordinator->WaitForLine("manifest lists", absl::Seconds(60));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, ::testing::HasSubstr(absl::StrCat("the last of step ", last)));
  coordinator->Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
}

}  // namespace
}  // namespace pscluster
