// ALLREDUCE mode: every worker holds a full replica; each step the workers average their
// gradients with an all-reduce (one flat buffer) and apply the same optimizer code the
// shards run (server/ps/optimizer.h), so the replicas stay identical.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/ps/optimizer.h"
#include "worker/collective/communicator.h"
#include "worker/compute/backend.h"
#include "worker/data/batches.h"
#include "worker/data/dataset.h"
#include "worker/model/mlp.h"
#include "worker/modes/ps_trainer.h"

namespace pscluster::modes {

class AllReduceTrainer {
 public:
  // Uses options.rank/world/batch_size/epochs/seed/optimizer/lr_decay/mlp/progress_every/
  // evaluate; the rank and world must match `comm`.
  static absl::StatusOr<std::unique_ptr<AllReduceTrainer>> Create(
      PsTrainerOptions options, const data::Dataset* train, const data::Dataset* test,
      std::unique_ptr<compute::Backend> backend, std::unique_ptr<collective::Communicator> comm);

  absl::StatusOr<TrainSummary> Run();
  // One step on the given batch (for tests): gradients, all-reduce, optimizer, in place.
  absl::Status Step(const data::Batch& batch, int64_t step);
  const std::vector<std::vector<float>>& params() const { return params_; }

  // The initial parameters every mode starts from: the PS tables' initializers (Glorot
  // uniform weights seeded per tensor, zero biases), so modes agree from step 0.
  static std::vector<std::vector<float>> InitialParams(const model::MlpOptions& mlp, uint64_t seed);

 private:
  AllReduceTrainer() = default;

  PsTrainerOptions options_;
  const data::Dataset* train_ = nullptr;
  const data::Dataset* test_ = nullptr;
  std::unique_ptr<compute::Backend> backend_;
  std::unique_ptr<collective::Communicator> comm_;
  std::unique_ptr<model::Mlp> mlp_;
  std::unique_ptr<ps::Optimizer> optimizer_;
  std::unique_ptr<data::BatchIterator> batches_;
  std::vector<std::vector<float>> params_;              // host replica
  std::vector<std::vector<std::vector<float>>> slots_;  // per param, per optimizer slot
  std::vector<float> flat_;                             // all gradients, for one all-reduce
};

}  // namespace pscluster::modes
