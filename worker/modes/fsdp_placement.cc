// FSDP: worker r of M owns elements [r*c, (r+1)*c) of every tensor of n elements
// (c = ceil(n / M), the last owner's share padded), with their optimizer slots. The model
// keeps ONE layer's parameters and gradients (InstanceOptions::share_layer_buffers): before a
// layer's forward and again before its backward the owners all-gather it (not for a backward
// that reads no parameters: the MLP's first layer's, the GPT's embedding's); after its
// backward its gradient is reduce-scattered and every worker steps its own share at once. So
// a worker holds 1/M of the state plus one layer, and the units below.
// Units (PyTorch FSDP's size-based wrapping): consecutive layers smaller than the largest
// one are gathered as one unit at its first layer's forward and kept, whole, to its last
// layer's backward; their gradients are kept until then and reduce-scattered together. A
// collective's latency, not its bytes, is the cost of a small layer: the MLP 784-256-128-64-10
// makes 2 all-gathers and 2 reduce-scatters a step so, instead of 6 and 4. The units kept
// hold at most as many parameters as the largest layer (the first layers in order that fit).
// With fsdp_reshard_after_forward false (PyTorch's SHARD_GRAD_OP) the model keeps every
// layer's buffers and a layer gathered for its forward stays for its backward: one all-gather
// per unit and step, the whole model's parameters and gradients held during it. The values
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
    for (const auto& p : model_->params()) {
      const size_t chunk = (p.size + m_ - 1) / m_;
      size_.push_back(p.size);
      chunk_.push_back(chunk);
      own_.emplace_back(chunk, 0.0f);
      slots_.emplace_back(ctx_.optimizer->num_slots(), std::vector<float>(chunk));
      full_bytes_ += p.size * sizeof(float) * (1 + ctx_.optimizer->num_slots());
    }
    MakeUnits();
    // The top layer's backward follows its forward at once: its gathered copy is still
    // loaded, so only the other layers are loaded again (and none without resharding:
    // every layer's buffers hold what its forward loaded).
    hooks_.before = [this](int layer, bool backward) -> absl::Status {
      Unit& u = units_[unit_of_[layer]];
      if (u.kept() && !backward && layer == u.layers.front()) {
        RETURN_IF_ERROR(AllGather(u, u.values.data()));
      }
      if (layer == loaded_ || (backward && !ctx_.fsdp_reshard_after_forward)) {
        return absl::OkStatus();
      }
      if (!u.kept()) RETURN_IF_ERROR(AllGather(u, layer_.data()));
      for (int i : spec_.layer_params[layer]) {
        model_->SetParam(i, (u.kept() ? u.values.data() : layer_.data()) + at_[i]);
      }
      loaded_ = layer;
      return absl::OkStatus();
    };
    hooks_.after_backward = [this](int layer) -> absl::Status {
      Unit& u = units_[unit_of_[layer]];
      float* whole = u.kept() ? u.grads.data() : layer_.data();
      if (!u.kept()) std::fill(layer_.begin(), layer_.begin() + u.block * m_, 0.0f);  // padding
      for (int i : spec_.layer_params[layer]) model_->GetGrad(i, whole + at_[i]);
      if (layer != u.layers.front()) return absl::OkStatus();  // the unit's last backward
      return ReduceScatterAndStep(u, whole);
    };
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
    collectives_ = 0;
    ASSIGN_OR_RETURN(model::StepResult r, model_->ForwardBackward(batch_.x.data(), batch_.y.data(),
                                                                  batch_.size, &hooks_));
    updates_ = update_;
    last_collectives_ = collectives_;
    return r.loss;
  }

  std::vector<std::pair<std::string, double>> Figures() const override {
    size_t own = 0;
    for (size_t i = 0; i < size_.size(); ++i) own += chunk_[i] * (1 + slots_[i].size());
    // Host state: the own shards with their slots, the kept units and the one-layer
    // gather/gradient buffers; the backend holds one layer's parameters and gradients
    // (every layer's without resharding, counted here).
    size_t buffers = gathered_.size() + layer_.size() + mine_.size();
    for (const Unit& u : units_) buffers += u.values.size() + u.grads.size();
    double held = (own + buffers) * sizeof(float);
    if (!ctx_.fsdp_reshard_after_forward) {
      for (size_t n : size_) held += 2.0 * n * sizeof(float);
    }
    return {{"fsdp_state_bytes", static_cast<double>(own * sizeof(float))},
            {"fsdp_held_bytes", held},
            {"fsdp_collectives_per_step", static_cast<double>(last_collectives_)},
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

  // Layers gathered and reduce-scattered together: one layer, or (kept) several.
  struct Unit {
    std::vector<int> layers;   // consecutive, ascending
    std::vector<int> tensors;  // the layers' tensors in turn
    size_t block = 0;          // the floats one owner holds of it: its tensors' shares
    // Kept units: the tensors whole (each padded to m_ shares, at at_), parameters from the
    // forward of the first layer to the backward of the last, and gradients.
    std::vector<float> values, grads;
    bool kept() const { return layers.size() > 1; }
  };

  size_t LayerParams(int layer) const {
    size_t n = 0;
    for (int i : spec_.layer_params[layer]) n += size_[i];
    return n;
  }

  // Consecutive layers smaller than the largest one form kept units, while the kept units
  // hold no more parameters than the largest layer; every other layer is a unit of its own.
  void MakeUnits() {
    size_t largest = 0;
    for (int l = 0; l < spec_.num_layers(); ++l) largest = std::max(largest, LayerParams(l));
    size_t kept = 0;       // parameters of the kept units so far
    std::vector<int> run;  // consecutive small layers, not yet a unit
    size_t run_params = 0;
    auto close_run = [&] {
      if (run.empty()) return;
      if (run.size() > 1) kept += run_params;
      units_.push_back({run});
      run.clear();
      run_params = 0;
    };
    for (int l = 0; l < spec_.num_layers(); ++l) {
      const size_t n = LayerParams(l);
      if (n < largest && kept + run_params + n > largest) close_run();
      if (n < largest && kept + run_params + n <= largest) {
        run.push_back(l);
        run_params += n;
      } else {
        close_run();
        units_.push_back({{l}});
      }
    }
    close_run();
    // A unit of one layer is not kept: its values and gradients pass through layer_.
    at_.assign(size_.size(), 0);
    size_t whole_max = 0, block_max = 0;
    for (size_t k = 0; k < units_.size(); ++k) {
      Unit& u = units_[k];
      size_t whole = 0;
      for (int l : u.layers) {
        unit_of_.push_back(static_cast<int>(k));
        for (int i : spec_.layer_params[l]) {
          u.tensors.push_back(i);
          u.block += chunk_[i];
          at_[i] = whole;
          whole += chunk_[i] * m_;
        }
      }
      if (u.kept()) {
        u.values.resize(whole);
        u.grads.assign(whole, 0.0f);  // the padding stays zero
      } else {
        whole_max = std::max(whole_max, whole);
      }
      block_max = std::max(block_max, u.block);
    }
    layer_.resize(whole_max);
    gathered_.resize(block_max * m_);
    mine_.resize(block_max);
  }

  // Unit u's tensors from every owner into `whole`. Owner r's block holds its share of each
  // of the unit's tensors in turn; `whole` holds the tensors whole (at at_).
  absl::Status AllGather(const Unit& u, float* whole) {
    size_t at = 0;
    for (int i : u.tensors) {
      std::copy(own_[i].begin(), own_[i].end(), mine_.begin() + at);
      at += chunk_[i];
    }
    ++collectives_;
    RETURN_IF_ERROR(ctx_.comm->AllGather(absl::MakeConstSpan(mine_.data(), u.block),
                                         absl::MakeSpan(gathered_.data(), u.block * m_)));
    for (size_t r = 0; r < m_; ++r) {
      const float* from = gathered_.data() + r * u.block;
      for (int i : u.tensors) {
        std::copy_n(from, chunk_[i], whole + at_[i] + r * chunk_[i]);
        from += chunk_[i];
      }
    }
    return absl::OkStatus();
  }

  // Unit u's gradient (`whole`, padding zero): reduce-scatter to the owners, who step their
  // share at once.
  absl::Status ReduceScatterAndStep(const Unit& u, const float* whole) {
    for (size_t r = 0; r < m_; ++r) {  // owner-major: owner r's share of each tensor in turn
      float* to = gathered_.data() + r * u.block;
      for (int i : u.tensors) {
        std::copy_n(whole + at_[i] + r * chunk_[i], chunk_[i], to);
        to += chunk_[i];
      }
    }
    ++collectives_;
    RETURN_IF_ERROR(ctx_.comm->ReduceScatterSum(absl::MakeConstSpan(gathered_.data(), u.block * m_),
                                                absl::MakeSpan(mine_.data(), u.block)));
    const float scale = 1.0f / m_;  // the mean of the workers' gradients
    core::Scale(absl::MakeSpan(mine_.data(), u.block), scale);
    size_t at = 0;
    for (int i : u.tensors) {
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
  std::vector<Unit> units_;
  std::vector<int> unit_of_;  // per layer: its unit
  std::vector<size_t> at_;    // per tensor: where it starts in its unit's whole tensors
  // The largest unit's worth: the owners' shares (all-gather output, reduce-scatter input)
  // and this worker's share; the largest unit not kept, whole (values, then gradients).
  std::vector<float> gathered_, mine_, layer_;
  int loaded_ = -1;  // the layer whose parameters the model holds (-1: none current)
  int64_t updates_ = 0, update_ = 0;
  size_t full_bytes_ = 0;
  int collectives_ = 0,
      last_collectives_ = 0;  // all-gathers and reduce-scatters, this step and the last
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
