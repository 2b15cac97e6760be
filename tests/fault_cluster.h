// A whole cluster of real processes for recovery and fault tests: a coordinator, 2 shards
// with snapshots and 2 workers training on synthetic data, each in this test's directory.
// Faults are injected from the test (SIGKILL, SIGSTOP/SIGCONT, restarts) and the run is
// waited for with bounded waits; summaries are read back as JSON text.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"
#include "tests/summary_json.h"

namespace pscluster::testing {

inline constexpr int kShards = 2, kWorkers = 2;
inline constexpr int kStepsPerEpoch = 20000 / (32 * kWorkers);  // --synthetic=20000 --batch_size=32

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct ClusterOptions {
  // The coordinator checkpoints every 100 steps and on a better metric (and keeps its state
  // in a --data_dir, so it can be restarted); otherwise rank 0 snapshots every epoch.
  bool coordinator_checkpoints = false;
  std::string mode = "ps";               // the coordinator's --mode
  std::vector<std::string> switches;     // "STEP:MODE", scheduled before the workers start
  std::vector<std::string> shard_args;   // extra ps_server flags
  std::vector<std::string> worker_args;  // extra ps_worker flags (before StartWorker's own)
  int epochs = 4;
  // The workers' --progress_every. A test that must act mid-training shortens it: an epoch
  // of this model can take well under a second. (Not 0: a line per step fills the pipe of
  // a worker whose output the test does not read, and blocks it.)
  std::string progress_every = "1s";
  int replicas = 1;  // the coordinator's --replicas: copies of each shard
  int heartbeat_timeout_ms = 2000;
  int workers = kWorkers;  // started at once (0: a test that calls the shards itself)
};

class Cluster {
 public:
  explicit Cluster(const std::string& dir, ClusterOptions options)
      : dir_(dir), options_(std::move(options)) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    StartCoordinator("0");
    for (int s = 0; s < kShards; ++s) {
      for (int r = 0; r < options_.replicas; ++r) StartShard(s, false, r);
    }
    for (const std::string& sw : options_.switches) {
      auto psctl = Subprocess::Start({"tools/psctl/psctl", "--coordinator=" + coordinator_,
                                      "switch-mode", "--mode=" + sw.substr(sw.find(':') + 1),
                                      "--at_step=" + sw.substr(0, sw.find(':'))});
      EXPECT_TRUE(psctl.ok());
      auto status = psctl->Wait(absl::Seconds(30));
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << sw;
    }
    for (int r = 0; r < options_.workers; ++r) StartWorker(r);
  }
  // The older signature: (dir, coordinator_checkpoints, mode, switches).
  explicit Cluster(const std::string& dir, bool coordinator_checkpoints = false,
                   const std::string& mode = "ps", const std::vector<std::string>& switches = {})
      : Cluster(dir, ClusterOptions{coordinator_checkpoints, mode, switches}) {}

  ~Cluster() {
    for (auto& p : workers_) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
    for (auto& p : processes_) p.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  }

  // (Re)starts the coordinator: port "0" picks one; a restart reuses the first one.
  void StartCoordinator(const std::string& port) {
    std::vector<std::string> argv = {
        "server/coordinator/ps_coordinator",
        "--port=" + port,
        absl::StrCat("--num_shards=", kShards),
        absl::StrCat("--num_workers=", kWorkers),
        absl::StrCat("--heartbeat_timeout_ms=", options_.heartbeat_timeout_ms),
        absl::StrCat("--replicas=", options_.replicas),
        "--mode=" + options_.mode};
    if (options_.coordinator_checkpoints) {
      argv.push_back("--data_dir=" + dir_ + "/coordinator");
      argv.push_back("--checkpoint_every_steps=100");
    }
    auto c = Subprocess::Start(argv);
    EXPECT_TRUE(c.ok());
    coordinator_ = ListeningAddress(c->WaitForLine("listening on", absl::Seconds(60)).value_or(""))
                       .value_or("");
    coordinator_index_ = processes_.size();
    processes_.push_back(*std::move(c));
  }
  // SIGKILL of the coordinator, then a restart with the same flags and port.
  void KillAndRestartCoordinator() {
    ASSERT_TRUE(coordinator().Stop(SIGKILL, absl::Seconds(20)).ok());
    StartCoordinator(coordinator_.substr(coordinator_.rfind(':') + 1));
  }

  // Starts (or, after a kill, replaces) worker r; `extra` flags come last (and win).
  void StartWorker(int r, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {"worker/ps_worker",
                                     "--coordinator=" + coordinator_,
                                     absl::StrCat("--rank=", r),
                                     absl::StrCat("--world=", kWorkers),
                                     "--synthetic=20000",
                                     "--layers=20,32,4",
                                     absl::StrCat("--epochs=", options_.epochs),
                                     "--batch_size=32",
                                     "--lr=0.01",
                                     options_.coordinator_checkpoints ? "--snapshot_every_epochs=0"
                                                                      : "--snapshot_every_epochs=1",
                                     "--collective_timeout=20s",
                                     "--progress_every=" + options_.progress_every,
                                     absl::StrCat("--summary_json=", dir_, "/worker", r, ".json")};
    argv.insert(argv.end(), options_.worker_args.begin(), options_.worker_args.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto w = Subprocess::Start(std::move(argv));
    EXPECT_TRUE(w.ok());
    worker_[r] = workers_.size();
    workers_.push_back(*std::move(w));
  }

  void StartShard(int s, bool restore, int replica = 0) {
    std::vector<std::string> argv = {"server/ps/ps_server",
                                     "--port=0",
                                     absl::StrCat("--shard_id=", s),
                                     absl::StrCat("--num_shards=", kShards),
                                     "--coordinator=" + coordinator_,
                                     "--data_dir=" + dir_ + "/ckpt",
                                     absl::StrCat("--replica=", replica)};
    argv.insert(argv.end(), options_.shard_args.begin(), options_.shard_args.end());
    if (restore) argv.push_back("--restore=latest");
    auto p = Subprocess::Start(argv);
    EXPECT_TRUE(p.ok());
    auto line = p->WaitForLine("registered with the coordinator", absl::Seconds(60));
    EXPECT_TRUE(line.ok());
    // "... registered with the coordinator at C as HOST:PORT"
    if (line.ok()) shard_address_[{s, replica}] = line->substr(line->rfind(' ') + 1);
    shard_[{s, replica}] = processes_.size();
    processes_.push_back(*std::move(p));
  }

  Subprocess& coordinator() { return processes_[coordinator_index_]; }
  const std::string& coordinator_address() const { return coordinator_; }
  Subprocess& shard(int s, int replica = 0) { return processes_[shard_[{s, replica}]]; }
  // Where replica `replica` of shard `s` serves.
  const std::string& shard_address(int s, int replica = 0) { return shard_address_[{s, replica}]; }
  Subprocess& worker(int r) { return workers_[worker_[r]]; }
  const std::string& dir() const { return dir_; }

  // Waits (bounded) for every worker to finish; returns their summaries.
  std::vector<std::string> Finish() {
    std::vector<std::string> out;
    for (int r = 0; r < kWorkers; ++r) {
      auto status = worker(r).Wait(absl::Minutes(5));
      EXPECT_TRUE(status.ok()) << status.status();
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << "worker " << r << " failed";
      out.push_back(ReadSummary(absl::StrCat(dir_, "/worker", r, ".json")));
    }
    return out;
  }

 private:
  std::string dir_;
  ClusterOptions options_;
  std::string coordinator_;
  size_t coordinator_index_ = 0;
  std::deque<Subprocess> processes_;             // coordinators (restarts appended) and shards
  std::deque<Subprocess> workers_;               // replacements are appended
  std::map<std::pair<int, int>, size_t> shard_;  // (shard, replica)
  std::map<std::pair<int, int>, std::string> shard_address_;
  std::map<int, size_t> worker_;
};

}  // namespace pscluster::testing
