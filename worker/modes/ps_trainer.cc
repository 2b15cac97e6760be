#include "worker/modes/ps_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/concurrent.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace pscluster::modes {
namespace {

std::string FormatEta(double seconds) {
  int s = static_cast<int>(seconds);
  return absl::StrCat(s / 60, "m", s % 60 < 10 ? "0" : "", s % 60, "s");
}

}  // namespace

void FinishSummary(const PsTrainerOptions& options, int64_t steps, absl::Duration train_time,
                   TrainSummary* summary) {
  summary->steps = steps;
  summary->epochs = options.epochs;
  summary->train_seconds = absl::ToDoubleSeconds(train_time);
  summary->samples_per_sec =
      steps * static_cast<double>(options.batch_size) / summary->train_seconds;
}

absl::StatusOr<std::unique_ptr<PsTrainer>> PsTrainer::Create(
    PsTrainerOptions options, const data::Dataset* train, const data::Dataset* test,
    std::unique_ptr<compute::Backend> backend) {
  std::unique_ptr<PsTrainer> t(new PsTrainer(std::move(options), train, test));
  t->backend_ = std::move(backend);
  ASSIGN_OR_RETURN(t->mlp_,
                   model::Mlp::Create(t->backend_.get(), t->options_.mlp, t->options_.batch_size));
  ASSIGN_OR_RETURN(auto batches,
                   data::BatchIterator::Create(train, t->options_.rank, t->options_.world,
                                               t->options_.batch_size, t->options_.seed));
  t->batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
  std::vector<std::string> shards = t->options_.shards;
  if (t->options_.coordinator != nullptr) {
    ASSIGN_OR_RETURN(t->view_, t->options_.coordinator->AwaitView(0, /*complete=*/true,
                                                                  t->options_.recovery_timeout));
    shards.assign(t->view_.shard_addresses().begin(), t->view_.shard_addresses().end());
  }
  RETURN_IF_ERROR(t->Connect(shards));
  RETURN_IF_ERROR(t->CreateTables());
  RETURN_IF_ERROR(t->client_->AwaitWorkers(t->options_.world, t->options_.rpc_timeout));
  for (const auto& p : t->mlp_->params()) t->host_.emplace_back(p.size);
  return t;
}

PsTrainer::PsTrainer(PsTrainerOptions options, const data::Dataset* train,
                     const data::Dataset* test)
    : options_(std::move(options)), train_(train), test_(test) {}

absl::Status PsTrainer::Connect(const std::vector<std::string>& shards) {
  PsClientOptions co;
  co.shard_addresses = shards;
  co.worker_id = options_.rank;
  co.rpc_timeout = options_.rpc_timeout;
  ASSIGN_OR_RETURN(client_, PsClient::Create(co));
  return client_->RegisterWorker();
}

absl::Status PsTrainer::CreateTables() {
  const auto& params = mlp_->params();
  const auto& layers = options_.mlp.layers;
  for (size_t i = 0; i < params.size(); ++i) {
    ps::TableSpec spec;
    spec.set_table_id(1 + i);
    spec.set_name(params[i].name);
    spec.set_size(params[i].size);
    *spec.mutable_optimizer() = options_.optimizer;
    if (options_.lr_decay < 1.0f) {
      // Tables count updates: one per step under BSP, one per worker push otherwise.
      const int64_t updates =
          batches_->batches_per_epoch() * options_.epochs *
          (options_.consistency.mode() == ps::ConsistencyConfig::BSP ? 1 : options_.world);
      spec.mutable_optimizer()->set_lr_decay_rate(options_.lr_decay);
      spec.mutable_optimizer()->set_lr_decay_steps(std::max<int64_t>(1, updates));
    }
    *spec.mutable_consistency() = options_.consistency;
    if (i % 2 == 0) {  // weights: Glorot uniform
      const int in = layers[i / 2], out = layers[i / 2 + 1];
      spec.mutable_initializer()->set_kind(ps::InitializerConfig::UNIFORM);
      spec.mutable_initializer()->set_scale(std::sqrt(6.0f / (in + out)));
      spec.mutable_initializer()->set_seed(options_.seed * 1000 + i);
    }
    RETURN_IF_ERROR(client_->CreateTable(spec));
  }
  return absl::OkStatus();
}

absl::Status PsTrainer::Pull(int64_t step) {
  RETURN_IF_ERROR(RunConcurrently(host_.size(), [&](int i) {
    return client_->PullDense(1 + i, step, absl::MakeSpan(host_[i]));
  }));
  for (size_t i = 0; i < host_.size(); ++i) mlp_->SetParam(i, host_[i].data());
  return absl::OkStatus();
}

absl::Status PsTrainer::Push(int64_t step) {
  const float scale = 1.0f / options_.world;  // shards sum the workers' gradients
  for (size_t i = 0; i < host_.size(); ++i) {
    mlp_->GetGrad(i, host_[i].data());
    for (float& g : host_[i]) g *= scale;
  }
  return RunConcurrently(host_.size(),
                         [&](int i) { return client_->PushDense(1 + i, step, host_[i]); });
}

absl::StatusOr<double> PsTrainer::EvaluateTest() {
  ASSIGN_OR_RETURN(model::StepResult r,
                   mlp_->Evaluate(test_->x.data(), test_->y.data(), test_->size));
  return static_cast<double>(r.correct) / r.examples;
}

void PsTrainer::ReportProgress(int64_t step, double loss, double rate) {
  if (options_.coordinator == nullptr) return;
  absl::Status s = options_.coordinator->ReportProgress(view_.version(), step, loss, rate);
  if (!s.ok())
    std::fprintf(stderr, "worker %d: progress report: %s\n", options_.rank, s.ToString().c_str());
}

absl::StatusOr<coord::ClusterView> PsTrainer::AwaitHealedView() {
  auto incarnations = [](const coord::ClusterView& v) {
    std::vector<int64_t> out;
    for (const auto& m : v.members()) {
      if (m.role() == coord::SHARD) out.push_back(m.incarnation());
    }
    return out;
  };
  const std::vector<int64_t> before = incarnations(view_);
  const absl::Time deadline = absl::Now() + options_.recovery_timeout;
  int64_t version = view_.version();
  while (true) {  // each AwaitView blocks until the next change of the view
    ASSIGN_OR_RETURN(coord::ClusterView v,
                     options_.coordinator->AwaitView(version + 1, false, deadline - absl::Now()));
    if (v.complete() && incarnations(v) != before) return v;
    version = v.version();
  }
}

absl::StatusOr<int64_t> PsTrainer::Recover(int n, int64_t failed_step, const absl::Status& cause) {
  CoordinatorClient* c = options_.coordinator;
  const int rank = options_.rank;
  std::printf("worker %d: step %lld failed (%s); waiting for the shard to come back\n", rank,
              static_cast<long long>(failed_step), cause.ToString().c_str());
  std::fflush(stdout);
  const std::string prefix = absl::StrCat("recovery/", n, "/");
  RETURN_IF_ERROR(c->KvPut(absl::StrCat(prefix, "stopped/", rank), ""));
  ASSIGN_OR_RETURN(view_, AwaitHealedView());
  RETURN_IF_ERROR(Connect({view_.shard_addresses().begin(), view_.shard_addresses().end()}));
  int64_t back_to = 0;
  if (rank == 0) {  // once every worker has stopped, roll every shard back
    for (int r = 0; r < options_.world; ++r) {
      RETURN_IF_ERROR(
          c->KvGet(absl::StrCat(prefix, "stopped/", r), true, options_.recovery_timeout).status());
    }
    auto latest = client_->LatestCompleteSnapshot();
    if (!latest.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no checkpoint to roll back to (", latest.status().message(),
                       "); run with --snapshot_every_epochs and --data_dir on the shards"));
    }
    back_to = *latest;
    RETURN_IF_ERROR(client_->Restore(back_to));
    RETURN_IF_ERROR(c->KvPut(prefix + "step", absl::StrCat(back_to)));
  } else {
    ASSIGN_OR_RETURN(std::string value, c->KvGet(prefix + "step", true, options_.recovery_timeout));
    if (!absl::SimpleAtoi(value, &back_to))
      return absl::DataLossError("bad rollback step " + value);
  }
  const int64_t per_epoch = batches_->batches_per_epoch();
  RETURN_IF_ERROR(batches_->Seek({back_to / per_epoch, back_to % per_epoch}));
  std::printf("worker %d: rolled back from step %lld to the checkpoint of step %lld\n", rank,
              static_cast<long long>(failed_step), static_cast<long long>(back_to));
  std::fflush(stdout);
  return back_to;
}

absl::StatusOr<TrainSummary> PsTrainer::Run() {
  TrainSummary summary;
  const int64_t per_epoch = batches_->batches_per_epoch();
  const int64_t total = per_epoch * options_.epochs;
  data::Batch batch;
  absl::Time start = absl::Now(), last_report = start;
  absl::Duration eval_time;
  double epoch_loss = 0;
  int64_t epoch_steps = 0;
  // One step: pull, compute, push; at an epoch's end, checkpoint and evaluate.
  auto run_step = [&](int64_t step) -> absl::Status {
    RETURN_IF_ERROR(Pull(step));
    batches_->Next(&batch);
    ASSIGN_OR_RETURN(model::StepResult r,
                     mlp_->ForwardBackward(batch.x.data(), batch.y.data(), batch.size));
    RETURN_IF_ERROR(Push(step));
    epoch_loss += r.loss;
    ++epoch_steps;
    const absl::Time now = absl::Now();
    if (now - last_report >= options_.progress_every || step + 1 == total) {
      double seconds = absl::ToDoubleSeconds(now - start - eval_time);
      double rate = (step + 1) * static_cast<double>(options_.batch_size) / seconds;
      std::printf("worker %d: epoch %lld/%d step %lld/%lld loss %.4f %.0f samples/s ETA %s\n",
                  options_.rank, static_cast<long long>(step / per_epoch + 1), options_.epochs,
                  static_cast<long long>(step + 1), static_cast<long long>(total),
                  epoch_loss / epoch_steps, rate,
                  FormatEta((total - step - 1) * options_.batch_size / rate).c_str());
      std::fflush(stdout);
      ReportProgress(step + 1, epoch_loss / epoch_steps, rate);
      last_report = now;
    }
    if ((step + 1) % per_epoch != 0) return absl::OkStatus();
    summary.final_loss = epoch_loss / epoch_steps;
    epoch_loss = 0;
    epoch_steps = 0;
    const int64_t epoch = (step + 1) / per_epoch;
    if (options_.rank == 0 && options_.snapshot_every_epochs > 0 &&
        epoch % options_.snapshot_every_epochs == 0) {
      // Captured at step + 1 and written in the background. A failure (say, another
      // snapshot still being written) costs this checkpoint, not the training run.
      if (absl::Status s = client_->Snapshot(step + 1); s.ok()) {
        summary.snapshots.push_back(step + 1);
      } else {
        std::printf("worker %d: snapshot of step %lld skipped: %s\n", options_.rank,
                    static_cast<long long>(step + 1), s.ToString().c_str());
      }
    }
    if (options_.evaluate && test_ != nullptr) {
      absl::Time t0 = absl::Now();
      RETURN_IF_ERROR(Pull(step + 1));  // the parameters after this epoch
      ASSIGN_OR_RETURN(summary.test_accuracy, EvaluateTest());
      eval_time += absl::Now() - t0;
      std::printf("worker %d: epoch %lld test accuracy %.4f\n", options_.rank,
                  static_cast<long long>(epoch), summary.test_accuracy);
      std::fflush(stdout);
      if (options_.coordinator != nullptr) {  // feeds keep-the-best checkpoints
        absl::Status r = options_.coordinator->ReportProgress(
            view_.version(), step + 1, summary.final_loss, 0, summary.test_accuracy);
        if (!r.ok())
          std::fprintf(stderr, "worker %d: metric report: %s\n", options_.rank,
                       r.ToString().c_str());
      }
    }
    return absl::OkStatus();
  };
  for (int64_t step = 0; step < total;) {
    absl::Status s = run_step(step);
    if (s.ok()) {
      ++step;
      continue;
    }
    const bool shard_failure = s.code() == absl::StatusCode::kUnavailable ||
                               s.code() == absl::StatusCode::kDeadlineExceeded ||
                               s.code() == absl::StatusCode::kCancelled;
    if (options_.coordinator == nullptr || !shard_failure) return s;
    ASSIGN_OR_RETURN(int64_t back_to, Recover(summary.rollbacks.size() + 1, step, s));
    summary.rollbacks.emplace_back(step, back_to);
    step = back_to;
    epoch_loss = 0;
    epoch_steps = 0;
  }
  RETURN_IF_ERROR(Pull(total));  // the final parameters, for the checksum
  for (const auto& p : host_) {
    summary.param_crc32c = crc32c::Extend(summary.param_crc32c, p.data(), p.size() * sizeof(float));
  }
  FinishSummary(options_, total, absl::Now() - start - eval_time, &summary);
  return summary;
}

}  // namespace pscluster::modes
