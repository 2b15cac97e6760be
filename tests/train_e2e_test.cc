// End to end through the real binaries: two ps_server shards and two ps_worker processes
// train an MLP (BSP, server-side Adam) on a synthetic problem; the loss ends well below
// its start and the held-out accuracy is high. Fashion-MNIST itself runs in
// deploy/local_cluster.sh; its reader is tested in worker/data.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "gmock/gmock.h"
#include "tests/ps_cluster_fixture.h"
#include "tests/summary_json.h"

namespace pscluster {
namespace {

// The number after "key": in a flat JSON object (the worker's summary).
double JsonNumber(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\":");
  EXPECT_NE(at, std::string::npos) << key << " missing in " << json;
  return at == std::string::npos ? NAN : std::stod(json.substr(at + key.size() + 3));
}

// The address a process prints once it serves ("... listening on HOST:PORT ...").
std::string ListeningOn(testing::Subprocess& p) {
  auto line = p.WaitForLine("listening on", absl::Seconds(60));
  EXPECT_TRUE(line.ok()) << line.status();
  return line.ok() ? testing::ListeningAddress(*line).value_or("") : "";
}

// Waits for a worker to end; it must exit 0. Returns its summary JSON.
std::string FinishedSummary(testing::Subprocess& worker, const std::string& summary_path) {
  auto status = worker.Wait(absl::Minutes(5));
  EXPECT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << worker.name();
  return testing::ReadSummary(summary_path);
}

// A coordinator checkpointing into dir/coordinator (with `flags` besides) and 2 shards
// snapshotting into dir/ckpt, registered with it; killed when the struct goes.
struct CheckpointingCluster {
  std::vector<testing::Subprocess> processes;  // the coordinator, then the shards
  std::string coordinator;
};

void StartCheckpointingCluster(const std::string& dir, const std::vector<std::string>& flags,
                               CheckpointingCluster* c) {
  std::vector<std::string> argv = {"server/coordinator/ps_coordinator", "--port=0",
                                   "--num_shards=2", "--num_workers=2",
                                   "--data_dir=" + dir + "/coordinator"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto coordinator = testing::Subprocess::Start(argv);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  c->coordinator = ListeningOn(*coordinator);
  c->processes.push_back(*std::move(coordinator));
  for (int s = 0; s < 2; ++s) {
    auto p = testing::Subprocess::Start(
        {"server/ps/ps_server", "--port=0", absl::StrCat("--shard_id=", s), "--num_shards=2",
         "--coordinator=" + c->coordinator, "--data_dir=" + dir + "/ckpt"});
    ASSERT_TRUE(p.ok()) << p.status();
    ListeningOn(*p);
    c->processes.push_back(*std::move(p));
  }
}

class TrainE2eTest : public PsClusterTest {
 protected:
  // Two workers with `flags` train the MLP on the two shards; the loss ends well below its
  // start and the held-out accuracy is high.
  void TrainTwoWorkers(const std::vector<std::string>& flags) {
    const std::string dir = ::testing::TempDir();
    const std::string ps = absl::StrCat(addresses_[0], ",", addresses_[1]);
    std::vector<testing::Subprocess> workers;
    for (int r = 0; r < kWorkers; ++r) {
      std::vector<std::string> argv = {"worker/ps_worker",
                                       "--ps=" + ps,
                                       absl::StrCat("--rank=", r),
                                       absl::StrCat("--world=", kWorkers),
                                       "--synthetic=4000",
                                       "--layers=20,32,4",
                                       "--epochs=3",
                                       "--batch_size=32",
                                       "--lr=0.01",
                                       "--progress_every=1s",
                                       absl::StrCat("--summary_json=", dir, "/worker", r, ".json")};
      argv.insert(argv.end(), flags.begin(), flags.end());
      auto p = testing::Subprocess::Start(argv);
      ASSERT_TRUE(p.ok()) << p.status();
      workers.push_back(*std::move(p));
    }
    for (auto& w : workers) {
      auto line = w.WaitForLine("done:", absl::Minutes(5));
      ASSERT_TRUE(line.ok()) << line.status();
      auto status = w.Wait(absl::Minutes(1));
      ASSERT_TRUE(status.ok()) << status.status();
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << w.name();
    }
    for (int r = 0; r < kWorkers; ++r) {
      const std::string json = testing::ReadSummary(absl::StrCat(dir, "/worker", r, ".json"));
      EXPECT_LT(JsonNumber(json, "final_loss"), 0.5 * std::log(4.0)) << json;
      EXPECT_GT(JsonNumber(json, "test_accuracy"), 0.9) << json;
      EXPECT_EQ(JsonNumber(json, "steps"), 3 * (4000 / (32 * kWorkers))) << json;
    }
  }
};

TEST_F(TrainE2eTest, TwoWorkersOnTwoShardsDriveTheLossFarBelowItsStart) { TrainTwoWorkers({}); }

// SSP(1): each worker's push/pull runs on its communication thread while the next step
// computes (--overlap_push, on by default); the run ends and learns as well.
TEST_F(TrainE2eTest, TwoWorkersOverlappingTheirPushesUnderSspLearnAsWell) {
  TrainTwoWorkers({"--consistency=ssp:1"});
}

// ps_worker --model=embedding through the real binaries: the embedding table is a sparse
// table on the shards, its rows pulled and pushed per batch; the model learns.
TEST_F(TrainE2eTest, TheEmbeddingModelTrainsInPsModeThroughTheBinaries) {
  const std::string dir = ::testing::TempDir();
  const std::string ps = absl::StrCat(addresses_[0], ",", addresses_[1]);
  std::vector<testing::Subprocess> workers;
  for (int r = 0; r < kWorkers; ++r) {
    auto p = testing::Subprocess::Start(
        {"worker/ps_worker", "--ps=" + ps, "--model=embedding", absl::StrCat("--rank=", r),
         absl::StrCat("--world=", kWorkers), "--synthetic=4000", "--layers=20,32,4", "--epochs=2",
         "--batch_size=32", "--lr=0.01", "--progress_every=1s",
         absl::StrCat("--summary_json=", dir, "/emb", r, ".json")});
    ASSERT_TRUE(p.ok()) << p.status();
    workers.push_back(*std::move(p));
  }
  for (int r = 0; r < kWorkers; ++r) {
    const std::string json = FinishedSummary(workers[r], absl::StrCat(dir, "/emb", r, ".json"));
    EXPECT_GT(JsonNumber(json, "test_accuracy"), 0.9) << json;
  }
  auto described = clients_[0]->DescribeTable(5);  // fc0, fc1 weight and bias, then emb0
  ASSERT_TRUE(described.ok()) << described.status();
  uint64_t rows = 0;
  for (const auto& info : *described) rows += info.num_rows();
  EXPECT_EQ((*described)[0].spec().name(), "emb0");
  EXPECT_GT(rows, 0u);
}

// ALLREDUCE mode through the real binaries: a coordinator with no shards for the
// rendezvous, two workers averaging gradients over Gloo.
TEST(AllReduceE2eTest, TwoWorkersTrainThroughTheCoordinatorRendezvous) {
  auto c = testing::Subprocess::Start(
      {"server/coordinator/ps_coordinator", "--port=0", "--num_shards=0", "--num_workers=2"});
  ASSERT_TRUE(c.ok());
  const std::string coordinator = ListeningOn(*c);
  const std::string dir = ::testing::TempDir();
  std::vector<testing::Subprocess> workers;
  for (int r = 0; r < 2; ++r) {
    auto p = testing::Subprocess::Start(
        {"worker/ps_worker", "--mode=allreduce", "--coordinator=" + coordinator,
         absl::StrCat("--rank=", r), "--world=2", "--synthetic=4000", "--layers=20,32,4",
         "--epochs=3", "--batch_size=32", "--lr=0.01",
         absl::StrCat("--summary_json=", dir, "/allreduce", r, ".json")});
    ASSERT_TRUE(p.ok());
    workers.push_back(*std::move(p));
  }
  for (int r = 0; r < 2; ++r) {
    const std::string json =
        FinishedSummary(workers[r], absl::StrCat(dir, "/allreduce", r, ".json"));
    EXPECT_GT(JsonNumber(json, "test_accuracy"), 0.9) << json;
  }
  c->Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
}

// Live switching through the real binaries: a coordinator, two shards and two workers;
// psctl schedules PS -> ALLREDUCE -> FSDP -> PIPELINE -> PS before training starts; every
// switch happens at its step on both workers, the coordinator records them, and training
// finishes with a high held-out accuracy. A switch to tensor mode, which the MLP cannot
// run, is refused.
TEST(SwitchE2eTest, PsAllReduceFsdpPipelineAndBackToPsFinishes) {
  const std::string dir = ::testing::TempDir() + "/switch";
  CheckpointingCluster cluster;
  ASSERT_NO_FATAL_FAILURE(
      StartCheckpointingCluster(dir, {"--mode=ps", "--checkpoint_every_steps=62"}, &cluster));
  const std::string coordinator = cluster.coordinator;
  std::vector<testing::Subprocess> workers;
  auto psctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"tools/psctl/psctl", "--coordinator=" + coordinator});
    absl::StatusOr<std::string> out = testing::OutputOf(std::move(args));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.value_or("");
  };
  const std::vector<std::pair<int, std::string>> plan = {
      {100, "allreduce"}, {200, "fsdp"}, {300, "pipeline"}, {400, "ps"}};
  for (const auto& [step, mode] : plan) {
    EXPECT_THAT(psctl({"switch-mode", "--mode=" + mode, absl::StrCat("--at_step=", step)}),
                ::testing::HasSubstr(absl::StrCat("scheduled at step ", step)));
  }
  for (int r = 0; r < 2; ++r) {  // 4000 examples / (2 x 32) = 62 steps per epoch
    auto p = testing::Subprocess::Start(
        {"worker/ps_worker", "--coordinator=" + coordinator, absl::StrCat("--rank=", r),
         "--world=2", "--synthetic=4000", "--layers=20,32,16,4", "--epochs=8", "--batch_size=32",
         "--lr=0.01", "--micro_batches=4",
         absl::StrCat("--summary_json=", dir, "/worker", r, ".json")});
    ASSERT_TRUE(p.ok());
    workers.push_back(*std::move(p));
  }
  for (int r = 0; r < 2; ++r) {
    const std::string json = FinishedSummary(workers[r], absl::StrCat(dir, "/worker", r, ".json"));
    SCOPED_TRACE(json);
    EXPECT_GT(JsonNumber(json, "test_accuracy"), 0.9);
    EXPECT_THAT(json, ::testing::HasSubstr("\"final_mode\": \"ps\""));
    std::string from = "ps";
    for (const auto& [step, mode] : plan) {
      EXPECT_THAT(json, ::testing::HasSubstr(absl::StrCat("{\"step\": ", step, ", \"from\": \"",
                                                          from, "\", \"to\": \"", mode, "\"")));
      from = mode;
    }
  }
  // The workers registered their MLP's limits: a switch to a mode it cannot run is refused
  // by the coordinator (not scheduled to stop the workers at the switch), saying why.
  absl::StatusOr<std::string> refused = testing::OutputOf(
      {"tools/psctl/psctl", "--coordinator=" + coordinator, "switch-mode", "--mode=tensor"});
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("wait status 256"))
      << "psctl's exit code 1: refused (its message, on stderr, is checked in "
         "cluster_state_switch_test)";
  const std::string status = psctl({"status"});
  EXPECT_THAT(status, ::testing::HasSubstr("ps"));
  EXPECT_THAT(status, ::testing::Not(::testing::HasSubstr("tensor"))) << "nothing scheduled";
  for (const auto& [step, mode] : plan) {
    EXPECT_THAT(status, ::testing::HasSubstr(absl::StrCat(step))) << "switch history";
  }
  for (auto p = cluster.processes.rbegin(); p != cluster.processes.rend(); ++p) {
    p->Stop(SIGTERM, absl::Seconds(20)).IgnoreError();  // the shards, then the coordinator
  }
}

// Rank 0's test accuracy at each epoch's end is filed under the checkpoint of that very
// step (the one rank 0 asks for before it evaluates), never under a later one the
// coordinator took while training went on; checkpoints every 100 steps interleave with them.
TEST(CheckpointE2eTest, AMetricIsFiledUnderTheCheckpointOfTheStepItWasMeasuredAt) {
  const std::string dir = ::testing::TempDir() + "/metric";
  CheckpointingCluster cluster;
  ASSERT_NO_FATAL_FAILURE(
      StartCheckpointingCluster(dir, {"--checkpoint_every_steps=100"}, &cluster));
  const std::string coordinator = cluster.coordinator;
  std::vector<testing::Subprocess> workers;
  // Epochs long enough (~1 s) that the coordinator's checkpoint loop (every 250 ms) sees a
  // metric while training goes on.
  constexpr int kStepsPerEpoch = 40000 / (2 * 32);
  for (int r = 0; r < 2; ++r) {
    auto p = testing::Subprocess::Start(
        {"worker/ps_worker", "--coordinator=" + coordinator, absl::StrCat("--rank=", r),
         "--world=2", "--synthetic=40000", "--layers=20,32,4", "--epochs=3", "--batch_size=32",
         "--lr=0.01", absl::StrCat("--summary_json=", dir, "/worker", r, ".json")});
    ASSERT_TRUE(p.ok());
    workers.push_back(*std::move(p));
  }
  std::vector<std::string> summaries;
  for (int r = 0; r < 2; ++r) {
    summaries.push_back(FinishedSummary(workers[r], absl::StrCat(dir, "/worker", r, ".json")));
  }
  // A run whose workers finished is reported finished, and psctl status exits 0 for it.
  absl::StatusOr<std::string> status =
      testing::OutputOf({"tools/psctl/psctl", "--coordinator=" + coordinator, "status"});
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(*status, ::testing::HasSubstr("FINISHED"));
  absl::StatusOr<std::string> listed =
      testing::OutputOf({"tools/psctl/psctl", "--coordinator=" + coordinator, "checkpoints"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  SCOPED_TRACE(*listed);
  int with_metric = 0;
  double final_metric = -1;
  std::istringstream lines(*listed);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    long long step = 0;
    std::string metric;
    if (!(fields >> step >> metric) || metric == "-") continue;  // the header, or no metric
    ++with_metric;
    EXPECT_EQ(step % kStepsPerEpoch, 0) << "metric " << metric << " filed under step " << step;
    if (step == 3 * kStepsPerEpoch) final_metric = std::stod(metric);
  }
  EXPECT_GE(with_metric, 1) << "the best checkpoint by metric is always kept";
  // The run's final accuracy is filed under its final checkpoint, best or not: rank 0 reports
  // it after worker 1 has finished and left (it was dropped while the cluster was incomplete).
  EXPECT_NEAR(final_metric, JsonNumber(summaries[0], "test_accuracy"), 1e-4)
      << "the final checkpoint (step " << 3 * kStepsPerEpoch << ") carries no final accuracy";
}

// ps_coordinator --exit_when_finished ends by itself, exit 0, once its workers finished
// (compose and systemd can then treat the job as done), leaving the run's final status page
// in its --data_dir.
TEST(CheckpointE2eTest, ACoordinatorToldToExitWhenTheRunFinishesDoes) {
  const std::string dir = ::testing::TempDir() + "/exit_when_finished";
  CheckpointingCluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCheckpointingCluster(dir, {"--exit_when_finished"}, &cluster));
  std::vector<testing::Subprocess> workers;
  for (int r = 0; r < 2; ++r) {
    auto p = testing::Subprocess::Start(
        {"worker/ps_worker", "--coordinator=" + cluster.coordinator, absl::StrCat("--rank=", r),
         "--world=2", "--synthetic=2000", "--layers=20,16,4", "--epochs=1", "--batch_size=32"});
    ASSERT_TRUE(p.ok());
    workers.push_back(*std::move(p));
  }
  for (auto& w : workers) FinishedSummary(w, "/dev/null");
  testing::Subprocess& coordinator = cluster.processes.front();
  auto line = coordinator.WaitForLine("--exit_when_finished", absl::Seconds(60));
  ASSERT_TRUE(line.ok()) << line.status();
  auto status = coordinator.Wait(absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "raw wait status " << *status;
  // The status page went with it; its last state stays in its data dir, finished.
  std::ifstream page(dir + "/coordinator/status.html");
  const std::string html((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("run finished"), std::string::npos) << "no final status page";
  EXPECT_NE(html.find("data-role=\"worker\" data-id=\"1\""), std::string::npos);
}

// Workers of one run started with different training flags the tables' specs do not show
// (here --micro_batches, --bucket_mb and --fsdp_reshard_after_forward: the collective calls
// the ranks make) are refused, naming the flags, instead of training together.
TEST(FlagsE2eTest, AWorkerStartedWithOtherFlagsThanRankZeroIsRefusedNamingThem) {
  auto c = testing::Subprocess::Start(
      {"server/coordinator/ps_coordinator", "--port=0", "--num_shards=1", "--num_workers=2"});
  ASSERT_TRUE(c.ok());
  const std::string coordinator = ListeningOn(*c);
  auto shard = testing::Subprocess::Start({"server/ps/ps_server", "--port=0", "--shard_id=0",
                                           "--num_shards=1", "--coordinator=" + coordinator});
  ASSERT_TRUE(shard.ok());
  ListeningOn(*shard);
  auto worker = [&](int rank, const std::string& extra) {  // its stderr too on the pipe
    return testing::Subprocess::Start(
        {"/bin/sh", "-c",
         absl::StrCat("exec worker/ps_worker --coordinator=", coordinator, " --rank=", rank,
                      " --world=2 --synthetic=2000 --layers=20,8,4 --epochs=1 ", extra, " 2>&1")});
  };
  auto rank0 = worker(0, "--micro_batches=4");
  ASSERT_TRUE(rank0.ok());
  auto rank1 = worker(1, "--micro_batches=8 --bucket_mb=0.1 --fsdp_reshard_after_forward=false");
  ASSERT_TRUE(rank1.ok());
  auto said = rank1->WaitForLine("start every worker with the same flags", absl::Minutes(1));
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_THAT(*said, ::testing::HasSubstr("worker 1 was started with --micro_batches=8 "
                                          "--bucket_mb=0.1 --fsdp_reshard_after_forward=false "
                                          "but the run's rank 0 with"));
  EXPECT_THAT(*said, ::testing::HasSubstr(" --bucket_mb=25 ")) << "rank 0's, the default";
  auto status = rank1->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0);
}

// Flags a worker cannot run with are refused at start, naming the flag (a negative
// collective timeout aborted inside Gloo; a negative --synthetic fell back to the real data).
TEST(FlagsE2eTest, AWorkerRefusesFlagsItCannotRunWithNamingThem) {
  for (const auto& [flag, says] : std::vector<std::pair<std::string, std::string>>{
           {"--collective_timeout=-5s", "--collective_timeout must be positive"},
           {"--collective_timeout=0s", "--collective_timeout must be positive"},
           {"--collective_spin=-1s", "--collective_spin must be >= 0"},
           {"--synthetic=-1", "--synthetic must be >= 0"},
           {"--snapshot_every_epochs=-1", "--snapshot_every_epochs must be >= 0"}}) {
    auto p = testing::Subprocess::Start(
        {"/bin/sh", "-c", "exec worker/ps_worker --coordinator=127.0.0.1:1 " + flag + " 2>&1"});
    ASSERT_TRUE(p.ok()) << p.status();
    auto said = p->WaitForLine(says, absl::Seconds(30));
    EXPECT_TRUE(said.ok()) << flag << ": " << said.status();
    auto status = p->Wait(absl::Seconds(30));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << flag;
  }
}

}  // namespace
}  // namespace pscluster
