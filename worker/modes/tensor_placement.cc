// TENSOR: tensor parallelism (Megatron-LM) over all M workers. Every worker runs the same
// global batch (world * batch_size examples) through its part of every layer
// (model::TensorSplit: attention heads and MLP units column- then row-parallel, the
// embedding by vocabulary); the model all-reduces partial activations and input gradients
// through the hooks below. Each worker holds and steps its part of every split tensor and
// its own copy of every replicated one: identical inputs give identical gradients on every
// worker, so the copies stay equal with no gradient communication. A worker holds about
// 1/M of the split tensors (the bulk of a transformer) and their optimizer state.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/modes/placement_internal.h"

namespace pscluster::modes::internal {
namespace {

class TensorPlacement final : public Placement {
 public:
  explicit TensorPlacement(const PlacementContext& ctx)
      : ctx_(ctx), spec_(ctx.model->spec()), m_(ctx.world) {}

  absl::Status Init() {
    RETURN_IF_ERROR(coord::CheckModeFits(coord::TENSOR, ModeLimitsOf(spec_), m_));
    const int global = ctx_.world * ctx_.batch_size;
    model::InstanceOptions part = model::WholeModel(global);
    part.tensor_rank = ctx_.rank;
    part.tensor_size = m_;
    ASSIGN_OR_RETURN(model_, NewModel(ctx_, part));
    // Every worker sees the whole global batch: the data-parallel ranks' batches in order.
    ASSIGN_OR_RETURN(auto batches,
                     data::BatchIterator::Create(ctx_.train, 0, 1, global, ctx_.seed));
    batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
    hooks_.all_reduce_sum = [this](float* data, size_t n) { return AllReduce(data, n); };
    hooks_.all_gather_columns = [this](const float* local, int rows, int cols, float* out) {
      return AllGatherColumns(local, rows, cols, out);
    };
    for (const model::Model::Param& p : model_->params()) {
      held_bytes_ += p.size * sizeof(float) * (1 + ctx_.optimizer->num_slots());
    }
    for (const model::TensorSpec& t : spec_.params) {
      replica_bytes_ += t.size() * sizeof(float) * (1 + ctx_.optimizer->num_slots());
    }
    return absl::OkStatus();
  }

  Mode mode() const override { return coord::TENSOR; }

  absl::Status Load(const ModelState& state, int64_t step) override {
    RETURN_IF_ERROR(CheckState(state, spec_, ctx_.optimizer));
    params_.clear();
    slots_.clear();
    for (size_t i = 0; i < spec_.params.size(); ++i) {
      params_.push_back(Part(state.params[i], i));
      slots_.emplace_back();
      for (const auto& slot : state.slots[i]) slots_.back().push_back(Part(slot, i));
      model_->SetParam(static_cast<int>(i), params_.back().data());
    }
    updates_ = state.updates;
    return absl::OkStatus();
  }

  absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) override {
    ModelState state;
    state.updates = updates_;
    for (size_t i = 0; i < spec_.params.size(); ++i) {
      ASSIGN_OR_RETURN(std::vector<float> p, Whole(params_[i], i));
      state.params.push_back(std::move(p));
      state.slots.emplace_back();
      for (size_t k = 0; with_slots && k < slots_[i].size(); ++k) {
        ASSIGN_OR_RETURN(std::vector<float> s, Whole(slots_[i][k], i));
        state.slots.back().push_back(std::move(s));
      }
    }
    return state;
  }

  absl::StatusOr<float> Step(int64_t step) override {
    BatchAt(batches_.get(), step, &batch_);
    ASSIGN_OR_RETURN(model::StepResult r, model_->ForwardBackward(batch_.x.data(), batch_.y.data(),
                                                                  batch_.size, &hooks_));
    ++updates_;
    std::vector<float> grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      grad.resize(params_[i].size());
      model_->GetGrad(static_cast<int>(i), grad.data());
      ApplyOptimizer(*ctx_.optimizer, params_[i].data(), grad.data(), slots_[i], grad.size(),
                     updates_);
      model_->SetParam(static_cast<int>(i), params_[i].data());
    }
    return r.loss;
  }

  std::vector<std::pair<std::string, double>> Figures() const override {
    return {{"tensor_parallel", static_cast<double>(m_)},
            {"tensor_state_bytes", static_cast<double>(held_bytes_)},
            {"replica_state_bytes", static_cast<double>(replica_bytes_)}};
  }

 private:
  // This worker's part of spec tensor i (its rows, or its columns of each group).
  std::vector<float> Part(const std::vector<float>& whole, size_t i) const {
    const model::TensorSplit& split = spec_.splits[i];
    if (split.kind == model::TensorSplit::kReplicated) return whole;
    std::vector<float> part(whole.size() / m_);
    const size_t cols = Columns(i), rows = whole.size() / cols;
    if (split.kind == model::TensorSplit::kRows) {
      const size_t n = rows / m_ * cols;
      std::copy_n(whole.begin() + ctx_.rank * n, n, part.begin());
      return part;
    }
    const size_t group = cols / split.groups, mine = group / m_;  // columns per group, per worker
    for (size_t r = 0; r < rows; ++r) {
      for (int g = 0; g < split.groups; ++g) {
        std::copy_n(whole.begin() + r * cols + g * group + ctx_.rank * mine, mine,
                    part.begin() + (r * split.groups + g) * mine);
      }
    }
    return part;
  }

  // Tensor i whole, from every worker's part (an all-gather; every worker calls it).
  absl::StatusOr<std::vector<float>> Whole(const std::vector<float>& part, size_t i) {
    const model::TensorSplit& split = spec_.splits[i];
    if (split.kind == model::TensorSplit::kReplicated) return part;
    std::vector<float> all(part.size() * m_);
    RETURN_IF_ERROR(ctx_.comm->AllGather(part, absl::MakeSpan(all)));
    if (split.kind == model::TensorSplit::kRows) return all;  // rank-major is row order
    std::vector<float> whole(all.size());
    const size_t cols = Columns(i), rows = whole.size() / cols;
    const size_t group = cols / split.groups, mine = group / m_;
    for (size_t w = 0; w < m_; ++w) {
      for (size_t r = 0; r < rows; ++r) {
        for (int g = 0; g < split.groups; ++g) {
          std::copy_n(all.begin() + w * part.size() + (r * split.groups + g) * mine, mine,
                      whole.begin() + r * cols + g * group + w * mine);
        }
      }
    }
    return whole;
  }

  // The last dimension of spec tensor i (a 1-D tensor is one row).
  size_t Columns(size_t i) const { return static_cast<size_t>(spec_.params[i].shape.back()); }

  // The hooks: backend buffers through host memory (the communicator's), summed or
  // gathered over the workers in the same order on every worker.
  absl::Status AllReduce(float* data, size_t n) {
    host_.resize(n);
    ctx_.backend->Download(data, host_.data(), n);
    RETURN_IF_ERROR(ctx_.comm->AllReduceSum(absl::MakeSpan(host_)));
    ctx_.backend->Upload(host_.data(), data, n);
    return absl::OkStatus();
  }

  absl::Status AllGatherColumns(const float* local, int rows, int cols, float* out) {
    const size_t n = static_cast<size_t>(rows) * cols;
    host_.resize(n);
    gathered_.resize(n * m_);
    side_by_side_.resize(n * m_);
    ctx_.backend->Download(local, host_.data(), n);
    RETURN_IF_ERROR(ctx_.comm->AllGather(host_, absl::MakeSpan(gathered_)));
    for (size_t w = 0; w < m_; ++w) {
      for (int r = 0; r < rows; ++r) {
        std::copy_n(gathered_.begin() + w * n + static_cast<size_t>(r) * cols, cols,
                    side_by_side_.begin() + (static_cast<size_t>(r) * m_ + w) * cols);
      }
    }
    ctx_.backend->Upload(side_by_side_.data(), out, n * m_);
    return absl::OkStatus();
  }

  const PlacementContext ctx_;
  const model::ModelSpec& spec_;
  const size_t m_;  // workers
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::Batch batch_;
  model::LayerHooks hooks_;
  std::vector<std::vector<float>> params_;              // this worker's part of each tensor
  std::vector<std::vector<std::vector<float>>> slots_;  // and of its optimizer slots
  std::vector<float> host_, gathered_, side_by_side_;   // the hooks' staging
  int64_t updates_ = 0;
  size_t held_bytes_ = 0, replica_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Placement>> MakeTensorPlacement(const PlacementContext& ctx) {
  if (ctx.comm == nullptr || ctx.optimizer == nullptr || ctx.model == nullptr) {
    return absl::FailedPreconditionError(
        "tensor mode needs a communicator, an optimizer and a model");
  }
  auto p = std::make_unique<TensorPlacement>(ctx);
  RETURN_IF_ERROR(p->Init());
  return std::unique_ptr<Placement>(std::move(p));
}

}  // namespace pscluster::modes::internal
