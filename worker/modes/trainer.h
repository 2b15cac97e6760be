// A worker's training loop, in any of the four modes (placement.h), switched live.
//
// Each step boundary, the worker asks the coordinator whether a mode switch is scheduled
// for it (the coordinator makes every worker switch at the same step); if so the workers
// barrier, gather the whole state (parameters, optimizer slots, update count) from the
// old placement, hand it to the new one, acknowledge, and run the step in the new mode.
// No process restarts.
//
// Failures: with a coordinator, a shard or worker that dies is survived. The others stop
// (a collective fails naming the peer, or an RPC fails), wait until the cluster view is
// complete again with the replacement, rank 0 rolls every shard back to the newest
// checkpoint complete on all of them, and every worker (the replacement included) loads
// that checkpoint into the current mode and resumes from its step (data order included).
// Checkpoints are PS snapshots; in the collective modes rank 0 writes the state into the
// shards at every epoch's end so the coordinator can snapshot it: a checkpoint taken in
// one mode restores in any other.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator/coordinator_client.h"
#include "client/ps/ps_client.h"
#include "common/cluster_view.h"
#include "proto/ps.pb.h"
#include "worker/collective/communicator.h"
#include "worker/compute/backend.h"
#include "worker/data/dataset.h"
#include "worker/model/registry.h"
#include "worker/modes/placement.h"
#include "worker/modes/train_loop.h"
#include "worker/modes/worker_metrics.h"

namespace pscluster::modes {

// --bucket_mb in bytes (truncated): the flag's one conversion, for the options and for the
// flags a run's workers compare.
inline size_t BucketBytes(double mb) { return static_cast<size_t>(mb * (1 << 20)); }

struct TrainerOptions {
  Mode mode = coord::PS;            // the mode training starts in
  std::vector<std::string> shards;  // ps_server addresses, index = shard id (or coordinator's)
  int rank = 0;
  int world = 1;
  int batch_size = 64;  // per worker
  int epochs = 10;
  int64_t max_steps = 0;          // > 0: stop after this many steps (the epochs' steps otherwise)
  uint64_t seed = 1;              // data order and initial parameters
  ps::OptimizerConfig optimizer;  // the shards' and the workers' optimizer
  // The learning rate decays exponentially to this fraction of itself by the last step
  // (1: constant).
  float lr_decay = 1.0f;
  int64_t lr_warmup_steps = 0;             // the learning rate rises linearly over these updates
  ps::ConsistencyConfig consistency;       // PS mode's tables
  model::ModelConfig model;                // --model and its sizes
  int micro_batches = 4;                   // PIPELINE
  size_t bucket_bytes = size_t{25} << 20;  // ALLREDUCE (placement.h); BucketBytes(--bucket_mb)
  bool overlap_allreduce = true;           // ALLREDUCE (placement.h)
  bool fsdp_reshard_after_forward = true;  // FSDP (placement.h)
  bool overlap_push = true;                // PS, where the consistency allows (placement.h)
  // Workers ask the coordinator for switches every this many steps (the coordinator then
  // schedules a next-boundary switch at least this far ahead): a step's RPC saved.
  int switch_poll_steps = 8;
  absl::Duration progress_every = absl::Seconds(5);
  std::string steps_file;  // a JSON line per step and rollback here (steps_file.h); "": none
  bool evaluate = true;    // test-set accuracy after each epoch
  absl::Duration rpc_timeout = absl::Minutes(2);
  // Rank 0 asks the coordinator for a cluster checkpoint (the Checkpoint RPC) at the end of
  // every this many epochs (0: never); for coordinators without --checkpoint_every_steps.
  int snapshot_every_epochs = 0;
  // With a coordinator (not owned): progress and metrics are reported to it, switches are
  // taken from it, and failures are survived (see above). Without one, a failure ends Run.
  CoordinatorClient* coordinator = nullptr;
  absl::Duration recovery_timeout = absl::Minutes(10);
  // Connects this worker's communicator for the generation named (ranks connecting under
  // the same name form a group); needed by the collective modes and by switching. Null:
  // PS mode only.
  std::function<absl::StatusOr<std::unique_ptr<collective::Communicator>>(
      const std::string& generation)>
      connect;
  // Prometheus metrics of this worker (not owned; null: none).
  WorkerMetrics* metrics = nullptr;
  Security security;  // TLS and token of the calls to the shards
};

struct SwitchDone {
  int64_t step = 0;
  std::string from, to;
  double seconds = 0;  // hand-over time on this worker
};

struct TrainSummary {
  int64_t steps = 0;
  int epochs = 0;
  int64_t steps_per_epoch = 0;  // steps < epochs * steps_per_epoch: cut short by max_steps
  double final_loss = 0;        // mean training loss over the last epoch
  double test_accuracy = -1;    // after the last epoch, -1 if not evaluated (a language
                                // model: next-token accuracy)
  double test_loss = -1;        // the mean loss there (a byte-level model: nats per byte)
  double samples_per_sec = 0;   // this worker's training examples / training seconds
  double train_seconds = 0;
  std::vector<int64_t> snapshots;  // steps of the snapshots this worker requested
  std::vector<std::pair<int64_t, int64_t>> rollbacks;  // (failed step, checkpoint step)
  std::vector<SwitchDone> switches;
  std::vector<std::pair<std::string, double>> figures;  // the last placement's (placement.h)
  std::string final_mode;
  std::string model;          // ModelSpec::kind
  uint32_t param_crc32c = 0;  // CRC-32C of the final parameters, in table order
};

class Trainer {
 public:
  // Connects (coordinator view, shards, communicator), creates the PS tables when there
  // are shards, and sets up the starting mode at step 0 (or, for a worker that replaces a
  // failed one, joins the others' rollback).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(TrainerOptions options,
                                                         const data::Dataset* train,
                                                         const data::Dataset* test,
                                                         std::unique_ptr<compute::Backend> backend);
  ~Trainer();

  absl::StatusOr<TrainSummary> Run();
  // After the run: this worker leaves for good (the shards stop counting it for BSP).
  absl::Status Leave();

  // For tests and tools: one step in the current mode; a switch at boundary `step`; the
  // whole state before `step`. Collective: every rank must make the same calls.
  absl::StatusOr<float> Step(int64_t step) { return placement_->Step(step); }
  absl::Status SwitchTo(Mode mode, int64_t step, double* seconds = nullptr);
  absl::StatusOr<ModelState> State(int64_t step, bool with_slots = true) {
    return placement_->Gather(step, with_slots);
  }
  Mode mode() const { return placement_->mode(); }
  // The current placement's figures (placement.h), measured over the steps it ran.
  std::vector<std::pair<std::string, double>> Figures() const { return placement_->Figures(); }

 private:
  Trainer(TrainerOptions options, const data::Dataset* train, const data::Dataset* test);
  absl::Status Connect(const std::vector<std::string>& shards);
  absl::Status CreateTables();
  PlacementContext Context() const;
  // The step to start from: 0 for a fresh run; for a worker replacing a failed one, the
  // rollback step it agreed on with the others.
  absl::StatusOr<int64_t> Start();
  // INVALID_ARGUMENT naming the shared flags this worker was started with that differ from
  // the run's record (rank 0 records its own first, while the run in `now` has not started).
  absl::Status CheckSameFlags(const coord::ClusterView& now);
  // Stops, agrees on the newest complete checkpoint with the others (generation `gen`),
  // rolls back to it and loads it into the current mode. Returns its step.
  absl::StatusOr<int64_t> Rejoin(const std::string& gen);
  // Rank 0's part of it: once every worker stopped in `gen`, the shards rolled back to
  // the newest checkpoint they all can restore (the ones after it deleted). Its step.
  absl::StatusOr<int64_t> RollBackShards(const std::string& gen);
  // Waits, in slices of the coordinator's view, until `ready` holds for the view (its
  // recovery record: proto RunRecord, Rollback) or `timeout` passed; between slices,
  // with `check_liveness`, gives up when a member failed or the generation changed again
  // (the rollback then starts over). `waited_for` names what waits, from the last view.
  absl::StatusOr<coord::ClusterView> AwaitRecovery(
      const std::function<bool(const coord::ClusterView&)>& ready,
      const std::function<std::string(const coord::ClusterView&)>& waited_for,
      absl::Duration timeout, bool check_liveness);
  absl::StatusOr<coord::ClusterView> AwaitHealedView();
  // When the view is complete and still of generation `before`: registers this worker
  // again (a new generation, in which every worker rolls back).
  absl::Status StartGenerationIfWhole(const std::string& before);
  // Waits for the healed view and rejoins (Rejoin), again while a member fails or comes
  // back before the rollback is agreed, up to recovery_timeout. `failed_step` failed with
  // `cause` (none: a replacement's join was interrupted).
  absl::StatusOr<int64_t> Recover(std::optional<int64_t> failed_step, absl::Status cause);
  // How long a wait in a shard or for a peer's message goes between two CheckLiveness.
  static constexpr absl::Duration kWaitSlice = absl::Seconds(2);
  // The PsClient's and the communicator's wait check: UNAVAILABLE naming the member the
  // coordinator declared dead, or a change of generation; OK to go on waiting.
  absl::Status CheckLiveness() const;
  // Whether the coordinator declared this worker dead since view_ (it registered again as
  // a new incarnation, and its calls as the old one fail): it then rolls back too.
  bool DeclaredDead() const;
  // Steps from the coordinator's schedule that are due at boundary `step`.
  absl::Status MaybeSwitch(int64_t step, TrainSummary* summary);
  // The collective modes' checkpoint path: the state before `step` into the shards.
  absl::Status Publish(int64_t step);
  // Rank 0 after an import into replicated shards, which leaves each head alone until its
  // live backups have copied the state back: waits for that (ShortChains), up to
  // rpc_timeout, saying so if it runs out.
  void AwaitWholeChains() const;
  // Rank 0, every --snapshot_every_epochs: a cluster checkpoint through the coordinator.
  void RequestCheckpoint(int64_t epoch, TrainSummary* summary);
  // The collective modes, at a multiple of the coordinator's checkpoint_every_steps that
  // is not an epoch's end: every rank hands the state before `step` to the shards, and
  // rank 0 asks for the checkpoint (in PS mode the coordinator takes it by itself).
  absl::Status CheckpointMidEpoch(int64_t step, TrainSummary* summary);
  // Rank 0: the coordinator's checkpoint of the step the shards hold (`when` for the line
  // saying it was skipped).
  void AskForCheckpoint(const std::string& when, TrainSummary* summary);
  // The test set's loss and accuracy with the parameters of `step`.
  absl::StatusOr<model::StepResult> Evaluate(int64_t step);
  void ReportProgress(int64_t step, double loss, double rate, const coord::StepTime& time);
  // options_.connect for generation `name`, its calls timed into comm_clock_.
  absl::Status ConnectCommunicator(const std::string& name);
  // Run's parts: the loop's hooks (a due switch, the step, recovery), and the summary's
  // figures once the run ended.
  TrainLoopHooks LoopHooks(TrainSummary* summary);
  absl::Status Summarize(int64_t total, absl::Duration training, TrainSummary* summary);
  // The loop's observers on this trainer's state (trainer_observers.cc): checkpoints,
  // mid-epoch and at every epoch's end; the test set's evaluation at every epoch's end.
  class TrainerObserver : public StepObserver {
   public:
    TrainerObserver(Trainer* trainer, TrainSummary* summary)
        : trainer_(trainer), summary_(summary) {}

   protected:
    Trainer* const trainer_;
    TrainSummary* const summary_;
  };
  class Checkpoints final : public TrainerObserver {
   public:
    using TrainerObserver::TrainerObserver;
    absl::Status AfterStep(const StepDone& done) override;
  };
  class Evaluation final : public TrainerObserver {
   public:
    using TrainerObserver::TrainerObserver;
    absl::Status AfterStep(const StepDone& done) override;
  };

  const TrainerOptions options_;
  const data::Dataset* const train_;
  const data::Dataset* const test_;
  std::unique_ptr<compute::Backend> backend_;
  std::unique_ptr<model::ModelDef> model_;
  std::unique_ptr<core::Optimizer> optimizer_;  // the collective modes' (the shards' config)
  ps::OptimizerConfig optimizer_config_;        // with the lr decay
  // Time the training thread spends communicating: the placements reach the shards and
  // the other workers only through these timed wrappers.
  CommClock comm_clock_;
  std::unique_ptr<PsClient> client_;                // null without shards
  std::unique_ptr<TimedParameterStore> timed_ps_;   // client_, timed
  std::unique_ptr<collective::Communicator> comm_;  // a TimedCommunicator
  std::unique_ptr<Placement> placement_;
  coord::ClusterView view_;  // with a coordinator: the view training uses
  // The steps of the whole run: the epochs', or fewer with max_steps.
  int64_t total_steps() const {
    const int64_t all = per_epoch_ * options_.epochs;
    return options_.max_steps > 0 ? std::min(all, options_.max_steps) : all;
  }
  uint64_t memory_before_ = 0, memory_live_ = 0, memory_peak_ = 0;  // resident bytes
  int64_t per_epoch_ = 0;
  int64_t start_step_ = 0;
  // Switch polling: the last answer covers boundaries [polled_at_, next_poll_).
  int64_t polled_at_ = 0, next_poll_ = 0;
  std::optional<PendingSwitch> known_;
};

// The mode a rollback to the checkpoint of `step` (the state before that step) loads the
// state into: the mode of step - 1 (coord::ModeAt over the view's done and pending
// switches). A switch at `step` itself is then taken again by the training loop, as every
// switch after it, so the replay reports the same hand-over as the first time.
Mode RollbackMode(const coord::ClusterView& view, int64_t step);

// Adds a switch this worker made to its summary's list. Entries at its step or later are
// from before a rollback (the training loop replays those switches) and go: the list holds
// each switch of the run once, with the hand-over it took last.
void RecordSwitch(std::vector<SwitchDone>* switches, SwitchDone done);

using coord::Generation;
// Failures another process caused: a shard or a worker went away or stopped answering.
bool PeerFailure(const absl::Status& s);

}  // namespace pscluster::modes
