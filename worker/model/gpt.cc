#include "worker/model/gpt.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::model {
namespace {

// A block's tensors, in spec order.
enum BlockTensor {
  kLn1Gamma,
  kLn1Beta,
  kQkvWeight,
  kQkvBias,
  kProjWeight,
  kProjBias,
  kLn2Gamma,
  kLn2Beta,
  kFcWeight,
  kFcBias,
  kMlpWeight,
  kMlpBias,
  kBlockTensors
};
constexpr int kWte = 0, kWpe = 1;

int BlockParam(int block, int tensor) { return 2 + kBlockTensors * block + tensor; }
int LnfGamma(int layers) { return 2 + kBlockTensors * layers; }

// One block's saved activations for the backward (n = batch * context rows).
struct BlockActivations {
  float* x;      // n x d, the block's input
  float* ln1;    // n x d
  float* mean1;  // n
  float* rstd1;  // n
  float* qkv;    // n x 3d
  float* att;    // batch x heads x context x context: attention probabilities
  float* attn;   // n x d: the heads' outputs side by side
  float* x1;     // n x d: x + attention
  float* ln2;    // n x d
  float* mean2;  // n
  float* rstd2;  // n
  float* h;      // n x 4d: before the GELU
  float* g;      // n x 4d: after it
};

class Gpt final : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<Gpt>> Create(compute::Backend* backend, const GptOptions& o,
                                                     const ModelSpec& spec,
                                                     const InstanceOptions& instance);
  ~Gpt() override {
    for (float* p : owned_) backend_->Free(p);
  }
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const std::vector<Param>& params() const override { return params_; }
  void SetParam(int index, const float* host) override {
    backend_->Upload(host, values_[index], params_[index].size);
  }
  void GetParam(int index, float* host) const override {
    backend_->Download(values_[index], host, params_[index].size);
  }
  void GetGrad(int index, float* host) const override {
    backend_->Download(grads_[index], host, params_[index].size);
  }

  absl::StatusOr<StepResult> ForwardBackward(const float* x, const int32_t* y, int batch,
                                             const LayerHooks* hooks) override;
  absl::StatusOr<StepResult> Evaluate(const float* x, const int32_t* y, int64_t count) override;

  absl::Status StageForward(int, const float*, int, float*) override { return NoStages(); }
  absl::StatusOr<StepResult> StageBackward(int, const int32_t*, const float*, int, float,
                                           float*) override {
    return NoStages();
  }
  void ZeroGrads() override {
    for (size_t i = 0; i < params_.size(); ++i) ZeroGrad(static_cast<int>(i));
  }
  bool first_stage() const override { return true; }
  bool last_stage() const override { return true; }
  int input_width() const override { return o_.context; }
  int output_width() const override { return o_.context * o_.vocab; }

 private:
  Gpt(compute::Backend* backend, const GptOptions& o, int max_batch, bool share)
      : backend_(backend), o_(o), max_batch_(max_batch), share_(share) {}

  static absl::Status NoStages() {
    return absl::FailedPreconditionError("the gpt model has no pipeline stages yet");
  }
  absl::Status Allocate(const ModelSpec& spec);
  absl::Status CheckBatch(const float* x, const int32_t* y, int64_t first, int batch) const;

  // Forward through the logits for `batch` examples of x (token ids as floats).
  absl::Status Forward(const float* x, int batch, const LayerHooks* hooks);
  void BlockForward(int l, int batch);
  // From logits_ holding d(loss)/d(logits): every gradient, accumulated.
  absl::Status Backward(int batch, const LayerHooks* hooks);
  void BlockBackward(int l,
                     int batch);  // dx_: in, the gradient of the block's output; out, of its input
  void ZeroGrad(int index) { backend_->Upload(zeros_.data(), grads_[index], params_[index].size); }

  const float* W(int l, int t) const { return values_[BlockParam(l, t)]; }
  float* G(int l, int t) const { return grads_[BlockParam(l, t)]; }
  float* X(int l) const { return l < o_.layers ? acts_[l].x : x_out_; }
  // Rows of every GEMM (n = batch * context) and the model's widths.
  int dh() const { return o_.width / o_.heads; }

  compute::Backend* const backend_;
  const GptOptions o_;
  const int max_batch_;
  const bool share_;  // FSDP: one block's parameters and gradients at a time
  std::vector<Param> params_;
  std::vector<float*> owned_;
  std::vector<float*> values_, grads_;  // per param (blocks alias one set when share_)
  std::vector<float> zeros_;            // host zeros, as many as the largest tensor
  std::vector<BlockActivations> acts_;
  float* x_out_ = nullptr;  // n x d: the last block's output
  float *lnf_ = nullptr, *meanf_ = nullptr, *rstdf_ = nullptr;
  float* logits_ = nullptr;     // n x vocab; after the loss, d(loss)/d(logits)
  float* tokens_ = nullptr;     // n token ids as floats
  float* positions_ = nullptr;  // n: the position of each row (0..context-1, repeated)
  float* ones_ = nullptr;       // n ones: bias gradients by GEMM
  // Backward scratch.
  float *dx_ = nullptr, *tmp_ = nullptr, *dln_ = nullptr, *dattn_ = nullptr;
  float *dqkv_ = nullptr, *dh_ = nullptr, *datt_ = nullptr;
};

absl::StatusOr<std::unique_ptr<Gpt>> Gpt::Create(compute::Backend* backend, const GptOptions& o,
                                                 const ModelSpec& spec,
                                                 const InstanceOptions& instance) {
  if (backend == nullptr) return absl::InvalidArgumentError("the gpt model needs a backend");
  RETURN_IF_ERROR(ValidateGpt(o));
  if (instance.first_layer != 0 ||
      (instance.end_layer != -1 && instance.end_layer != spec.num_layers()) ||
      instance.slots != 1) {
    return absl::InvalidArgumentError(
        "the gpt model has no pipeline stages yet: it computes the whole model only");
  }
  if (instance.max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt max_batch must be >= 1, got ", instance.max_batch));
  }
  std::unique_ptr<Gpt> gpt(new Gpt(backend, o, instance.max_batch, instance.share_layer_buffers));
  RETURN_IF_ERROR(gpt->Allocate(spec));
  return gpt;
}

absl::Status Gpt::Allocate(const ModelSpec& spec) {
  auto alloc = [&](size_t n) -> float* {
    float* p = backend_->Alloc(n);
    if (p != nullptr) owned_.push_back(p);
    return p;
  };
  size_t largest = 0;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    params_.push_back({spec.params[i].name, spec.params[i].size(), static_cast<int>(i)});
    largest = std::max(largest, spec.params[i].size());
  }
  zeros_.assign(largest, 0.0f);
  values_.assign(params_.size(), nullptr);
  grads_.assign(params_.size(), nullptr);
  std::vector<float*> shared_values(kBlockTensors), shared_grads(kBlockTensors);
  for (const Param& p : params_) {
    const int block_tensor = (p.index - 2) % kBlockTensors;
    const bool in_block = p.index >= 2 && p.index < LnfGamma(o_.layers);
    if (share_ && in_block && shared_values[block_tensor] != nullptr) {
      values_[p.index] = shared_values[block_tensor];
      grads_[p.index] = shared_grads[block_tensor];
      continue;
    }
    values_[p.index] = alloc(p.size);
    grads_[p.index] = alloc(p.size);
    if (values_[p.index] == nullptr || grads_[p.index] == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("backend ", backend_->name(), " could not allocate ", p.name));
    }
    if (in_block) {
      shared_values[block_tensor] = values_[p.index];
      shared_grads[block_tensor] = grads_[p.index];
    }
  }
  const size_t n = static_cast<size_t>(max_batch_) * o_.context, d = o_.width;
  const size_t att = static_cast<size_t>(max_batch_) * o_.heads * o_.context * o_.context;
  bool ok = true;
  auto take = [&](size_t count) {
    float* p = alloc(count);
    ok = ok && p != nullptr;
    return p;
  };
  for (int l = 0; l < o_.layers; ++l) {
    acts_.push_back({take(n * d), take(n * d), take(n), take(n), take(n * 3 * d), take(att),
                     take(n * d), take(n * d), take(n * d), take(n), take(n), take(n * 4 * d),
                     take(n * 4 * d)});
  }
  x_out_ = take(n * d);
  lnf_ = take(n * d);
  meanf_ = take(n);
  rstdf_ = take(n);
  logits_ = take(n * o_.vocab);
  tokens_ = take(n);
  positions_ = take(n);
  ones_ = take(n);
  dx_ = take(n * d);
  tmp_ = take(n * d);
  dln_ = take(n * d);
  dattn_ = take(n * d);
  dqkv_ = take(n * 3 * d);
  dh_ = take(n * 4 * d);
  datt_ = take(att);
  if (!ok) {
    return absl::ResourceExhaustedError(
        absl::StrCat("backend ", backend_->name(), " could not allocate the gpt's activations for ",
                     max_batch_, " examples of ", o_.context, " tokens"));
  }
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % o_.context);
  backend_->Upload(host.data(), positions_, n);
  std::fill(host.begin(), host.end(), 1.0f);
  backend_->Upload(host.data(), ones_, n);
  return absl::OkStatus();
}

absl::Status Gpt::CheckBatch(const float* x, const int32_t* y, int64_t first, int batch) const {
  const size_t n = static_cast<size_t>(batch) * o_.context;
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!(v >= 0 && v < o_.vocab) || v != std::floor(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", v, " at position ", i % o_.context, " of example ",
                       first + i / o_.context, " is not a whole number in [0, ", o_.vocab, ")"));
    }
    if (y[i] < 0 || y[i] >= o_.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", y[i], " at position ", i % o_.context, " of example ",
                       first + i / o_.context, " is outside [0, ", o_.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Gpt::Forward(const float* x, int batch, const LayerHooks* hooks) {
  const int n = batch * o_.context, d = o_.width;
  const bool hooked = hooks != nullptr && hooks->before;
  backend_->Upload(x, tokens_, n);
  if (hooked) RETURN_IF_ERROR(hooks->before(0, /*backward=*/false));
  backend_->GatherRows(values_[kWte], d, tokens_, n, X(0));
  backend_->GatherRows(values_[kWpe], d, positions_, n, tmp_);
  backend_->Axpy(1.0f, tmp_, X(0), static_cast<size_t>(n) * d);
  for (int l = 0; l < o_.layers; ++l) {
    if (hooked) RETURN_IF_ERROR(hooks->before(1 + l, /*backward=*/false));
    BlockForward(l, batch);
  }
  const int lnf = LnfGamma(o_.layers);
  backend_->LayerNorm(X(o_.layers), values_[lnf], values_[lnf + 1], n, d, o_.ln_eps, lnf_, meanf_,
                      rstdf_);
  // logits[n x vocab] = lnf[n x d] * wte^T.
  backend_->Gemm(false, true, n, o_.vocab, d, 1.0f, lnf_, values_[kWte], 0.0f, logits_);
  return absl::OkStatus();
}

void Gpt::BlockForward(int l, int batch) {
  const BlockActivations& a = acts_[l];
  const int t = o_.context, d = o_.width, heads = o_.heads, n = batch * t, k = dh();
  const size_t nd = static_cast<size_t>(n) * d;
  const int64_t att = static_cast<int64_t>(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(k));
  compute::Backend& be = *backend_;
  be.LayerNorm(a.x, W(l, kLn1Gamma), W(l, kLn1Beta), n, d, o_.ln_eps, a.ln1, a.mean1, a.rstd1);
  be.Gemm(false, false, n, 3 * d, d, 1.0f, a.ln1, W(l, kQkvWeight), 0.0f, a.qkv);
  be.AddRowVector(a.qkv, W(l, kQkvBias), n, 3 * d);
  for (int b = 0; b < batch; ++b) {  // per example, the heads as one batched product
    const float* q = a.qkv + static_cast<size_t>(b) * t * 3 * d;
    // scores[h] = scale * q_h k_h^T
    be.GemmBatched(false, true, t, t, k, scale, q, 3 * d, k, q + d, 3 * d, k, 0.0f,
                   a.att + b * heads * att, t, att, heads);
  }
  be.CausalSoftmax(a.att, batch * heads, t);
  for (int b = 0; b < batch; ++b) {  // out_h = p_h v_h, side by side
    const float* v = a.qkv + static_cast<size_t>(b) * t * 3 * d + 2 * d;
    be.GemmBatched(false, false, t, k, t, 1.0f, a.att + b * heads * att, t, att, v, 3 * d, k, 0.0f,
                   a.attn + static_cast<size_t>(b) * t * d, d, k, heads);
  }
  be.Copy(a.x, a.x1, nd);  // x1 = x + attn proj
  be.Gemm(false, false, n, d, d, 1.0f, a.attn, W(l, kProjWeight), 1.0f, a.x1);
  be.AddRowVector(a.x1, W(l, kProjBias), n, d);
  be.LayerNorm(a.x1, W(l, kLn2Gamma), W(l, kLn2Beta), n, d, o_.ln_eps, a.ln2, a.mean2, a.rstd2);
  be.Gemm(false, false, n, 4 * d, d, 1.0f, a.ln2, W(l, kFcWeight), 0.0f, a.h);
  be.AddRowVector(a.h, W(l, kFcBias), n, 4 * d);
  be.Gelu(a.h, a.g, static_cast<size_t>(n) * 4 * d);
  float* out = X(l + 1);  // out = x1 + mlp
  be.Copy(a.x1, out, nd);
  be.Gemm(false, false, n, d, 4 * d, 1.0f, a.g, W(l, kMlpWeight), 1.0f, out);
  be.AddRowVector(out, W(l, kMlpBias), n, d);
}

absl::Status Gpt::Backward(int batch, const LayerHooks* hooks) {
  const int n = batch * o_.context, d = o_.width, lnf = LnfGamma(o_.layers);
  compute::Backend& be = *backend_;
  // logits = lnf wte^T: d lnf = dlogits wte, d wte += dlogits^T lnf.
  be.Gemm(false, false, n, d, o_.vocab, 1.0f, logits_, values_[kWte], 0.0f, dln_);
  be.Gemm(true, false, o_.vocab, d, n, 1.0f, logits_, lnf_, 1.0f, grads_[kWte]);
  be.LayerNormBackward(dln_, X(o_.layers), values_[lnf], meanf_, rstdf_, n, d, dx_, grads_[lnf],
                       grads_[lnf + 1]);
  for (int l = o_.layers - 1; l >= 0; --l) {
    if (hooks != nullptr && hooks->before) RETURN_IF_ERROR(hooks->before(1 + l, true));
    if (share_) {
      for (int t = 0; t < kBlockTensors; ++t) ZeroGrad(BlockParam(l, t));
    }
    BlockBackward(l, batch);
    if (hooks != nullptr && hooks->after_backward) RETURN_IF_ERROR(hooks->after_backward(1 + l));
  }
  be.ScatterAddRows(dx_, d, tokens_, n, grads_[kWte], o_.vocab);
  be.ScatterAddRows(dx_, d, positions_, n, grads_[kWpe], o_.context);
  if (hooks != nullptr && hooks->after_backward) RETURN_IF_ERROR(hooks->after_backward(0));
  return absl::OkStatus();
}

void Gpt::BlockBackward(int l, int batch) {
  const BlockActivations& a = acts_[l];
  const int t = o_.context, d = o_.width, heads = o_.heads, n = batch * t, k = dh();
  const size_t nd = static_cast<size_t>(n) * d;
  const int64_t att = static_cast<int64_t>(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(k));
  compute::Backend& be = *backend_;
  // out = x1 + g Wm + bm.
  be.Gemm(true, false, 4 * d, d, n, 1.0f, a.g, dx_, 1.0f, G(l, kMlpWeight));
  be.Gemm(false, false, 1, d, n, 1.0f, ones_, dx_, 1.0f, G(l, kMlpBias));
  be.Gemm(false, true, n, 4 * d, d, 1.0f, dx_, W(l, kMlpWeight), 0.0f, dh_);
  be.GeluBackward(a.h, dh_, dh_, static_cast<size_t>(n) * 4 * d);
  // h = ln2 Wfc + bfc.
  be.Gemm(true, false, d, 4 * d, n, 1.0f, a.ln2, dh_, 1.0f, G(l, kFcWeight));
  be.Gemm(false, false, 1, 4 * d, n, 1.0f, ones_, dh_, 1.0f, G(l, kFcBias));
  be.Gemm(false, true, n, d, 4 * d, 1.0f, dh_, W(l, kFcWeight), 0.0f, dln_);
  be.LayerNormBackward(dln_, a.x1, W(l, kLn2Gamma), a.mean2, a.rstd2, n, d, tmp_, G(l, kLn2Gamma),
                       G(l, kLn2Beta));
  be.Axpy(1.0f, tmp_, dx_, nd);  // dx_ is now d x1
  // x1 = x + attn Wo + bo.
  be.Gemm(true, false, d, d, n, 1.0f, a.attn, dx_, 1.0f, G(l, kProjWeight));
  be.Gemm(false, false, 1, d, n, 1.0f, ones_, dx_, 1.0f, G(l, kProjBias));
  be.Gemm(false, true, n, d, d, 1.0f, dx_, W(l, kProjWeight), 0.0f, dattn_);
  for (int b = 0; b < batch; ++b) {
    const size_t row = static_cast<size_t>(b) * t;
    const float* v = a.qkv + row * 3 * d + 2 * d;
    const float* dout = dattn_ + row * d;
    // dp_h = dout_h v_h^T; dv_h = p_h^T dout_h.
    be.GemmBatched(false, true, t, t, k, 1.0f, dout, d, k, v, 3 * d, k, 0.0f,
                   datt_ + b * heads * att, t, att, heads);
    be.GemmBatched(true, false, t, k, t, 1.0f, a.att + b * heads * att, t, att, dout, d, k, 0.0f,
                   dqkv_ + row * 3 * d + 2 * d, 3 * d, k, heads);
  }
  be.SoftmaxBackward(a.att, datt_, datt_, batch * heads * t, t);
  for (int b = 0; b < batch; ++b) {
    const size_t row = static_cast<size_t>(b) * t;
    const float* q = a.qkv + row * 3 * d;
    const float* ds = datt_ + b * heads * att;
    // dq_h = scale ds_h k_h; dk_h = scale ds_h^T q_h.
    be.GemmBatched(false, false, t, k, t, scale, ds, t, att, q + d, 3 * d, k, 0.0f,
                   dqkv_ + row * 3 * d, 3 * d, k, heads);
    be.GemmBatched(true, false, t, k, t, scale, ds, t, att, q, 3 * d, k, 0.0f,
                   dqkv_ + row * 3 * d + d, 3 * d, k, heads);
  }
  // qkv = ln1 Wqkv + bqkv.
  be.Gemm(true, false, d, 3 * d, n, 1.0f, a.ln1, dqkv_, 1.0f, G(l, kQkvWeight));
  be.Gemm(false, false, 1, 3 * d, n, 1.0f, ones_, dqkv_, 1.0f, G(l, kQkvBias));
  be.Gemm(false, true, n, d, 3 * d, 1.0f, dqkv_, W(l, kQkvWeight), 0.0f, dln_);
  be.LayerNormBackward(dln_, a.x, W(l, kLn1Gamma), a.mean1, a.rstd1, n, d, tmp_, G(l, kLn1Gamma),
                       G(l, kLn1Beta));
  be.Axpy(1.0f, tmp_, dx_, nd);
}

absl::StatusOr<StepResult> Gpt::ForwardBackward(const float* x, const int32_t* y, int batch,
                                                const LayerHooks* hooks) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch ", batch, " is outside [1, max_batch = ", max_batch_, "]"));
  }
  if (share_ && hooks == nullptr) {
    return absl::FailedPreconditionError("shared layer buffers need LayerHooks");
  }
  RETURN_IF_ERROR(CheckBatch(x, y, 0, batch));
  if (share_) {  // the blocks' shared gradients are zeroed block by block in Backward
    for (int i : {kWte, kWpe, LnfGamma(o_.layers), LnfGamma(o_.layers) + 1}) ZeroGrad(i);
  } else {
    ZeroGrads();
  }
  RETURN_IF_ERROR(Forward(x, batch, hooks));
  const int n = batch * o_.context;
  StepResult result;
  result.examples = n;
  result.loss = backend_->SoftmaxCrossEntropy(logits_, y, n, o_.vocab, logits_, &result.correct);
  RETURN_IF_ERROR(Backward(batch, hooks));
  return result;
}

absl::StatusOr<StepResult> Gpt::Evaluate(const float* x, const int32_t* y, int64_t count) {
  if (count < 0 || count * o_.context > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("count ", count, " examples of ", o_.context, " tokens is outside [0, 2^31)"));
  }
  if (share_) {
    return absl::FailedPreconditionError("Evaluate needs the whole model with its own buffers");
  }
  RETURN_IF_ERROR(CheckBatch(x, y, 0, static_cast<int>(count)));
  StepResult result;
  double total = 0;
  const size_t width = o_.context;
  for (int64_t start = 0; start < count; start += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, count - start));
    (void)Forward(x + start * width, batch, nullptr);  // no hooks: cannot fail
    const int n = batch * o_.context;
    int correct = 0;
    const float loss =
        backend_->SoftmaxCrossEntropy(logits_, y + start * width, n, o_.vocab, nullptr, &correct);
    total += static_cast<double>(loss) * n;
    result.correct += correct;
  }
  result.examples = static_cast<int>(count * o_.context);
  result.loss = count > 0 ? static_cast<float>(total / result.examples) : 0.0f;
  return result;
}

class GptDef final : public ModelDef {
 public:
  GptDef(const GptOptions& options, uint64_t seed)
      : options_(options), spec_(GptSpec(options, seed)) {}
  const ModelSpec& spec() const override { return spec_; }
  absl::StatusOr<std::unique_ptr<Model>> Create(compute::Backend* backend,
                                                const InstanceOptions& o) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<Gpt> gpt, Gpt::Create(backend, options_, spec_, o));
    return std::unique_ptr<Model>(std::move(gpt));
  }

 private:
  const GptOptions options_;
  const ModelSpec spec_;
};

}  // namespace

absl::Status ValidateGpt(const GptOptions& o) {
  for (const auto& [name, value] : {std::pair<const char*, int>{"layers", o.layers},
                                    {"heads", o.heads},
                                    {"width", o.width},
                                    {"context", o.context},
                                    {"vocab", o.vocab}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("gpt ", name, " must be >= 1, got ", value));
    }
  }
  if (o.width % o.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt width ", o.width, " is not divisible by heads ", o.heads));
  }
  if (!(o.ln_eps > 0)) return absl::InvalidArgumentError("gpt ln_eps must be > 0");
  return absl::OkStatus();
}

ModelSpec GptSpec(const GptOptions& o, uint64_t seed) {
  ModelSpec spec;
  spec.kind = "gpt";
  spec.input_width = o.context;
  spec.label_width = o.context;
  spec.classes = o.vocab;
  spec.eval_batch = 16;  // activations: ~0.6 MB per example and block at the default sizes
  const int64_t d = o.width;
  auto add = [&](std::string name, std::vector<int64_t> shape, float normal_scale, float constant) {
    TensorSpec t{std::move(name), std::move(shape), {}};
    if (normal_scale > 0) {
      t.init.set_kind(ps::InitializerConfig::NORMAL);
      t.init.set_scale(normal_scale);
    } else if (constant != 0) {
      t.init.set_kind(ps::InitializerConfig::CONSTANT);
      t.init.set_value(constant);
    }
    t.init.set_seed(seed * 1000 + spec.params.size());
    spec.params.push_back(std::move(t));
  };
  const float sigma = 0.02f, residual = 0.02f / std::sqrt(2.0f * std::max(o.layers, 1));
  add("wte", {o.vocab, d}, sigma, 0);
  add("wpe", {o.context, d}, sigma, 0);
  for (int l = 0; l < o.layers; ++l) {
    const std::string h = absl::StrCat("h", l, ".");
    add(h + "ln1.gamma", {d}, 0, 1);
    add(h + "ln1.beta", {d}, 0, 0);
    add(h + "attn.qkv.weight", {d, 3 * d}, sigma, 0);
    add(h + "attn.qkv.bias", {3 * d}, 0, 0);
    add(h + "attn.proj.weight", {d, d}, residual, 0);
    add(h + "attn.proj.bias", {d}, 0, 0);
    add(h + "ln2.gamma", {d}, 0, 1);
    add(h + "ln2.beta", {d}, 0, 0);
    add(h + "mlp.fc.weight", {d, 4 * d}, sigma, 0);
    add(h + "mlp.fc.bias", {4 * d}, 0, 0);
    add(h + "mlp.proj.weight", {4 * d, d}, residual, 0);
    add(h + "mlp.proj.bias", {d}, 0, 0);
  }
  add("lnf.gamma", {d}, 0, 1);
  add("lnf.beta", {d}, 0, 0);
  const int lnf = LnfGamma(o.layers);
  spec.layer_params.push_back({kWte, kWpe, lnf, lnf + 1});
  const double t = o.context;
  spec.layer_costs.push_back(t * d * o.vocab);  // the head (the embedding is a lookup)
  for (int l = 0; l < o.layers; ++l) {
    std::vector<int> block;
    for (int i = 0; i < kBlockTensors; ++i) block.push_back(BlockParam(l, i));
    spec.layer_params.push_back(std::move(block));
    spec.layer_costs.push_back(t * 12 * d * d + 2 * t * t * d);  // weights + attention
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<ModelDef>> MakeGptDef(const GptOptions& options, uint64_t seed) {
  RETURN_IF_ERROR(ValidateGpt(options));
  return std::unique_ptr<ModelDef>(new GptDef(options, seed));
}

}  // namespace pscluster::model
