// ALLREDUCE: a replica per worker. Dense gradients are all-reduced in buckets as the
// backward pass fills them; embedding tables are held whole (dense over the vocabulary),
// their row gradients and a touched-row count all-reduced after the backward pass, and
// only rows some worker touched are stepped, each with its own update count: the shards'
// sparse-table semantics, so PS and ALLREDUCE train the same run.
#include <algorithm>
#include <deque>
#include <functional>
#include <memory>

#include "common/status_macros.h"
#include "core/tensor/scale.h"
#include "worker/modes/comm_thread.h"
#include "worker/modes/placement_internal.h"

namespace pscluster::modes::internal {
namespace {

class AllReducePlacement final : public Placement {
 public:
  explicit AllReducePlacement(const PlacementContext& ctx) : ctx_(ctx), spec_(ctx.model->spec()) {}

  absl::Status Init() {
    ASSIGN_OR_RETURN(model_, NewModel(ctx_, model::WholeModel(ctx_.batch_size)));
    ASSIGN_OR_RETURN(auto batches, DataParallelBatches(ctx_));
    batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
    // Gradients in backward order (the last layer's first), cut into buckets of at most
    // bucket_bytes at tensor boundaries (a larger tensor is a bucket of its own).
    const auto& params = model_->params();
    size_t at = 0, bucket_begin = 0;
    offset_.resize(params.size());
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      if (at > bucket_begin && (at + params[i].size - bucket_begin) * sizeof(float) >
                                   std::max<size_t>(ctx_.bucket_bytes, 1)) {
        buckets_.push_back({bucket_begin, at});
        bucket_begin = at;
      }
      offset_[i] = at;
      at += params[i].size;
    }
    buckets_.push_back({bucket_begin, at});
    flat_.resize(at);
    for (size_t i = 0; i < params.size(); ++i) {  // which bucket holds each gradient
      size_t b = 0;
      while (offset_[i] >= buckets_[b].second) ++b;
      bucket_of_.push_back(b);
    }
    missing_.resize(buckets_.size());
    hooks_.after_backward = [this](int layer) { return BucketsReady(layer); };
    if (ctx_.overlap_allreduce && ctx_.backend->name() != "cuda") {
      comm_thread_ = std::make_unique<CommThread>();
    }
    return absl::OkStatus();
  }

  Mode mode() const override { return coord::ALLREDUCE; }

  std::vector<std::pair<std::string, double>> Figures() const override {
    return {{"allreduce_buckets", static_cast<double>(buckets_.size())}};
  }

  absl::Status Load(const ModelState& state, int64_t step) override {
    RETURN_IF_ERROR(CheckState(state, spec_, ctx_.optimizer));
    state_ = state;
    return SetWholeState(model_.get(), spec_, state_);
  }

  absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) override {
    if (with_slots) return state_;
    ModelState params = state_;
    for (auto& s : params.slots) s.clear();
    for (auto& rows : params.embeddings) rows.slots.clear();
    return params;
  }

  absl::StatusOr<float> Step(int64_t step) override {
    BatchAt(batches_.get(), step, &batch_);
    next_bucket_ = 0;
    std::fill(missing_.begin(), missing_.end(), 0);
    for (size_t b : bucket_of_) ++missing_[b];
    // Each bucket is all-reduced as soon as the backward pass has filled it.
    absl::StatusOr<model::StepResult> r =
        model_->ForwardBackward(batch_.x.data(), batch_.y.data(), batch_.size, &hooks_);
    // Every posted all-reduce has ended (each is bounded by the communicator's timeout)
    // before anything reads the sums, or returns while they may still write flat_.
    const absl::Status reduced = comm_thread_ ? comm_thread_->Wait() : absl::OkStatus();
    if (!r.ok()) return r.status();
    RETURN_IF_ERROR(reduced);
    if (next_bucket_ != buckets_.size()) return absl::InternalError("a bucket was not reduced");
    // Every communication before any update: a failed all-reduce leaves the replica as it was.
    std::vector<std::vector<float>> row_sums(spec_.embeddings.size());
    for (size_t e = 0; e < row_sums.size(); ++e) {
      ASSIGN_OR_RETURN(row_sums[e], ReduceRows(e));
    }
    const float scale = 1.0f / ctx_.world;  // the mean of the workers' gradients
    core::Scale(absl::MakeSpan(flat_), scale);
    ++state_.updates;
    for (size_t i = 0; i < state_.params.size(); ++i) {
      ApplyOptimizer(*ctx_.optimizer, state_.params[i].data(), flat_.data() + offset_[i],
                     state_.slots[i], state_.params[i].size(), state_.updates);
      model_->SetParam(i, state_.params[i].data());
    }
    for (size_t e = 0; e < row_sums.size(); ++e) RETURN_IF_ERROR(StepRows(e, scale, &row_sums[e]));
    return r->loss;
  }

 private:
  // Layer `layer`'s backward is done: its gradients into flat_, then every bucket whose
  // gradients are all there, in bucket order (the same on every worker). Layers usually
  // finish top down, filling the buckets in order; a layer whose gradient is complete only
  // at the end (the GPT's tied embedding) holds its bucket back until then.
  absl::Status BucketsReady(int layer) {
    for (int i : spec_.layer_params[layer]) {
      model_->GetGrad(i, flat_.data() + offset_[i]);
      --missing_[bucket_of_[i]];
    }
    for (; next_bucket_ < buckets_.size() && missing_[next_bucket_] == 0; ++next_bucket_) {
      const absl::Span<float> bucket =
          absl::MakeSpan(flat_.data() + buckets_[next_bucket_].first,
                         buckets_[next_bucket_].second - buckets_[next_bucket_].first);
      if (comm_thread_ == nullptr) {
        RETURN_IF_ERROR(ctx_.comm->AllReduceSum(bucket));
      } else {  // the backward pass goes on; it writes only the buckets after this one
        comm_thread_->Post([this, bucket] { return ctx_.comm->AllReduceSum(bucket); });
      }
    }
    return absl::OkStatus();
  }

  // Embedding table e: every worker's row gradients (vocab x dim), then one touched count
  // per row, summed over the workers.
  absl::StatusOr<std::vector<float>> ReduceRows(int e) {
    const model::EmbeddingSpec& emb = spec_.embeddings[e];
    const std::vector<uint64_t> keys = model_->Keys(e, batch_.x.data(), batch_.size);
    std::vector<float> local(keys.size() * emb.dim);
    model_->GetRowGrads(e, absl::MakeSpan(local));
    std::vector<float> sum(emb.vocab * (emb.dim + 1), 0.0f);
    for (size_t k = 0; k < keys.size(); ++k) {
      std::copy_n(local.data() + k * emb.dim, emb.dim, sum.data() + keys[k] * emb.dim);
      sum[emb.vocab * emb.dim + keys[k]] = 1;
    }
    RETURN_IF_ERROR(ctx_.comm->AllReduceSum(absl::MakeSpan(sum)));
    return sum;
  }

  // Steps each row some worker touched (ReduceRows' `sum`) with its own update count.
  absl::Status StepRows(int e, float scale, std::vector<float>* row_sum) {
    const model::EmbeddingSpec& emb = spec_.embeddings[e];
    std::vector<float>& sum = *row_sum;
    RowsState& rows = state_.embeddings[e];
    std::vector<uint64_t> touched;
    for (uint64_t id = 0; id < emb.vocab; ++id) {
      if (sum[emb.vocab * emb.dim + id] == 0) continue;
      touched.push_back(id);
      float* g = sum.data() + id * emb.dim;
      for (int j = 0; j < emb.dim; ++j) g[j] *= scale;
      ApplyOptimizer(*ctx_.optimizer, rows.values.data() + id * emb.dim, g, rows.slots, emb.dim,
                     ++rows.updates[id], id * emb.dim);
    }
    std::vector<float> values(touched.size() * emb.dim);
    for (size_t k = 0; k < touched.size(); ++k) {
      std::copy_n(rows.values.data() + touched[k] * emb.dim, emb.dim, values.data() + k * emb.dim);
    }
    return model_->SetRows(e, touched, values);
  }

  const PlacementContext ctx_;
  const model::ModelSpec& spec_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::Batch batch_;
  ModelState state_;            // the replica
  std::vector<float> flat_;     // every gradient, the last layer's first
  std::vector<size_t> offset_;  // per parameter: where its gradient starts in flat_
  std::vector<std::pair<size_t, size_t>> buckets_;  // [begin, end) in flat_, in order
  std::vector<size_t> bucket_of_;                   // per parameter: its bucket
  std::vector<int> missing_;  // per bucket: gradients not yet in flat_ this step
  size_t next_bucket_ = 0;
  model::LayerHooks hooks_;
  std::unique_ptr<CommThread> comm_thread_;  // overlap_allreduce; last: stopped first
};

}  // namespace

absl::StatusOr<std::unique_ptr<Placement>> MakeAllReducePlacement(const PlacementContext& ctx) {
  if (ctx.comm == nullptr || ctx.optimizer == nullptr || ctx.model == nullptr) {
    return absl::FailedPreconditionError(
        "allreduce mode needs a communicator, an optimizer and a model");
  }
  auto p = std::make_unique<AllReducePlacement>(ctx);
  RETURN_IF_ERROR(p->Init());
  return std::unique_ptr<Placement>(std::move(p));
}

}  // namespace pscluster::modes::internal
