#include "worker/modes/allreduce_trainer.h"

#include <cmath>
#include <cstdio>

#include "common/status_macros.h"
#include "server/ps/initializer.h"
#include "server/ps/table.h"

namespace pscluster::modes {

std::vector<std::vector<float>> AllReduceTrainer::InitialParams(const model::MlpOptions& mlp,
                                                                uint64_t seed) {
  std::vector<std::vector<float>> out;
  for (size_t l = 0; l + 1 < mlp.layers.size(); ++l) {
    const int in = mlp.layers[l], outs = mlp.layers[l + 1];
    std::vector<float> w(static_cast<size_t>(in) * outs), b(outs, 0.0f);
    ps::InitializerConfig init;  // as PsTrainer::CreateTables configures table 1 + 2l
    init.set_kind(ps::InitializerConfig::UNIFORM);
    init.set_scale(std::sqrt(6.0f / (in + outs)));
    init.set_seed(seed * 1000 + 2 * l);
    ps::InitDense(init, 0, absl::MakeSpan(w));
    out.push_back(std::move(w));
    out.push_back(std::move(b));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<AllReduceTrainer>> AllReduceTrainer::Create(
    PsTrainerOptions options, const data::Dataset* train, const data::Dataset* test,
    std::unique_ptr<compute::Backend> backend, std::unique_ptr<collective::Communicator> comm) {
  if (comm->rank() != options.rank || comm->size() != options.world) {
    return absl::InvalidArgumentError("the communicator's rank/size differ from the options'");
  }
  std::unique_ptr<AllReduceTrainer> t(new AllReduceTrainer());
  t->options_ = std::move(options);
  t->train_ = train;
  t->test_ = test;
  t->backend_ = std::move(backend);
  t->comm_ = std::move(comm);
  ASSIGN_OR_RETURN(t->mlp_,
                   model::Mlp::Create(t->backend_.get(), t->options_.mlp, t->options_.batch_size));
  ASSIGN_OR_RETURN(auto batches,
                   data::BatchIterator::Create(train, t->options_.rank, t->options_.world,
                                               t->options_.batch_size, t->options_.seed));
  t->batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
  ps::OptimizerConfig opt = t->options_.optimizer;
  if (t->options_.lr_decay < 1.0f) {  // one optimizer update per step, as on BSP tables
    opt.set_lr_decay_rate(t->options_.lr_decay);
    opt.set_lr_decay_steps(
        std::max<int64_t>(1, t->batches_->batches_per_epoch() * t->options_.epochs));
  }
  ASSIGN_OR_RETURN(t->optimizer_, ps::MakeOptimizer(opt));
  t->params_ = InitialParams(t->options_.mlp, t->options_.seed);
  size_t total = 0;
  for (size_t i = 0; i < t->params_.size(); ++i) {
    t->mlp_->SetParam(i, t->params_[i].data());
    std::vector<std::vector<float>> slots;
    for (int k = 0; k < t->optimizer_->num_slots(); ++k) {
      slots.emplace_back(t->params_[i].size(), t->optimizer_->slot_initial_value(k));
    }
    t->slots_.push_back(std::move(slots));
    total += t->params_[i].size();
  }
  t->flat_.resize(total);
  return t;
}

absl::Status AllReduceTrainer::Step(const data::Batch& batch, int64_t step) {
  ASSIGN_OR_RETURN(model::StepResult r,
                   mlp_->ForwardBackward(batch.x.data(), batch.y.data(), batch.size));
  (void)r;
  size_t at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    mlp_->GetGrad(i, flat_.data() + at);
    at += params_[i].size();
  }
  RETURN_IF_ERROR(comm_->AllReduceSum(absl::MakeSpan(flat_)));
  const float scale = 1.0f / options_.world;  // the mean of the workers' gradients
  for (float& g : flat_) g *= scale;
  at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    float* slots[8];
    for (size_t k = 0; k < slots_[i].size(); ++k) slots[k] = slots_[i][k].data();
    optimizer_->Apply(params_[i].data(), flat_.data() + at, slots, params_[i].size(), step + 1);
    mlp_->SetParam(i, params_[i].data());
    at += params_[i].size();
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainSummary> AllReduceTrainer::Run() {
  TrainSummary summary;
  const int64_t per_epoch = batches_->batches_per_epoch();
  const int64_t total = per_epoch * options_.epochs;
  data::Batch batch;
  const absl::Time start = absl::Now();
  absl::Duration eval_time;
  for (int64_t step = 0; step < total; ++step) {
    batches_->Next(&batch);
    RETURN_IF_ERROR(Step(batch, step));
    if ((step + 1) % per_epoch != 0) continue;
    absl::Time t0 = absl::Now();
    if (options_.evaluate && test_ != nullptr) {
      ASSIGN_OR_RETURN(model::StepResult e,
                       mlp_->Evaluate(test_->x.data(), test_->y.data(), test_->size));
      summary.test_accuracy = static_cast<double>(e.correct) / e.examples;
      summary.final_loss = e.loss;
    }
    eval_time += absl::Now() - t0;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start - eval_time);
    std::printf(
        "worker %d (allreduce): epoch %lld/%d step %lld/%lld test accuracy %.4f %.0f samples/s\n",
        options_.rank, static_cast<long long>((step + 1) / per_epoch), options_.epochs,
        static_cast<long long>(step + 1), static_cast<long long>(total), summary.test_accuracy,
        (step + 1) * static_cast<double>(options_.batch_size) / seconds);
    std::fflush(stdout);
  }
  FinishSummary(options_, total, absl::Now() - start - eval_time, &summary);
  return summary;
}

}  // namespace pscluster::modes
