// ps_worker's flags, parsed into typed options (worker/flags.cc defines every flag).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/modes/trainer.h"

namespace pscluster::worker {

struct WorkerFlags {
  modes::TrainerOptions trainer;  // without coordinator, connect and mode (set by setup.h)
  std::string mode;               // --mode; empty: the coordinator's (ps without one)
  std::string coordinator;        // ps_coordinator address, or empty
  std::string host;               // the address other workers reach this one at
  std::string collectives;        // gloo | nccl
  absl::Duration collective_timeout;
  absl::Duration collective_spin;
  std::string backend;  // cpu | cuda
  int cuda_device = -1;
  std::string dataset_dir;  // Fashion-MNIST
  std::string text_dir;     // --model=gpt: the fortunes corpus
  int64_t synthetic = 0;    // > 0: that many synthetic examples instead
  std::string summary_json;
};

// After absl::ParseCommandLine: the flags, checked; INVALID_ARGUMENT naming the flag.
absl::StatusOr<WorkerFlags> WorkerFlagsFromCommandLine();

}  // namespace pscluster::worker
