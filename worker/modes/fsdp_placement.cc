// FSDP: worker r of M owns elements [r*c, (r+1)*c) of every tensor of n elements
// (c = ceil(n / M), the last owner's share padded), with their optimizer slots. The model
// keeps ONE layer's parameters and gradients (InstanceOptions::share_layer_buffers): before a
// layer's forward and again before its backward the owners all-gather it (not for a backward
// that reads no parameters: the MLP's first layer's, the GPT's embedding's); after its backward its
// gradient is reduce-scattered and every worker steps its own share at once. So a worker
// holds 1/M of the state plus one layer.
// With fsdp_reshard_after_forward false (PyTorch's SHARD_GRAD_OP) the model keeps every
// layer's buffers and a layer gathered for its forward stays for its backward: one all-gather
// per layer and step, the whole model's parameters and gradients held during it. The values
// gathered are the same, so the results are the same bits.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/tensor/scale.h"
#include "worker/modes/placement_internal.h"

namespace pscluster::modes::internal {
namespace {

class FsdpPlacement final : public Placement {
 public:
  explicit FsdpPlacement(const PlacementContext& ctx)
      : ctx_(ctx), spec_(ctx.model->spec()), m_(ctx.world) {}

  absl::Status Init() {
    RETURN_IF_ERROR(coord::CheckModeFits(coord::FSDP, ModeLimitsOf(spec_), m_));
    model::InstanceOptions shared = model::WholeModel(ctx_.batch_size);
    shared.share_layer_buffers = ctx_.fsdp_reshard_after_forward;
    ASSIGN_OR_RETURN(model_, NewModel(ctx_, shared));
    ASSIGN_OR_RETURN(auto batches, DataParallelBatches(ctx_));
    batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
    size_t layer_max = 0;
    for (const auto& p : model_->params()) {
      const size_t chunk = (p.size + m_ - 1) / m_;
      size_.push_back(p.size);
      chunk_.push_back(chunk);
      own_.emplace_back(chunk, 0.0f);
      slots_.emplace_back(ctx_.optimizer->num_slots(), std::vector<float>(chunk));
      full_bytes_ += p.size * sizeof(float) * (1 + ctx_.optimizer->num_slots());
    }
    for (int l = 0; l < spec_.num_layers(); ++l) layer_max = std::max(layer_max, m_ * Block(l));
    gathered_.resize(layer_max);
    layer_.resize(layer_max);
    mine_.resize(layer_max / m_);
    // The top layer's backward follows its forward at once: its gathered copy is still
    // loaded, so only the other layers are gathered again (and none without resharding:
    // every layer's buffers hold what its forward gathered).
    hooks_.before = [this](int layer, bool backward) {
      if (layer == loaded_ || (backward && !ctx_.fsdp_reshard_after_forward)) {
        return absl::OkStatus();
      }
      return GatherLayer(layer);
    };
    hooks_.after_backward = [this](int layer) { return StepLayer(layer); };
    return absl::OkStatus();
  }

  Mode mode() const override { return coord::FSDP; }

  absl::Status Load(const ModelState& state, int64_t step) override {
    RETURN_IF_ERROR(CheckState(state, spec_, ctx_.optimizer));
    for (size_t i = 0; i < size_.size(); ++i) {
      Slice(state.params[i], i, &own_[i]);
      for (size_t k = 0; k < slots_[i].size(); ++k) Slice(state.slots[i][k], i, &slots_[i][k]);
    }
    updates_ = state.updates;
    return absl::OkStatus();
  }

  absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) override {
    ModelState state;
    state.updates = updates_;
    state.slots.resize(size_.size());
    for (size_t i = 0; i < size_.size(); ++i) {
      ASSIGN_OR_RETURN(std::vector<float> p, Unslice(own_[i], i));
      state.params.push_back(std::move(p));
      for (size_t k = 0; with_slots && k < slots_[i].size(); ++k) {
        ASSIGN_OR_RETURN(std::vector<float> s, Unslice(slots_[i][k], i));
        state.slots[i].push_back(std::move(s));
      }
    }
    return state;
  }

  absl::StatusOr<float> Step(int64_t step) override {
    BatchAt(batches_.get(), step, &batch_);
    update_ = updates_ + 1;
    loaded_ = -1;  // the own shards changed at the last step
    ASSIGN_OR_RETURN(model::StepResult r, model_->ForwardBackward(batch_.x.data(), batch_.y.data(),
                                                                  batch_.size, &hooks_));
    updates_ = update_;
    return r.loss;
  }

  std::vector<std::pair<std::string, double>> Figures() const override {
    size_t own = 0;
    for (size_t i = 0; i < size_.size(); ++i) own += chunk_[i] * (1 + slots_[i].size());
    // Host state: the own shards with their slots, plus the one-layer gather/gradient
    // buffers; the backend holds one layer's parameters and gradients (every layer's
    // without resharding, counted here).
    double held = (own + gathered_.size() + layer_.size() + mine_.size()) * sizeof(float);
    if (!ctx_.fsdp_reshard_after_forward) {
      for (size_t n : size_) held += 2.0 * n * sizeof(float);
    }
    return {{"fsdp_state_bytes", static_cast<double>(own * sizeof(float))},
            {"fsdp_held_bytes", held},
            {"replica_state_bytes", static_cast<double>(full_bytes_)}};
  }

 private:
  // Rank r's share of tensor i, padded with zeros.
  void Slice(const std::vector<float>& full, size_t i, std::vector<float>* out) const {
    const size_t begin = std::min(size_[i], ctx_.rank * chunk_[i]);
    const size_t end = std::min(size_[i], begin + chunk_[i]);
    std::fill(out->begin(), out->end(), 0.0f);
    std::copy(full.begin() + begin, full.begin() + end, out->begin());
  }

  absl::StatusOr<std::vector<float>> Unslice(const std::vector<float>& own, size_t i) {
    std::vector<float> all(chunk_[i] * m_);
    RETURN_IF_ERROR(ctx_.comm->AllGather(own, absl::MakeSpan(all)));
    all.resize(size_[i]);
    return all;
  }

  // Layer l's tensors' shares, one after the other: the floats one owner holds of it.
  size_t Block(int layer) const {
    size_t block = 0;
    for (int i : spec_.layer_params[layer]) block += chunk_[i];
    return block;
  }

  // Layer l's tensors from every owner, into the model's one layer buffer. Owner r's block
  // holds its share of each of the layer's tensors in turn; the layer buffer holds the
  // tensors whole, one after the other (each padded to m_ shares).
  absl::Status GatherLayer(int layer) {
    const std::vector<int>& tensors = spec_.layer_params[layer];
    const size_t block = Block(layer);
    size_t at = 0;
    for (int i : tensors) {
      std::copy(own_[i].begin(), own_[i].end(), mine_.begin() + at);
      at += chunk_[i];
    }
    RETURN_IF_ERROR(ctx_.comm->AllGather(absl::MakeConstSpan(mine_.data(), block),
                                         absl::MakeSpan(gathered_.data(), block * m_)));
    for (size_t r = 0; r < m_; ++r) {
      const float* from = gathered_.data() + r * block;
      float* to = layer_.data();
      for (int i : tensors) {
        std::copy_n(from, chunk_[i], to + r * chunk_[i]);
        from += chunk_[i];
        to += chunk_[i] * m_;
      }
    }
    float* whole = layer_.data();
    for (int i : tensors) {
      model_->SetParam(i, whole);
      whole += chunk_[i] * m_;
    }
    loaded_ = layer;
    return absl::OkStatus();
  }

  // Layer l's gradient: reduce-scatter to the owners, who step their share at once.
  absl::Status StepLayer(int layer) {
    const std::vector<int>& tensors = spec_.layer_params[layer];
    const size_t block = Block(layer);
    std::fill(layer_.begin(), layer_.begin() + block * m_, 0.0f);  // the padding
    float* whole = layer_.data();
    for (int i : tensors) {
      model_->GetGrad(i, whole);
      whole += chunk_[i] * m_;
    }
    for (size_t r = 0; r < m_; ++r) {  // owner-major: owner r's share of each tensor in turn
      float* to = gathered_.data() + r * block;
      const float* from = layer_.data();
      for (int i : tensors) {
        std::copy_n(from + r * chunk_[i], chunk_[i], to);
        to += chunk_[i];
        from += chunk_[i] * m_;
      }
    }
    RETURN_IF_ERROR(ctx_.comm->ReduceScatterSum(absl::MakeConstSpan(gathered_.data(), block * m_),
                                                absl::MakeSpan(mine_.data(), block)));
    const float scale = 1.0f / m_;  // the mean of the workers' gradients
    core::Scale(absl::MakeSpan(mine_.data(), block), scale);
    size_t at = 0;
    for (int i : tensors) {
      const size_t begin = std::min(size_[i], ctx_.rank * chunk_[i]);
      const size_t n = std::min(size_[i], begin + chunk_[i]) - begin;  // the real elements
      ApplyOptimizer(*ctx_.optimizer, own_[i].data(), mine_.data() + at, slots_[i], n, update_);
      at += chunk_[i];
    }
    return absl::OkStatus();
  }

  const PlacementContext ctx_;
  const model::ModelSpec& spec_;
  const size_t m_;  // workers
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::Batch batch_;
  model::LayerHooks hooks_;
  std::vector<size_t> size_, chunk_;                    // per tensor: elements, share per worker
  std::vector<std::vector<float>> own_;                 // per tensor: this worker's share
  std::vector<std::vector<std::vector<float>>> slots_;  // per tensor, per slot: its share
  // One layer's worth each: the owners' shares (all-gather output, reduce-scatter input),
  // the layer's weight then bias, and this worker's share of it.
  std::vector<float> gathered_, layer_, mine_;
  int loaded_ = -1;  // the layer whose parameters the model holds (-1: none current)
  int64_t updates_ = 0, update_ = 0;
  size_t full_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Placement>> MakeFsdpPlacement(const PlacementContext& ctx) {
  if (ctx.comm == nullptr || ctx.optimizer == nullptr || ctx.model == nullptr) {
    return absl::FailedPreconditionError(
        "fsdp mode needs a communicator, an optimizer and a model");
  }
  auto p = std::make_unique<FsdpPlacement>(ctx);
  RETURN_IF_ERROR(p->Init());
  return std::unique_ptr<Placement>(std::move(p));
}

}  // namespace pscluster::modes::internal
