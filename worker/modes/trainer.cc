#include "worker/modes/trainer.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/coordinator/chain_watch.h"
#include "common/cluster_view.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "core/optimizer/optimizer_config.h"
#include "worker/modes/model_tables.h"
#include "worker/modes/step_observers.h"
#include "worker/modes/steps_file.h"

namespace pscluster::modes {
namespace {

// Updates a table takes per worker step: one under BSP (the workers' pushes are summed), one
// per worker's push otherwise (and in the collective modes' local optimizer, one a step).
int64_t UpdatesPerStep(const TrainerOptions& o) {
  return o.consistency.mode() == ps::ConsistencyConfig::BSP ? 1 : o.world;
}

// The scheduled learning rate at a worker step, for the metrics (null if the config is bad:
// creating the optimizer reports that).
std::function<double(int64_t)> LearningRateAt(const ps::OptimizerConfig& config,
                                              int64_t updates_per_step) {
  absl::StatusOr<core::OptimizerOptions> o = core::OptimizerOptionsFrom(config);
  if (!o.ok()) return nullptr;
  return [o = *o, updates_per_step](int64_t step) {
    return static_cast<double>(core::ScheduledLearningRate(o, step * updates_per_step + 1));
  };
}

}  // namespace
bool PeerFailure(const absl::Status& s) {
  // ABORTED: a shard's state is behind the step (it restarted from a checkpoint, or was
  // rolled back while a call waited): the cluster changed, and the worker rolls back too.
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kAborted;
}

Trainer::Trainer(TrainerOptions options, const data::Dataset* train, const data::Dataset* test)
    : options_(std::move(options)), train_(train), test_(test) {}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    TrainerOptions options, const data::Dataset* train, const data::Dataset* test,
    std::unique_ptr<compute::Backend> backend) {
  std::unique_ptr<Trainer> t(new Trainer(std::move(options), train, test));
  const TrainerOptions& o = t->options_;
  t->backend_ = std::move(backend);
  ASSIGN_OR_RETURN(auto batches,
                   data::BatchIterator::Create(train, o.rank, o.world, o.batch_size, o.seed));
  t->per_epoch_ = batches.batches_per_epoch();
  t->optimizer_config_ = o.optimizer;
  // The schedule counts updates: tables count one per step under BSP (and in every
  // collective mode), one per worker push otherwise.
  const int64_t updates_per_step = UpdatesPerStep(o);
  t->optimizer_config_.set_lr_warmup_steps(o.lr_warmup_steps * updates_per_step);
  if (o.lr_decay < 1.0f) {
    t->optimizer_config_.set_lr_decay_rate(o.lr_decay);
    t->optimizer_config_.set_lr_decay_steps(
        std::max<int64_t>(1, t->total_steps() * updates_per_step));
  }
  ASSIGN_OR_RETURN(t->optimizer_, core::MakeOptimizer(t->optimizer_config_));
  ASSIGN_OR_RETURN(t->model_, model::MakeModelDef(o.model, o.seed));
  std::vector<std::string> shards = o.shards;
  if (o.coordinator != nullptr) {
    ASSIGN_OR_RETURN(t->view_, o.coordinator->AwaitView(0, /*complete=*/true, o.recovery_timeout));
    shards.assign(t->view_.shard_addresses().begin(), t->view_.shard_addresses().end());
  }
  if (!shards.empty()) {
    RETURN_IF_ERROR(t->Connect(shards));
    RETURN_IF_ERROR(t->CreateTables());
    RETURN_IF_ERROR(t->client_->AwaitWorkers(o.world, o.rpc_timeout));
  }
  // The memory training takes is measured from here (OpenBLAS's own buffers, set up by its
  // first product, belong to the process, not to the model).
  compute::BackendBuffer warm(t->backend_.get(), 64 * 64);
  t->backend_->Gemm(false, false, 64, 64, 64, 1.0f, warm.get(), warm.get(), 0.0f, warm.get());
  malloc_trim(0);  // free pages back to the system: what is resident is what is live
  t->memory_before_ = ResidentMemoryBytes();
  ASSIGN_OR_RETURN(t->start_step_, t->Start());
  return t;
}

absl::Status Trainer::Connect(const std::vector<std::string>& shards) {
  PsClientOptions co;
  co.shard_addresses = shards;
  if (view_.replicas() > 1) {  // each shard's chain, head first: the client follows failovers
    for (const coord::Chain& chain : view_.chains()) {
      co.shard_replicas.emplace_back(chain.addresses().begin(), chain.addresses().end());
    }
    if (options_.coordinator != nullptr) {  // and the chains the coordinator forms after
      auto watch = std::make_shared<ChainWatch>(options_.coordinator, view_, options_.rank);
      co.resolve_chain = [watch](int shard, const std::string& unreachable) {
        return watch->Chain(shard, unreachable);
      };
    }
  }
  co.worker_id = options_.rank;
  co.rpc_timeout = options_.rpc_timeout;
  co.security = options_.security;
  if (options_.coordinator != nullptr) co.wait_check = [this] { return CheckLiveness(); };
  co.wait_slice = kWaitSlice;
  ASSIGN_OR_RETURN(client_, PsClient::Create(co));
  timed_ps_ = std::make_unique<TimedParameterStore>(client_.get(), &comm_clock_);
  return client_->RegisterWorker();
}

absl::Status Trainer::ConnectCommunicator(const std::string& name) {
  ASSIGN_OR_RETURN(std::unique_ptr<collective::Communicator> comm, options_.connect(name));
  // A peer that stopped answering ends the wait once the coordinator declares it dead, as
  // the shards' waits do, instead of after the whole collective timeout.
  if (options_.coordinator != nullptr) {
    comm->SetWaitCheck([this] { return CheckLiveness(); }, kWaitSlice);
  }
  comm_ = std::make_unique<TimedCommunicator>(std::move(comm), &comm_clock_);
  return absl::OkStatus();
}

// Between the slices of a long wait in a shard: give up when the coordinator has declared
// a member dead or the cluster changed generation (this worker too may have been declared
// dead and registered again); go on waiting otherwise, or when the coordinator does not
// answer (it may be restarting; the client-wide deadline still bounds the wait).
absl::Status Trainer::CheckLiveness() const {
  auto now = options_.coordinator->AwaitView(0, false, absl::Seconds(2));
  if (!now.ok()) return absl::OkStatus();
  return coord::StillSameCluster(view_, *now, options_.rank);
}

absl::Status Trainer::Leave() {
  if (options_.coordinator != nullptr) {
    // Said first: once this worker falls silent the coordinator shows it finished, not dead,
    // and psctl status reports the run finished (exit 0) instead of INCOMPLETE (exit 1).
    absl::Status s = options_.coordinator->ReportFinished(view_.version(), total_steps());
    if (!s.ok()) {
      LogWarning("worker %d: telling the coordinator the run finished: %s", options_.rank,
                 s.ToString().c_str());
    }
  }
  return client_ == nullptr ? absl::OkStatus() : client_->UnregisterWorker();
}

bool Trainer::DeclaredDead() const {
  if (options_.coordinator->registering_again()) return true;
  for (const auto& m : view_.members()) {
    if (m.role() == coord::WORKER && m.id() == options_.rank) {
      return m.incarnation() != options_.coordinator->incarnation();
    }
  }
  return false;
}

absl::Status Trainer::CreateTables() {  // idempotent across workers
  for (const ps::TableSpec& spec :
       ModelTables(model_->spec()).Specs(optimizer_config_, options_.consistency)) {
    absl::Status s = client_->CreateTable(spec);
    if (absl::IsAlreadyExists(s)) {
      return absl::AlreadyExistsError(absl::StrCat(
          absl::StripTrailingAsciiWhitespace(s.message()),
          ". Another worker, or the run these shards hold (restored or still running), made "
          "it from other flags: start every worker with the same model and training flags "
          "(--model, the sizes, --batch_size, --epochs, --lr, --optimizer, --consistency) as "
          "that run, or start the shards afresh (no --restore, another --data_dir)"));
    }
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

PlacementContext Trainer::Context() const {
  PlacementContext c;
  c.model = model_.get();
  c.rank = options_.rank;
  c.world = options_.world;
  c.batch_size = options_.batch_size;
  c.seed = options_.seed;
  c.micro_batches = options_.micro_batches;
  c.bucket_bytes = options_.bucket_bytes;
  c.overlap_allreduce = options_.overlap_allreduce;
  c.fsdp_reshard_after_forward = options_.fsdp_reshard_after_forward;
  const ps::ConsistencyConfig& consistency = options_.consistency;
  c.overlap_push =
      options_.overlap_push &&
      (consistency.mode() == ps::ConsistencyConfig::ASP ||
       (consistency.mode() == ps::ConsistencyConfig::SSP && consistency.staleness() >= 1));
  c.train = train_;
  c.backend = backend_.get();
  c.comm = comm_.get();
  c.ps = timed_ps_.get();
  c.optimizer = optimizer_.get();
  c.after_import = [this] { AwaitWholeChains(); };
  return c;
}

absl::Status Trainer::Publish(int64_t step) {
  if (placement_->mode() == coord::PS || client_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(ModelState state, placement_->Gather(step, /*with_slots=*/true));
  if (options_.rank != 0) return absl::OkStatus();
  RETURN_IF_ERROR(ImportState(client_.get(), model_->spec(), state, step));
  AwaitWholeChains();
  return absl::OkStatus();
}

void Trainer::AwaitWholeChains() const {
  if (options_.coordinator == nullptr || view_.replicas() <= 1) return;
  const absl::Time end = absl::Now() + options_.rpc_timeout;
  int64_t version = 0;
  std::vector<int32_t> short_chains;
  while (absl::Now() < end) {
    absl::StatusOr<coord::ClusterView> v =
        options_.coordinator->AwaitView(version, /*complete=*/false, end - absl::Now());
    if (!v.ok()) break;  // the time ran out (or the coordinator is gone: said below)
    short_chains = coord::ShortChains(*v);
    if (short_chains.empty()) return;
    version = v->version() + 1;  // the next change: a backup joining
  }
  LogInfo(
      "worker %d: the chains of shard(s) %s have not all their live replicas again after "
      "the import (%s): a head lost now loses its shard",
      options_.rank, absl::StrJoin(short_chains, ", ").c_str(),
      absl::FormatDuration(options_.rpc_timeout).c_str());
}

absl::Status Trainer::CheckpointMidEpoch(int64_t step, TrainSummary* summary) {
  const int64_t every = view_.checkpoint_every_steps();
  if (every <= 0 || step % every != 0 || placement_->mode() == coord::PS ||
      options_.coordinator == nullptr || client_ == nullptr) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(placement_->Flush());
  RETURN_IF_ERROR(Publish(step));
  if (options_.rank == 0) AskForCheckpoint(absl::StrCat("at step ", step), summary);
  return absl::OkStatus();
}

void Trainer::RequestCheckpoint(int64_t epoch, TrainSummary* summary) {
  if (options_.rank != 0 || options_.coordinator == nullptr || client_ == nullptr ||
      options_.snapshot_every_epochs <= 0 || epoch % options_.snapshot_every_epochs != 0) {
    return;
  }
  AskForCheckpoint(absl::StrCat("after epoch ", epoch), summary);
}

void Trainer::AskForCheckpoint(const std::string& when, TrainSummary* summary) {
  // The coordinator chooses the step (the boundary the shards hold for rank 0) and records
  // it. A failure costs this checkpoint, not the training run.
  auto taken = options_.coordinator->Checkpoint(std::nullopt, options_.rpc_timeout);
  if (taken.ok()) {
    summary->snapshots.push_back(taken->step());
  } else {
    LogInfo("worker %d: checkpoint %s skipped: %s", options_.rank, when.c_str(),
            taken.status().ToString().c_str());
  }
}

absl::StatusOr<model::StepResult> Trainer::Evaluate(int64_t step) {
  ASSIGN_OR_RETURN(ModelState state, placement_->Gather(step, /*with_slots=*/false));
  ASSIGN_OR_RETURN(auto model,
                   model_->Create(backend_.get(), model::WholeModel(model_->spec().eval_batch)));
  RETURN_IF_ERROR(SetWholeState(model.get(), model_->spec(), state));
  return model->Evaluate(test_->x.data(), test_->y.data(), test_->size);
}

void Trainer::ReportProgress(int64_t step, double loss, double rate, const coord::StepTime& time) {
  if (options_.coordinator == nullptr) return;
  absl::Status s =
      options_.coordinator->ReportProgress(view_.version(), step, loss, rate, std::nullopt, &time);
  if (!s.ok()) LogWarning("worker %d: progress report: %s", options_.rank, s.ToString().c_str());
}

absl::StatusOr<TrainSummary> Trainer::Run() {
  TrainSummary summary;
  const int64_t total = total_steps();
  if (options_.coordinator != nullptr) options_.coordinator->set_run_end_step(total);
  TrainLoop loop(LoopHooks(&summary), per_epoch_, total);
  MetricsObserver metrics(
      options_.metrics, options_.batch_size, [this] { return mode(); },
      LearningRateAt(optimizer_config_, UpdatesPerStep(options_)));
  ProgressPrinter::Options p;
  p.rank = options_.rank;
  p.batch_size = options_.batch_size;
  p.epochs = options_.epochs;
  p.every = options_.progress_every;
  p.mode = [this] { return mode(); };
  p.report = [this](int64_t step, double loss, double rate, const coord::StepTime& time) {
    ReportProgress(step, loss, rate, time);
  };
  p.metrics = options_.metrics;
  ProgressPrinter progress(std::move(p));
  Checkpoints checkpoints(this, &summary);
  Evaluation evaluation(this, &summary);
  if (options_.metrics != nullptr) loop.Observe(&metrics);
  loop.Observe(&progress);
  loop.Observe(&checkpoints);
  loop.Observe(&evaluation);
  std::unique_ptr<StepsFile> steps;
  if (!options_.steps_file.empty()) {
    ASSIGN_OR_RETURN(steps, StepsFile::Open(options_.steps_file, [this] { return mode(); }));
    loop.Observe(steps.get());
  }
  ASSIGN_OR_RETURN(TrainLoop::Result result, loop.Run(start_step_));
  summary.rollbacks = std::move(result.rollbacks);
  summary.final_loss = result.final_loss;
  RETURN_IF_ERROR(Summarize(total, result.training, &summary));
  return summary;
}

TrainLoopHooks Trainer::LoopHooks(TrainSummary* summary) {
  TrainLoopHooks h;
  h.before = [this, summary](int64_t step) -> absl::Status {
    // A worker the coordinator declared dead (cut off or stopped past the timeout) whose
    // calls all succeeded again once it came back has registered as a new incarnation: it
    // rolls back with the others instead of training on in the old generation (they see
    // the new one in their next wait for it).
    if (options_.coordinator != nullptr && DeclaredDead()) {
      return absl::UnavailableError(absl::StrCat(
          "worker ", options_.rank, " was declared dead by the coordinator and registered again"));
    }
    return MaybeSwitch(step, summary);
  };
  h.step = [this](int64_t step) { return placement_->Step(step); };
  h.comm_clock = [this] { return comm_clock_.total(); };
  h.recover = [this](int64_t step, absl::Status s) -> absl::StatusOr<int64_t> {
    if (options_.coordinator == nullptr || !(PeerFailure(s) || DeclaredDead())) return s;
    return Recover(step, s);
  };
  return h;
}

absl::Status Trainer::Summarize(int64_t total, absl::Duration training, TrainSummary* summary) {
  ASSIGN_OR_RETURN(ModelState final_state, placement_->Gather(total, /*with_slots=*/false));
  for (const auto& p : final_state.params) {
    summary->param_crc32c =
        crc32c::Extend(summary->param_crc32c, p.data(), p.size() * sizeof(float));
  }
  summary->figures = placement_->Figures();
  if (memory_live_ > memory_before_) {  // resident memory training added, this worker's
    summary->figures.emplace_back("train_memory_bytes",
                                  static_cast<double>(memory_live_ - memory_before_));
    summary->figures.emplace_back("peak_memory_bytes",
                                  static_cast<double>(memory_peak_ - memory_before_));
  }
  summary->final_mode = ModeName(placement_->mode());
  summary->model = model_->spec().kind;
  summary->steps = total;
  summary->steps_per_epoch = per_epoch_;
  summary->epochs = options_.epochs;
  summary->train_seconds = absl::ToDoubleSeconds(training);
  summary->samples_per_sec =
      (total - start_step_) * static_cast<double>(options_.batch_size) / summary->train_seconds;
  return absl::OkStatus();
}

}  // namespace pscluster::modes
