// PS and ALLREDUCE placements, and what every placement shares.
#include "worker/modes/placement.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/concurrent.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"
#include "worker/modes/placement_internal.h"

namespace pscluster::modes {

ps::TableSpec TableFor(const model::MlpOptions& mlp, int param, const ps::OptimizerConfig& opt,
                       const ps::ConsistencyConfig& consistency, uint64_t seed) {
  const int layer = param / 2, in = mlp.layers[layer], out = mlp.layers[layer + 1];
  ps::TableSpec spec;
  spec.set_table_id(1 + param);
  spec.set_name(absl::StrCat("fc", layer, param % 2 == 0 ? ".weight" : ".bias"));
  spec.set_size(param % 2 == 0 ? static_cast<uint64_t>(in) * out : out);
  *spec.mutable_optimizer() = opt;
  *spec.mutable_consistency() = consistency;
  if (param % 2 == 0) {  // weights: Glorot uniform, seeded per tensor; biases: zero
    spec.mutable_initializer()->set_kind(ps::InitializerConfig::UNIFORM);
    spec.mutable_initializer()->set_scale(std::sqrt(6.0f / (in + out)));
    spec.mutable_initializer()->set_seed(seed * 1000 + param);
  }
  return spec;
}

ModelState InitialState(const model::MlpOptions& mlp, uint64_t seed, const core::Optimizer& opt) {
  ModelState state;
  const int params = 2 * (static_cast<int>(mlp.layers.size()) - 1);
  for (int i = 0; i < params; ++i) {
    const ps::TableSpec spec = TableFor(mlp, i, {}, {}, seed);
    std::vector<float> values(spec.size(), 0.0f);
    if (spec.has_initializer()) core::InitDense(spec.initializer(), 0, absl::MakeSpan(values));
    std::vector<std::vector<float>> slots;
    for (int k = 0; k < opt.num_slots(); ++k) {
      slots.emplace_back(values.size(), opt.slot_initial_value(k));
    }
    state.params.push_back(std::move(values));
    state.slots.push_back(std::move(slots));
  }
  return state;
}

absl::Status ImportState(PsClient* ps, const ModelState& state, int64_t step) {
  return RunConcurrently(state.params.size(), [&](int i) {
    std::vector<absl::Span<const float>> slots;
    for (const auto& s : state.slots[i]) slots.emplace_back(s);
    return ps->ImportDense(1 + i, step, state.updates, state.params[i], slots);
  });
}

namespace internal {

absl::Status CheckState(const ModelState& state, const model::MlpOptions& mlp,
                        const core::Optimizer* opt) {
  const size_t params = 2 * (mlp.layers.size() - 1);
  if (state.params.size() != params || state.slots.size() != params) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state holds ", state.params.size(), " tensors, the model ", params));
  }
  for (size_t i = 0; i < params; ++i) {
    const size_t n = TableFor(mlp, i, {}, {}, 0).size();
    if (state.params[i].size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " holds ", state.params[i].size(), " floats, not ", n));
    }
    if (opt != nullptr && state.slots[i].size() != static_cast<size_t>(opt->num_slots())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " has ", state.slots[i].size(),
                                                     " optimizer slots, the optimizer ",
                                                     opt->num_slots()));
    }
  }
  return absl::OkStatus();
}

void ApplyOptimizer(const core::Optimizer& opt, float* w, const float* g,
                    std::vector<std::vector<float>>& slots, size_t n, int64_t update) {
  std::vector<float*> ptrs;
  for (auto& s : slots) ptrs.push_back(s.data());
  opt.Apply(w, g, ptrs.empty() ? nullptr : ptrs.data(), n, update);
}

absl::StatusOr<data::BatchIterator> DataParallelBatches(const PlacementContext& ctx) {
  return data::BatchIterator::Create(ctx.train, ctx.rank, ctx.world, ctx.batch_size, ctx.seed);
}

void BatchAt(data::BatchIterator* it, int64_t step, data::Batch* out) {
  const int64_t per_epoch = it->batches_per_epoch();
  (void)it->Seek({step / per_epoch, step % per_epoch});  // in range by construction
  it->Next(out);
}

}  // namespace internal

namespace {

using internal::BatchAt;

// PS: the shards hold the state; every step pulls, computes and pushes.
class PsPlacement final : public Placement {
 public:
  static absl::StatusOr<std::unique_ptr<Placement>> Create(const PlacementContext& ctx) {
    if (ctx.ps == nullptr || ctx.optimizer == nullptr) {
      return absl::FailedPreconditionError(
          "ps mode needs parameter-server shards and the tables' optimizer");
    }
    auto p = std::unique_ptr<PsPlacement>(new PsPlacement(ctx));
    ASSIGN_OR_RETURN(p->mlp_, model::Mlp::Create(ctx.backend, ctx.mlp, ctx.batch_size));
    ASSIGN_OR_RETURN(auto batches, internal::DataParallelBatches(ctx));
    p->batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
    for (const auto& param : p->mlp_->params()) {
      p->tables_.push_back(1 + p->host_.size());
      p->host_.emplace_back(param.size);
    }
    return std::unique_ptr<Placement>(std::move(p));
  }

  Mode mode() const override { return coord::PS; }

  absl::Status Load(const ModelState& state, int64_t step) override {
    RETURN_IF_ERROR(internal::CheckState(state, ctx_.mlp, nullptr));
    pulled_ = -1;
    if (ctx_.rank == 0) {  // one writer; the tables then stand at `step`
      RETURN_IF_ERROR(ImportState(ctx_.ps, state, step));
    }
    // Nobody pulls step `step` before the import landed.
    return ctx_.comm != nullptr ? ctx_.comm->Barrier() : absl::OkStatus();
  }

  absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) override {
    ModelState state;
    state.slots.resize(host_.size());
    if (!with_slots) {  // a pull at `step` (BSP: waits until the step is applied)
      if (pulled_ != step) RETURN_IF_ERROR(Pull(step));
      state.params = host_;
      return state;
    }
    for (const auto& h : host_) state.params.emplace_back(h.size());
    std::vector<int64_t> updates(host_.size());
    RETURN_IF_ERROR(RunConcurrently(host_.size(), [&](int i) -> absl::Status {
      // The tables were created with this optimizer (a shard with another refuses the export).
      state.slots[i].assign(ctx_.optimizer->num_slots(), std::vector<float>(host_[i].size()));
      std::vector<absl::Span<float>> slots;
      for (auto& s : state.slots[i]) slots.emplace_back(absl::MakeSpan(s));
      return ctx_.ps->ExportDense(1 + i, step, absl::MakeSpan(state.params[i]), slots, &updates[i]);
    }));
    state.updates = updates[0];
    return state;
  }

  absl::StatusOr<float> Step(int64_t step) override {
    if (pulled_ != step) RETURN_IF_ERROR(Pull(step));  // else the last push brought them
    BatchAt(batches_.get(), step, &batch_);
    ASSIGN_OR_RETURN(model::StepResult r,
                     mlp_->ForwardBackward(batch_.x.data(), batch_.y.data(), batch_.size));
    const float scale = 1.0f / ctx_.world;  // the shards sum the workers' gradients
    std::vector<absl::Span<const float>> grads;
    std::vector<absl::Span<float>> next;
    for (size_t i = 0; i < host_.size(); ++i) {
      mlp_->GetGrad(i, host_[i].data());
      for (float& g : host_[i]) g *= scale;
      grads.emplace_back(host_[i]);
      next.emplace_back(absl::MakeSpan(host_[i]));
    }
    // One round trip per shard: this step's gradients out, the next step's parameters back.
    pulled_ = -1;
    RETURN_IF_ERROR(ctx_.ps->PushPullDenseMany(step, tables_, grads, next));
    for (size_t i = 0; i < host_.size(); ++i) mlp_->SetParam(i, host_[i].data());
    pulled_ = step + 1;
    return r.loss;
  }

 private:
  explicit PsPlacement(const PlacementContext& ctx) : ctx_(ctx) {}

  absl::Status Pull(int64_t step) {
    std::vector<absl::Span<float>> out;
    for (auto& h : host_) out.emplace_back(absl::MakeSpan(h));
    RETURN_IF_ERROR(ctx_.ps->PullDenseMany(step, tables_, out));  // one RPC per shard
    for (size_t i = 0; i < host_.size(); ++i) mlp_->SetParam(i, host_[i].data());
    pulled_ = step;
    return absl::OkStatus();
  }

  const PlacementContext ctx_;
  std::unique_ptr<model::Mlp> mlp_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::Batch batch_;
  std::vector<std::vector<float>> host_;  // per parameter: pulled values, then gradients
  std::vector<uint32_t> tables_;          // the parameters' table ids
  int64_t pulled_ = -1;  // the step whose parameters the model holds (-1: none known)
};

// ALLREDUCE: a replica per worker; one flat all-reduce of the gradients per step.
class AllReducePlacement final : public Placement {
 public:
  static absl::StatusOr<std::unique_ptr<Placement>> Create(const PlacementContext& ctx) {
    if (ctx.comm == nullptr || ctx.optimizer == nullptr) {
      return absl::FailedPreconditionError("allreduce mode needs a communicator and an optimizer");
    }
    auto p = std::unique_ptr<AllReducePlacement>(new AllReducePlacement(ctx));
    ASSIGN_OR_RETURN(p->mlp_, model::Mlp::Create(ctx.backend, ctx.mlp, ctx.batch_size));
    ASSIGN_OR_RETURN(auto batches, internal::DataParallelBatches(ctx));
    p->batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
    // Gradients in backward order (the last layer's first), cut into buckets of at most
    // bucket_bytes at tensor boundaries (a larger tensor is a bucket of its own).
    const auto& params = p->mlp_->params();
    size_t at = 0, bucket_begin = 0;
    p->offset_.resize(params.size());
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      if (at > bucket_begin && (at + params[i].size - bucket_begin) * sizeof(float) >
                                   std::max<size_t>(ctx.bucket_bytes, 1)) {
        p->buckets_.push_back({bucket_begin, at});
        bucket_begin = at;
      }
      p->offset_[i] = at;
      at += params[i].size;
    }
    p->buckets_.push_back({bucket_begin, at});
    p->flat_.resize(at);
    p->hooks_.after_backward = [raw = p.get()](int layer) { return raw->BucketsReady(layer); };
    return std::unique_ptr<Placement>(std::move(p));
  }

  Mode mode() const override { return coord::ALLREDUCE; }

  std::vector<std::pair<std::string, double>> Figures() const override {
    return {{"allreduce_buckets", static_cast<double>(buckets_.size())}};
  }

  absl::Status Load(const ModelState& state, int64_t step) override {
    RETURN_IF_ERROR(internal::CheckState(state, ctx_.mlp, ctx_.optimizer));
    state_ = state;
    for (size_t i = 0; i < state_.params.size(); ++i) mlp_->SetParam(i, state_.params[i].data());
    return absl::OkStatus();
  }

  absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) override {
    if (with_slots) return state_;
    ModelState params;
    params.params = state_.params;
    params.slots.resize(state_.params.size());
    params.updates = state_.updates;
    return params;
  }

  absl::StatusOr<float> Step(int64_t step) override {
    BatchAt(batches_.get(), step, &batch_);
    next_bucket_ = 0;
    // Each bucket is all-reduced as soon as the backward pass has filled it.
    ASSIGN_OR_RETURN(model::StepResult r,
                     mlp_->ForwardBackward(batch_.x.data(), batch_.y.data(), batch_.size, &hooks_));
    if (next_bucket_ != buckets_.size()) return absl::InternalError("a bucket was not reduced");
    const float scale = 1.0f / ctx_.world;  // the mean of the workers' gradients
    for (float& g : flat_) g *= scale;
    ++state_.updates;
    for (size_t i = 0; i < state_.params.size(); ++i) {
      internal::ApplyOptimizer(*ctx_.optimizer, state_.params[i].data(), flat_.data() + offset_[i],
                               state_.slots[i], state_.params[i].size(), state_.updates);
      mlp_->SetParam(i, state_.params[i].data());
    }
    return r.loss;
  }

 private:
  explicit AllReducePlacement(const PlacementContext& ctx) : ctx_(ctx) {}

  // Layer `layer`'s backward is done: its gradients into flat_, then every bucket that is
  // now complete (flat_ holds the layers top down) all-reduced.
  absl::Status BucketsReady(int layer) {
    for (int i : {2 * layer + 1, 2 * layer}) mlp_->GetGrad(i, flat_.data() + offset_[i]);
    const size_t filled = offset_[2 * layer] + mlp_->params()[2 * layer].size;
    for (; next_bucket_ < buckets_.size() && buckets_[next_bucket_].second <= filled;
         ++next_bucket_) {
      const auto [begin, end] = buckets_[next_bucket_];
      RETURN_IF_ERROR(ctx_.comm->AllReduceSum(absl::MakeSpan(flat_.data() + begin, end - begin)));
    }
    return absl::OkStatus();
  }

  const PlacementContext ctx_;
  std::unique_ptr<model::Mlp> mlp_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::Batch batch_;
  ModelState state_;            // the replica
  std::vector<float> flat_;     // every gradient, the last layer's first
  std::vector<size_t> offset_;  // per parameter: where its gradient starts in flat_
  std::vector<std::pair<size_t, size_t>> buckets_;  // [begin, end) in flat_, in order
  size_t next_bucket_ = 0;
  model::LayerHooks hooks_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Placement>> MakePlacement(Mode mode, const PlacementContext& ctx) {
  switch (mode) {
    case coord::PS:
      return PsPlacement::Create(ctx);
    case coord::ALLREDUCE:
      return AllReducePlacement::Create(ctx);
    case coord::FSDP:
      return internal::MakeFsdpPlacement(ctx);
    case coord::PIPELINE:
      return internal::MakePipelinePlacement(ctx);
    default:
      return coord::CheckMode("mode", mode);
  }
}

}  // namespace pscluster::modes
