// The steps of ps_worker's main: join the cluster, load the data, make the backend, write
// the summary. Each fails with a status whose message says what to fix.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/coordinator/coordinator_client.h"
#include "worker/compute/backend.h"
#include "worker/data/dataset.h"
#include "worker/flags.h"
#include "worker/modes/trainer.h"

namespace pscluster::worker {

// With --coordinator: registers, waits for the complete cluster (checking --world), and
// fills flags->trainer.coordinator and .connect (Gloo, or NCCL staged through the GPU);
// null without one. Then sets flags->trainer.mode from --mode or the coordinator's mode.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> JoinCluster(WorkerFlags* flags);

struct Datasets {
  data::Dataset train, test;
};
// Fashion-MNIST from --dataset_dir, or --synthetic examples (a fifth more held out, drawn
// from the same class centroids).
absl::StatusOr<Datasets> LoadData(const WorkerFlags& flags);

absl::StatusOr<std::unique_ptr<compute::Backend>> MakeBackend(const WorkerFlags& flags);

// The final figures as one JSON object (for scripts and tests).
absl::Status WriteSummaryJson(const std::string& path, int rank, const std::string& mode,
                              const modes::TrainSummary& summary);

}  // namespace pscluster::worker
