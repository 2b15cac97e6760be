#include "worker/model/embedding_mlp.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::model {
namespace {

MlpOptions TopOf(const EmbeddingMlpOptions& o) {
  MlpOptions m;
  m.layers = {o.features + o.dim};
  m.layers.insert(m.layers.end(), o.hidden.begin(), o.hidden.end());
  m.layers.push_back(o.classes);
  m.input_gradient = true;
  return m;
}

class EmbeddingMlp final : public Model {
 public:
  EmbeddingMlp(const EmbeddingMlpOptions& o, std::unique_ptr<Mlp> top)
      : o_(o),
        top_(std::move(top)),
        vocab_(static_cast<uint64_t>(o.categorical) * o.buckets),
        rows_(vocab_ * o.dim),
        set_(vocab_, false) {}

  const std::vector<Param>& params() const override { return top_->params(); }
  void SetParam(int index, const float* host) override { top_->SetParam(index, host); }
  void GetParam(int index, float* host) const override { top_->GetParam(index, host); }
  void GetGrad(int index, float* host) const override { top_->GetGrad(index, host); }

  std::vector<uint64_t> Keys(int table, const float* x, int batch) const override {
    std::vector<uint64_t> keys;
    for (int i = 0; i < batch; ++i) {
      for (int c = 0; c < o_.categorical; ++c) keys.push_back(Id(x + i * o_.features, c));
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
  }

  absl::Status SetRows(int table, absl::Span<const uint64_t> keys,
                       absl::Span<const float> rows) override {
    if (table != 0) return absl::InvalidArgumentError(absl::StrCat("no embedding table ", table));
    if (rows.size() != keys.size() * o_.dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(rows.size(), " floats for ", keys.size(), " rows of ", o_.dim));
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] >= vocab_) {
        return absl::OutOfRangeError(absl::StrCat("id ", keys[i], " is outside [0, ", vocab_, ")"));
      }
      std::copy_n(rows.data() + i * o_.dim, o_.dim, rows_.data() + keys[i] * o_.dim);
      set_[keys[i]] = true;
    }
    return absl::OkStatus();
  }

  void GetRowGrads(int table, absl::Span<float> grads) const override {
    std::copy_n(row_grads_.begin(), std::min(grads.size(), row_grads_.size()), grads.begin());
  }

  absl::StatusOr<StepResult> ForwardBackward(const float* x, const int32_t* y, int batch,
                                             const LayerHooks* hooks) override {
    if (batch < 1 || batch > top_->max_batch()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch ", batch, " is outside [1, ", top_->max_batch(), "]"));
    }
    std::vector<float> in;
    RETURN_IF_ERROR(Inputs(x, batch, &in));
    absl::StatusOr<StepResult> r = top_->ForwardBackward(in.data(), y, batch, hooks);
    if (!r.ok()) return r;
    // d(mean row) of each example, spread over its ids: d(row) += d(mean) / categorical.
    std::vector<float> dx(in.size());
    top_->GetInputGrad(dx.data(), batch);
    const std::vector<uint64_t> keys = Keys(0, x, batch);
    row_grads_.assign(keys.size() * o_.dim, 0.0f);
    const int width = o_.features + o_.dim;
    for (int i = 0; i < batch; ++i) {
      const float* d = dx.data() + static_cast<size_t>(i) * width + o_.features;
      for (int c = 0; c < o_.categorical; ++c) {
        const size_t at =
            std::lower_bound(keys.begin(), keys.end(), Id(x + i * o_.features, c)) - keys.begin();
        for (int j = 0; j < o_.dim; ++j) row_grads_[at * o_.dim + j] += d[j] / o_.categorical;
      }
    }
    return r;
  }

  absl::StatusOr<StepResult> Evaluate(const float* x, const int32_t* y, int64_t count) override {
    if (count < 0 || count > (int64_t{1} << 31) - 1) {
      return absl::InvalidArgumentError(absl::StrCat("count ", count, " is outside [0, 2^31)"));
    }
    std::vector<float> in;
    RETURN_IF_ERROR(Inputs(x, static_cast<int>(count), &in));
    return top_->Evaluate(in.data(), y, count);
  }

  absl::Status StageForward(int, const float*, int, float*) override { return NoStages(); }
  absl::StatusOr<StepResult> StageBackward(int, const int32_t*, const float*, int, float,
                                           float*) override {
    return NoStages();
  }
  void ZeroGrads() override { top_->ZeroGrads(); }
  bool first_stage() const override { return true; }
  bool last_stage() const override { return true; }
  int input_width() const override { return o_.features; }
  int output_width() const override { return o_.classes; }

 private:
  static absl::Status NoStages() {
    return absl::FailedPreconditionError("the embedding model runs whole: no pipeline stages");
  }

  uint64_t Id(const float* example, int c) const {
    const float v = (example[c] - o_.range_lo) / (o_.range_hi - o_.range_lo) * o_.buckets;
    const int bucket =
        std::isfinite(v) ? std::clamp(static_cast<int>(std::floor(v)), 0, o_.buckets - 1) : 0;
    return static_cast<uint64_t>(c) * o_.buckets + bucket;
  }

  // [features, relu(mean row of the example's ids)] per example.
  absl::Status Inputs(const float* x, int count, std::vector<float>* in) const {
    const int width = o_.features + o_.dim;
    in->assign(static_cast<size_t>(count) * width, 0.0f);
    for (int i = 0; i < count; ++i) {
      const float* e = x + static_cast<size_t>(i) * o_.features;
      float* to = in->data() + static_cast<size_t>(i) * width;
      std::copy_n(e, o_.features, to);
      for (int c = 0; c < o_.categorical; ++c) {
        const uint64_t id = Id(e, c);
        if (!set_[id]) {
          return absl::FailedPreconditionError(
              absl::StrCat("row ", id, " of emb0 was not set before the forward pass"));
        }
        for (int j = 0; j < o_.dim; ++j) {
          to[o_.features + j] += rows_[id * o_.dim + j] / o_.categorical;
        }
      }
      for (int j = 0; j < o_.dim; ++j) to[o_.features + j] = std::max(0.0f, to[o_.features + j]);
    }
    return absl::OkStatus();
  }

  const EmbeddingMlpOptions o_;
  std::unique_ptr<Mlp> top_;
  const uint64_t vocab_;
  std::vector<float> rows_;  // vocab x dim: the rows set so far
  std::vector<bool> set_;
  std::vector<float> row_grads_;  // the last batch's, in key order
};

class EmbeddingMlpDef final : public ModelDef {
 public:
  EmbeddingMlpDef(EmbeddingMlpOptions o, uint64_t seed)
      : o_(std::move(o)), spec_(EmbeddingMlpSpec(o_, seed)) {}
  const ModelSpec& spec() const override { return spec_; }
  absl::StatusOr<std::unique_ptr<Model>> Create(compute::Backend* backend,
                                                const InstanceOptions& i) const override {
    if (i.first_layer != 0 || i.end_layer != -1 || i.share_layer_buffers) {
      return absl::InvalidArgumentError(
          "the embedding model runs whole: no pipeline stages or shared layer buffers (fsdp)");
    }
    absl::StatusOr<std::unique_ptr<Mlp>> top = Mlp::Create(backend, TopOf(o_), i.max_batch);
    if (!top.ok()) return top.status();
    return std::unique_ptr<Model>(new EmbeddingMlp(o_, *std::move(top)));
  }

 private:
  const EmbeddingMlpOptions o_;
  const ModelSpec spec_;
};

}  // namespace

ModelSpec EmbeddingMlpSpec(const EmbeddingMlpOptions& o, uint64_t seed) {
  ModelSpec spec = MlpSpec(TopOf(o), seed);
  spec.kind = "embedding";
  spec.input_width = o.features;
  EmbeddingSpec emb{"emb0", o.dim, static_cast<uint64_t>(o.categorical) * o.buckets, {}};
  emb.init.set_kind(ps::InitializerConfig::NORMAL);
  emb.init.set_scale(0.5f);
  emb.init.set_seed(seed * 1000 + 999);
  spec.embeddings.push_back(std::move(emb));
  return spec;
}

absl::StatusOr<std::unique_ptr<ModelDef>> MakeEmbeddingMlpDef(const EmbeddingMlpOptions& o,
                                                              uint64_t seed) {
  if (o.features < 1 || o.categorical < 1 || o.categorical > o.features || o.buckets < 1 ||
      o.dim < 1 || o.classes < 1 || !(o.range_hi > o.range_lo)) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding model: features ", o.features, ", categorical ", o.categorical,
                     ", buckets ", o.buckets, ", dim ", o.dim, ", classes ", o.classes,
                     ": sizes must be >= 1, categorical <= features, range_hi > range_lo"));
  }
  RETURN_IF_ERROR(Mlp::Validate(TopOf(o), 1));
  return std::unique_ptr<ModelDef>(new EmbeddingMlpDef(o, seed));
}

}  // namespace pscluster::model
