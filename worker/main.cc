// ps_worker: trains a model (--model) on Fashion-MNIST in any of the four modes (parameter server,
// all-reduce, FSDP, pipeline), switched live by the coordinator.
//
//   ps_worker --coordinator=127.0.0.1:4000 --rank=0 --world=2 --epochs=10
//   ps_worker --ps=127.0.0.1:5000,127.0.0.1:5001 --rank=0 --world=2   (PS mode only)
//
// Prints progress (epoch, step, loss, samples/s, ETA) and the test accuracy after each
// epoch; --summary_json writes the final figures for scripts.
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/malloc_mode.h"
#include "common/metrics_flags.h"
#include "common/mutex_mode.h"
#include "worker/flags.h"
#include "worker/modes/worker_metrics.h"
#include "worker/setup.h"

using pscluster::LogError;
using pscluster::LogInfo;
using pscluster::LogWarning;

namespace {

int Fail(const absl::Status& status) {
  LogError("%s", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  pscluster::NoMutexDeadlockDetection();
  using namespace pscluster;
  constexpr char kUsage[] =
      "Trains a model: ps_worker --coordinator=ADDR --rank=R --world=W [--mode=MODE] "
      "[--model=mlp|embedding|gpt] (or --ps=ADDR,... for PS mode without a coordinator)";
  HandleHelpAndVersion(argc, argv, kUsage);
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  // Gloo writes to sockets with writev: a peer that died must be an error, not SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  WorkerMallocMode();
  absl::StatusOr<worker::WorkerFlags> flags = worker::WorkerFlagsFromCommandLine();
  if (!flags.ok()) return Fail(flags.status());
  InitLogging("ps_worker", std::to_string(flags->trainer.rank));
  auto metrics = ServeMetricsFromFlags("ps_worker", std::to_string(flags->trainer.rank));
  if (!metrics.ok()) return Fail(metrics.status());
  std::unique_ptr<modes::WorkerMetrics> worker_metrics;
  if (*metrics) {
    worker_metrics = std::make_unique<modes::WorkerMetrics>(&(*metrics)->registry());
    flags->trainer.metrics = worker_metrics.get();
  }
  auto coordinator = worker::JoinCluster(&*flags);  // outlives the trainer
  if (!coordinator.ok()) return Fail(coordinator.status());
  auto data = worker::LoadData(*flags);
  if (!data.ok()) return Fail(data.status());
  auto backend = worker::MakeBackend(*flags);
  if (!backend.ok()) return Fail(backend.status());
  auto trainer =
      modes::Trainer::Create(flags->trainer, &data->train, &data->test, *std::move(backend));
  if (!trainer.ok()) return Fail(trainer.status());
  absl::StatusOr<modes::TrainSummary> summary = (*trainer)->Run();
  if (!summary.ok()) return Fail(summary.status());
  if (absl::Status left = (*trainer)->Leave(); !left.ok()) {  // the run is done either way
    LogWarning("worker %d: unregistering from the shards: %s", flags->trainer.rank,
               left.ToString().c_str());
  }
  LogInfo("worker %d: done: %lld steps, test accuracy %.4f, %.0f samples/s", flags->trainer.rank,
          static_cast<long long>(summary->steps), summary->test_accuracy, summary->samples_per_sec);
  if (!flags->summary_json.empty()) {
    absl::Status s =
        worker::WriteSummaryJson(flags->summary_json, flags->trainer.rank, flags->mode, *summary);
    if (!s.ok()) return Fail(s);
  }
  return 0;
}
