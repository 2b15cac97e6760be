// Parameter-server mode: each step a worker pulls the parameters for step t, computes
// gradients on its batch, and pushes them; the shards apply the optimizer (BSP, SSP or
// ASP per table). One dense table per parameter tensor (table id = 1 + index in
// Mlp::params(): fc<i>.weight, fc<i>.bias).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/ps.pb.h"
#include "worker/client/coordinator_client.h"
#include "worker/client/ps_client.h"
#include "worker/compute/backend.h"
#include "worker/data/batches.h"
#include "worker/data/dataset.h"
#include "worker/model/mlp.h"

namespace pscluster::modes {

struct PsTrainerOptions {
  std::vector<std::string> shards;  // ps_server addresses, index = shard id
  int rank = 0;
  int world = 1;
  int batch_size = 64;  // per worker
  int epochs = 10;
  uint64_t seed = 1;              // data order and initial parameters
  ps::OptimizerConfig optimizer;  // applied by the shards
  // The learning rate decays exponentially to this fraction of itself by the last step
  // (1: constant); set on the tables as lr_decay_rate/lr_decay_steps.
  float lr_decay = 1.0f;
  ps::ConsistencyConfig consistency;
  model::MlpOptions mlp;
  absl::Duration progress_every = absl::Seconds(5);
  bool evaluate = true;  // test-set accuracy after each epoch
  absl::Duration rpc_timeout = absl::Minutes(2);
  // Rank 0 asks the shards for a snapshot at the end of every this many epochs (0: never);
  // for clusters whose coordinator runs without --data_dir (no cluster checkpoints).
  int snapshot_every_epochs = 0;
  // With a coordinator (not owned): progress is reported to it, and a failed shard is
  // survived: every worker stops, waits until the shard is back in the cluster view, rank
  // 0 rolls every shard back to the newest checkpoint complete on all of them, and all
  // workers resume from that step (data order included). Without one, a failure ends Run.
  CoordinatorClient* coordinator = nullptr;
  absl::Duration recovery_timeout = absl::Minutes(10);
};

struct TrainSummary {
  int64_t steps = 0;
  int epochs = 0;
  double final_loss = 0;       // mean training loss over the last epoch
  double test_accuracy = -1;   // after the last epoch, -1 if not evaluated
  double samples_per_sec = 0;  // this worker's training examples / training seconds
  double train_seconds = 0;
  std::vector<int64_t> snapshots;  // steps of the snapshots this worker requested
  std::vector<std::pair<int64_t, int64_t>> rollbacks;  // (failed step, checkpoint step)
  uint32_t param_crc32c = 0;  // CRC-32C of the final parameters, in table order
};

// Fills the figures every mode reports: steps, epochs, training time and samples/s.
void FinishSummary(const PsTrainerOptions& options, int64_t steps, absl::Duration train_time,
                   TrainSummary* summary);

class PsTrainer {
 public:
  // Connects to the shards, registers, and creates the tables (idempotent across workers).
  static absl::StatusOr<std::unique_ptr<PsTrainer>> Create(
      PsTrainerOptions options, const data::Dataset* train, const data::Dataset* test,
      std::unique_ptr<compute::Backend> backend);
  absl::StatusOr<TrainSummary> Run();

 private:
  PsTrainer(PsTrainerOptions options, const data::Dataset* train, const data::Dataset* test);
  absl::Status CreateTables();
  absl::Status Pull(int64_t step);
  absl::Status Push(int64_t step);
  absl::StatusOr<double> EvaluateTest();
  absl::Status Connect(const std::vector<std::string>& shards);
  // The cluster view once it is complete again with a restarted shard.
  absl::StatusOr<coord::ClusterView> AwaitHealedView();
  // Recovery number `n` after `cause` at `failed_step`: returns the step to resume from.
  absl::StatusOr<int64_t> Recover(int n, int64_t failed_step, const absl::Status& cause);
  void ReportProgress(int64_t step, double loss, double rate);

  const PsTrainerOptions options_;
  const data::Dataset* const train_;
  const data::Dataset* const test_;
  std::unique_ptr<compute::Backend> backend_;
  std::unique_ptr<model::Mlp> mlp_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<data::BatchIterator> batches_;
  std::vector<std::vector<float>> host_;  // per parameter: pulled values, then gradients
  coord::ClusterView view_;               // with a coordinator: the view training uses
};

}  // namespace pscluster::modes
