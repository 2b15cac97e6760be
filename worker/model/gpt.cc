#include "worker/model/gpt.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
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

// One block's saved activations for the backward (n = batch * context rows); its input
// is the stage's xs[j].
struct BlockActivations {
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

// What one micro-batch in flight keeps (pipeline slots; a whole model has one).
struct Slot {
  float* tokens = nullptr;  // n token ids as floats (the embedding's stage)
  std::vector<float*> xs;   // n x d each: xs[j] is block j's input, xs.back() the output
  std::vector<BlockActivations> blocks;
  float *lnf = nullptr, *meanf = nullptr, *rstdf = nullptr;  // the head's stage
  float* logits = nullptr;        // n x vocab; after the loss, d(loss)/d(logits)
  float* logits_local = nullptr;  // TENSOR: n x this worker's vocabulary part
};

// Layers: 0 the embedding (wte, wpe), 1 + b block b, layers + 1 the head (lnf; it reads
// wte). An instance computes layers [first, end): a whole model, or a pipeline stage; or,
// in TENSOR mode, worker tensor_rank's part of the whole model (Megatron-LM): its heads'
// q, k, v columns and attention-output rows, its columns of the MLP's first layer and rows
// of its second, its rows (vocabulary) of wte, with an all-reduce after each row-split
// product in forward and after each column-split one's input gradient in backward, the
// embedding's rows summed and the logits' columns gathered. LayerNorms, wpe and the
// row-split layers' biases are replicated: every worker computes them the same.
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
  void SetParam(int local, const float* host) override {
    backend_->Upload(host, values_[params_[local].index], params_[local].size);
  }
  void GetParam(int local, float* host) const override {
    backend_->Download(values_[params_[local].index], host, params_[local].size);
  }
  void GetGrad(int local, float* host) const override {
    backend_->Download(grads_[params_[local].index], host, params_[local].size);
  }

  absl::StatusOr<StepResult> ForwardBackward(const float* x, const int32_t* y, int batch,
                                             const LayerHooks* hooks) override;
  absl::StatusOr<StepResult> Evaluate(const float* x, const int32_t* y, int64_t count) override;
  absl::Status StageForward(int slot, const float* x, int batch, float* out) override;
  absl::StatusOr<StepResult> StageBackward(int slot, const int32_t* labels, const float* dout,
                                           int batch, float grad_scale, float* dx) override;
  void ZeroGrads() override {
    for (const Param& p : params_) ZeroGrad(p.index);
  }
  bool first_stage() const override { return embed_; }
  bool last_stage() const override { return head_; }
  int input_width() const override { return embed_ ? o_.context : o_.context * o_.width; }
  int output_width() const override { return o_.context * (head_ ? o_.vocab : o_.width); }

 private:
  Gpt(compute::Backend* backend, const GptOptions& o, const InstanceOptions& instance)
      : backend_(backend),
        o_(o),
        tp_(instance.tensor_size),
        tp_rank_(instance.tensor_rank),
        hl_(o.heads / instance.tensor_size),
        dl_(o.width / instance.tensor_size),
        fl_(4 * o.width / instance.tensor_size),
        vl_(o.vocab / instance.tensor_size),
        max_batch_(instance.max_batch),
        share_(instance.share_layer_buffers),
        embed_(instance.first_layer == 0),
        head_(instance.end_layer == -1 || instance.end_layer == o.layers + 2),
        b0_(std::max(instance.first_layer, 1) - 1),
        b1_(std::min(instance.end_layer == -1 ? o.layers + 2 : instance.end_layer, o.layers + 1) -
            1) {}

  absl::Status Allocate(const ModelSpec& spec, int slots);
  absl::Status AllocateParams(const ModelSpec& spec);
  absl::Status CheckTokens(const float* x, int64_t first, int batch) const;
  absl::Status CheckLabels(const int32_t* y, int64_t first, int batch) const;
  absl::Status CheckStage(int slot, int batch) const;
  bool whole() const { return embed_ && head_; }
  int blocks() const { return b1_ - b0_; }

  // Forward through the stage: from tokens (the embedding's stage) or the previous stage's
  // output, to the logits (the head's stage) or xs.back().
  absl::Status Forward(Slot& s, const float* x, int batch, const LayerHooks* hooks);
  absl::Status BlockForward(Slot& s, int j, int batch, const LayerHooks* hooks);
  // TENSOR: the sum over the workers of a partial product (in place); nothing otherwise.
  absl::Status AllReduce(float* data, size_t n, const LayerHooks* hooks) {
    return tp_ > 1 ? hooks->all_reduce_sum(data, n) : absl::OkStatus();
  }
  // The embedding's row ids of x's tokens: TENSOR maps another worker's tokens to the zero
  // row past this worker's part (vl_), which gathers zeros and takes their gradients.
  void UploadTokenIds(const float* x, int n, float* ids);
  // Backward through the stage: from s.logits holding d(loss)/d(logits) (the head's stage;
  // scaled by grad_scale here) or dx_ holding the gradient of the stage's output, to the
  // parameters' gradients (accumulated) and dx_ holding the gradient of its input.
  absl::Status Backward(Slot& s, int batch, float grad_scale, const LayerHooks* hooks);
  absl::Status BlockBackward(const Slot& s, int j, int batch, const LayerHooks* hooks);
  void ZeroGrad(int index) { backend_->Upload(zeros_.data(), grads_[index], alloc_sizes_[index]); }

  const float* W(int b, int t) const { return values_[BlockParam(b, t)]; }
  float* G(int b, int t) const { return grads_[BlockParam(b, t)]; }
  int dh() const { return o_.width / o_.heads; }
  // A block's sizes for `batch` examples: context, width, this worker's attention width and
  // MLP units and heads (TENSOR: its part), rows, head width.
  struct BlockDims {
    int t, d, dl, fl, heads, n, k;
  };
  BlockDims Dims(int batch) const {
    return {o_.context, o_.width, dl_, fl_, hl_, batch * o_.context, dh()};
  }

  compute::Backend* const backend_;
  const GptOptions o_;
  const int tp_, tp_rank_;       // TENSOR: workers and this one's rank (1, 0 otherwise)
  const int hl_, dl_, fl_, vl_;  // this worker's heads, their width, MLP units, vocabulary
  const int max_batch_;
  const bool share_;  // FSDP: one block's parameters and gradients at a time
  const bool embed_, head_;
  const int b0_, b1_;                // the blocks [b0_, b1_) this instance computes
  std::vector<Param> params_;        // this instance's tensors, in spec order
  std::vector<size_t> alloc_sizes_;  // per spec tensor: floats allocated here
  std::vector<float*> owned_;
  std::vector<float*> values_, grads_;  // per spec tensor, null if not held here
  std::vector<float> zeros_;            // host zeros, as many as the largest tensor
  std::vector<Slot> slots_;
  float* positions_ = nullptr;  // n: the position of each row (0..context-1, repeated)
  float* ones_ = nullptr;       // n ones: bias gradients by GEMM
  // Backward scratch, one micro-batch at a time.
  float *dx_ = nullptr, *tmp_ = nullptr, *dln_ = nullptr, *dattn_ = nullptr;
  float *dqkv_ = nullptr, *dh_ = nullptr, *datt_ = nullptr;
};

absl::StatusOr<std::unique_ptr<Gpt>> Gpt::Create(compute::Backend* backend, const GptOptions& o,
                                                 const ModelSpec& spec,
                                                 const InstanceOptions& instance) {
  if (backend == nullptr) return absl::InvalidArgumentError("the gpt model needs a backend");
  RETURN_IF_ERROR(ValidateGpt(o));
  const int layers = spec.num_layers();
  const int end = instance.end_layer == -1 ? layers : instance.end_layer;
  if (instance.first_layer < 0 || instance.first_layer >= end || end > layers) {
    return absl::InvalidArgumentError(absl::StrCat("gpt layer range [", instance.first_layer, ", ",
                                                   end, ") is not within the ", layers, " layers"));
  }
  if (instance.tensor_size < 1 || o.heads % instance.tensor_size != 0 ||
      o.vocab % instance.tensor_size != 0 || instance.tensor_rank < 0 ||
      instance.tensor_rank >= instance.tensor_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt tensor parallelism over ", instance.tensor_size, " workers (rank ",
                     instance.tensor_rank, ") needs a worker count dividing heads (", o.heads,
                     ") and vocab (", o.vocab, ")"));
  }
  if (instance.tensor_size > 1 &&
      (instance.first_layer != 0 || (instance.end_layer != -1 && instance.end_layer != layers) ||
       instance.share_layer_buffers)) {
    return absl::InvalidArgumentError(
        "gpt tensor parallelism splits the whole model: no pipeline stages or shared buffers");
  }
  if (instance.max_batch < 1 || instance.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpt max_batch (", instance.max_batch, ") and slots (", instance.slots, ") must be >= 1"));
  }
  std::unique_ptr<Gpt> gpt(new Gpt(backend, o, instance));
  RETURN_IF_ERROR(gpt->Allocate(spec, instance.slots));
  return gpt;
}

absl::Status Gpt::AllocateParams(const ModelSpec& spec) {
  const int lnf = LnfGamma(o_.layers);
  std::vector<int> held;
  if (embed_ || head_) held.push_back(kWte);  // the head reads the tied embedding
  if (embed_) held.push_back(kWpe);
  for (int b = b0_; b < b1_; ++b) {
    for (int t = 0; t < kBlockTensors; ++t) held.push_back(BlockParam(b, t));
  }
  if (head_) held.insert(held.end(), {lnf, lnf + 1});
  size_t largest = 0;
  std::vector<size_t> local(spec.params.size());  // this worker's part of each tensor
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const bool split = spec.splits[i].kind != TensorSplit::kReplicated;
    local[i] = split ? spec.params[i].size() / tp_ : spec.params[i].size();
    // TENSOR: wte's part gets one more, zero, row for the other workers' tokens.
    alloc_sizes_.push_back(local[i] + (static_cast<int>(i) == kWte && tp_ > 1 ? o_.width : 0));
    largest = std::max(largest, alloc_sizes_.back());
  }
  zeros_.assign(largest, 0.0f);
  values_.assign(spec.params.size(), nullptr);
  grads_.assign(spec.params.size(), nullptr);
  std::vector<float*> shared_values(kBlockTensors), shared_grads(kBlockTensors);
  for (int i : held) {
    params_.push_back({spec.params[i].name, local[i], i});
    const bool in_block = i >= 2 && i < lnf;
    const int t = (i - 2) % kBlockTensors;
    if (share_ && in_block && shared_values[t] != nullptr) {
      values_[i] = shared_values[t];
      grads_[i] = shared_grads[t];
      continue;
    }
    values_[i] = backend_->Alloc(alloc_sizes_[i]);
    grads_[i] = backend_->Alloc(alloc_sizes_[i]);
    for (float* p : {values_[i], grads_[i]}) {
      if (p != nullptr) owned_.push_back(p);
    }
    if (values_[i] == nullptr || grads_[i] == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("backend ", backend_->name(), " could not allocate ", params_.back().name));
    }
    if (in_block) {
      shared_values[t] = values_[i];
      shared_grads[t] = grads_[i];
    }
  }
  return absl::OkStatus();
}

absl::Status Gpt::Allocate(const ModelSpec& spec, int slots) {
  RETURN_IF_ERROR(AllocateParams(spec));
  const size_t n = static_cast<size_t>(max_batch_) * o_.context, d = o_.width;
  const size_t dl = dl_, fl = fl_;  // TENSOR: this worker's attention width and MLP units
  const size_t att = static_cast<size_t>(max_batch_) * hl_ * o_.context * o_.context;
  bool ok = true;
  auto take = [&](size_t count) {
    float* p = backend_->Alloc(count);
    if (p != nullptr) owned_.push_back(p);
    ok = ok && p != nullptr;
    return p;
  };
  for (int k = 0; k < slots; ++k) {
    Slot s;
    if (embed_) s.tokens = take(n);
    for (int j = 0; j <= blocks(); ++j) s.xs.push_back(take(n * d));
    for (int j = 0; j < blocks(); ++j) {
      s.blocks.push_back({take(n * d), take(n), take(n), take(n * 3 * dl), take(att), take(n * dl),
                          take(n * d), take(n * d), take(n), take(n), take(n * fl), take(n * fl)});
    }
    if (head_) {
      s.lnf = take(n * d);
      s.meanf = take(n);
      s.rstdf = take(n);
      s.logits = take(n * o_.vocab);
      if (tp_ > 1) s.logits_local = take(n * vl_);
    }
    slots_.push_back(std::move(s));
  }
  positions_ = take(n);
  ones_ = take(n);
  dx_ = take(n * d);
  tmp_ = take(n * d);
  dln_ = take(n * d);
  dattn_ = take(n * dl);
  dqkv_ = take(n * 3 * dl);
  dh_ = take(n * fl);
  datt_ = take(att);
  if (!ok) {
    return absl::ResourceExhaustedError(
        absl::StrCat("backend ", backend_->name(), " could not allocate the gpt's activations for ",
                     slots, " x ", max_batch_, " examples of ", o_.context, " tokens"));
  }
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % o_.context);
  backend_->Upload(host.data(), positions_, n);
  std::fill(host.begin(), host.end(), 1.0f);
  backend_->Upload(host.data(), ones_, n);
  return absl::OkStatus();
}

absl::Status Gpt::CheckTokens(const float* x, int64_t first, int batch) const {
  const size_t n = static_cast<size_t>(batch) * o_.context;
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!(v >= 0 && v < o_.vocab) || v != std::floor(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", v, " at position ", i % o_.context, " of example ",
                       first + i / o_.context, " is not a whole number in [0, ", o_.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Gpt::CheckLabels(const int32_t* y, int64_t first, int batch) const {
  const size_t n = static_cast<size_t>(batch) * o_.context;
  for (size_t i = 0; i < n; ++i) {
    if (y[i] < 0 || y[i] >= o_.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", y[i], " at position ", i % o_.context, " of example ",
                       first + i / o_.context, " is outside [0, ", o_.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Gpt::CheckStage(int slot, int batch) const {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch ", batch, " is outside [1, max_batch = ", max_batch_, "]"));
  }
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " is outside [0, ", slots_.size(), ")"));
  }
  return absl::OkStatus();
}

void Gpt::UploadTokenIds(const float* x, int n, float* ids) {
  if (tp_ == 1) {
    backend_->Upload(x, ids, n);
    return;
  }
  std::vector<float> local(n);
  const float first = static_cast<float>(tp_rank_ * vl_);
  for (int i = 0; i < n; ++i) {
    const float row = x[i] - first;
    local[i] = row >= 0 && row < vl_ ? row : static_cast<float>(vl_);
  }
  backend_->Upload(local.data(), ids, n);
}

absl::Status Gpt::Forward(Slot& s, const float* x, int batch, const LayerHooks* hooks) {
  const int n = batch * o_.context, d = o_.width;
  const bool hooked = hooks != nullptr && hooks->before;
  if (embed_) {
    UploadTokenIds(x, n, s.tokens);
    if (hooked) RETURN_IF_ERROR(hooks->before(0, /*backward=*/false));
    backend_->GatherRows(values_[kWte], d, s.tokens, n, s.xs[0]);
    RETURN_IF_ERROR(AllReduce(s.xs[0], static_cast<size_t>(n) * d, hooks));  // TENSOR: rows
    backend_->GatherRows(values_[kWpe], d, positions_, n, tmp_);
    backend_->Axpy(1.0f, tmp_, s.xs[0], static_cast<size_t>(n) * d);
  } else {
    backend_->Upload(x, s.xs[0], static_cast<size_t>(n) * d);
  }
  for (int j = 0; j < blocks(); ++j) {
    if (hooked) RETURN_IF_ERROR(hooks->before(1 + b0_ + j, /*backward=*/false));
    RETURN_IF_ERROR(BlockForward(s, j, batch, hooks));
  }
  if (!head_) return absl::OkStatus();
  if (hooked) RETURN_IF_ERROR(hooks->before(o_.layers + 1, /*backward=*/false));
  const int lnf = LnfGamma(o_.layers);
  backend_->LayerNorm(s.xs.back(), values_[lnf], values_[lnf + 1], n, d, o_.ln_eps, s.lnf, s.meanf,
                      s.rstdf);
  // logits[n x vocab] = lnf[n x d] * wte^T (TENSOR: this worker's vocabulary columns, then
  // every worker's side by side).
  float* logits = tp_ > 1 ? s.logits_local : s.logits;
  backend_->Gemm(false, true, n, vl_, d, 1.0f, s.lnf, values_[kWte], 0.0f, logits);
  if (tp_ > 1) RETURN_IF_ERROR(hooks->all_gather_columns(logits, n, vl_, s.logits));
  return absl::OkStatus();
}

absl::Status Gpt::BlockForward(Slot& s, int j, int batch, const LayerHooks* hooks) {
  const BlockActivations& a = s.blocks[j];
  const int l = b0_ + j;
  const float* x = s.xs[j];
  const auto [t, d, dl, fl, heads, n, k] = Dims(batch);
  const size_t nd = static_cast<size_t>(n) * d;
  const int64_t att = static_cast<int64_t>(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(k));
  compute::Backend& be = *backend_;
  be.LayerNorm(x, W(l, kLn1Gamma), W(l, kLn1Beta), n, d, o_.ln_eps, a.ln1, a.mean1, a.rstd1);
  be.Gemm(false, false, n, 3 * dl, d, 1.0f, a.ln1, W(l, kQkvWeight), 0.0f, a.qkv);
  be.AddRowVector(a.qkv, W(l, kQkvBias), n, 3 * dl);
  for (int b = 0; b < batch; ++b) {  // per example, the heads as one batched product
    const float* q = a.qkv + static_cast<size_t>(b) * t * 3 * dl;
    // scores[h] = scale * q_h k_h^T
    be.GemmBatched(false, true, t, t, k, scale, q, 3 * dl, k, q + dl, 3 * dl, k, 0.0f,
                   a.att + b * heads * att, t, att, heads);
  }
  be.CausalSoftmax(a.att, batch * heads, t);
  for (int b = 0; b < batch; ++b) {  // out_h = p_h v_h, side by side
    const float* v = a.qkv + static_cast<size_t>(b) * t * 3 * dl + 2 * dl;
    be.GemmBatched(false, false, t, k, t, 1.0f, a.att + b * heads * att, t, att, v, 3 * dl, k, 0.0f,
                   a.attn + static_cast<size_t>(b) * t * dl, dl, k, heads);
  }
  // x1 = x + attn Wo + bo (TENSOR: attn Wo is a sum over the workers' rows of Wo).
  if (tp_ > 1) {
    be.Gemm(false, false, n, d, dl, 1.0f, a.attn, W(l, kProjWeight), 0.0f, tmp_);
    RETURN_IF_ERROR(AllReduce(tmp_, nd, hooks));
    be.Copy(x, a.x1, nd);
    be.Axpy(1.0f, tmp_, a.x1, nd);
  } else {
    be.Copy(x, a.x1, nd);
    be.Gemm(false, false, n, d, dl, 1.0f, a.attn, W(l, kProjWeight), 1.0f, a.x1);
  }
  be.AddRowVector(a.x1, W(l, kProjBias), n, d);
  be.LayerNorm(a.x1, W(l, kLn2Gamma), W(l, kLn2Beta), n, d, o_.ln_eps, a.ln2, a.mean2, a.rstd2);
  be.Gemm(false, false, n, fl, d, 1.0f, a.ln2, W(l, kFcWeight), 0.0f, a.h);
  be.AddRowVector(a.h, W(l, kFcBias), n, fl);
  be.Gelu(a.h, a.g, static_cast<size_t>(n) * fl);
  float* out = s.xs[j + 1];  // out = x1 + g Wm + bm (TENSOR: summed over Wm's rows)
  if (tp_ > 1) {
    be.Gemm(false, false, n, d, fl, 1.0f, a.g, W(l, kMlpWeight), 0.0f, tmp_);
    RETURN_IF_ERROR(AllReduce(tmp_, nd, hooks));
    be.Copy(a.x1, out, nd);
    be.Axpy(1.0f, tmp_, out, nd);
  } else {
    be.Copy(a.x1, out, nd);
    be.Gemm(false, false, n, d, fl, 1.0f, a.g, W(l, kMlpWeight), 1.0f, out);
  }
  be.AddRowVector(out, W(l, kMlpBias), n, d);
  return absl::OkStatus();
}

absl::Status Gpt::Backward(Slot& s, int batch, float grad_scale, const LayerHooks* hooks) {
  const int n = batch * o_.context, d = o_.width, lnf = LnfGamma(o_.layers);
  compute::Backend& be = *backend_;
  const bool after = hooks != nullptr && static_cast<bool>(hooks->after_backward);
  if (head_) {
    // logits = lnf wte^T: d lnf = dlogits wte, d wte += dlogits^T lnf (both scaled; TENSOR:
    // this worker's vocabulary columns of dlogits, and d lnf summed over the workers).
    const float* dlogits = s.logits + static_cast<size_t>(tp_rank_) * vl_;
    be.GemmBatched(false, false, n, d, vl_, grad_scale, dlogits, o_.vocab, 0, values_[kWte], d, 0,
                   0.0f, dln_, d, 0, 1);
    RETURN_IF_ERROR(AllReduce(dln_, static_cast<size_t>(n) * d, hooks));
    be.GemmBatched(true, false, vl_, d, n, grad_scale, dlogits, o_.vocab, 0, s.lnf, d, 0, 1.0f,
                   grads_[kWte], d, 0, 1);
    be.LayerNormBackward(dln_, s.xs.back(), values_[lnf], s.meanf, s.rstdf, n, d, dx_, grads_[lnf],
                         grads_[lnf + 1]);
    if (after) RETURN_IF_ERROR(hooks->after_backward(o_.layers + 1));
  }
  for (int j = blocks() - 1; j >= 0; --j) {
    const int l = b0_ + j;
    if (hooks != nullptr && hooks->before) RETURN_IF_ERROR(hooks->before(1 + l, true));
    if (share_) {
      for (int t = 0; t < kBlockTensors; ++t) ZeroGrad(BlockParam(l, t));
    }
    RETURN_IF_ERROR(BlockBackward(s, j, batch, hooks));
    if (after) RETURN_IF_ERROR(hooks->after_backward(1 + l));
  }
  if (embed_) {
    be.ScatterAddRows(dx_, d, s.tokens, n, grads_[kWte], tp_ > 1 ? vl_ + 1 : vl_);
    be.ScatterAddRows(dx_, d, positions_, n, grads_[kWpe], o_.context);
    if (after) RETURN_IF_ERROR(hooks->after_backward(0));
  }
  return absl::OkStatus();
}

absl::Status Gpt::BlockBackward(const Slot& s, int j, int batch, const LayerHooks* hooks) {
  const BlockActivations& a = s.blocks[j];
  const int l = b0_ + j;
  const float* x = s.xs[j];
  const auto [t, d, dl, fl, heads, n, k] = Dims(batch);
  const size_t nd = static_cast<size_t>(n) * d;
  const int64_t att = static_cast<int64_t>(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(k));
  compute::Backend& be = *backend_;
  // out = x1 + g Wm + bm (Wm: this worker's rows; dx_ and bm replicated).
  be.Gemm(true, false, fl, d, n, 1.0f, a.g, dx_, 1.0f, G(l, kMlpWeight));
  be.Gemm(false, false, 1, d, n, 1.0f, ones_, dx_, 1.0f, G(l, kMlpBias));
  be.Gemm(false, true, n, fl, d, 1.0f, dx_, W(l, kMlpWeight), 0.0f, dh_);
  be.GeluBackward(a.h, dh_, dh_, static_cast<size_t>(n) * fl);
  // h = ln2 Wfc + bfc (Wfc: this worker's columns; d ln2 summed over the workers).
  be.Gemm(true, false, d, fl, n, 1.0f, a.ln2, dh_, 1.0f, G(l, kFcWeight));
  be.Gemm(false, false, 1, fl, n, 1.0f, ones_, dh_, 1.0f, G(l, kFcBias));
  be.Gemm(false, true, n, d, fl, 1.0f, dh_, W(l, kFcWeight), 0.0f, dln_);
  RETURN_IF_ERROR(AllReduce(dln_, nd, hooks));
  be.LayerNormBackward(dln_, a.x1, W(l, kLn2Gamma), a.mean2, a.rstd2, n, d, tmp_, G(l, kLn2Gamma),
                       G(l, kLn2Beta));
  be.Axpy(1.0f, tmp_, dx_, nd);  // dx_ is now d x1
  // x1 = x + attn Wo + bo.
  be.Gemm(true, false, dl, d, n, 1.0f, a.attn, dx_, 1.0f, G(l, kProjWeight));
  be.Gemm(false, false, 1, d, n, 1.0f, ones_, dx_, 1.0f, G(l, kProjBias));
  be.Gemm(false, true, n, dl, d, 1.0f, dx_, W(l, kProjWeight), 0.0f, dattn_);
  for (int b = 0; b < batch; ++b) {
    const size_t row = static_cast<size_t>(b) * t;
    const float* v = a.qkv + row * 3 * dl + 2 * dl;
    const float* dout = dattn_ + row * dl;
    // dp_h = dout_h v_h^T; dv_h = p_h^T dout_h.
    be.GemmBatched(false, true, t, t, k, 1.0f, dout, dl, k, v, 3 * dl, k, 0.0f,
                   datt_ + b * heads * att, t, att, heads);
    be.GemmBatched(true, false, t, k, t, 1.0f, a.att + b * heads * att, t, att, dout, dl, k, 0.0f,
                   dqkv_ + row * 3 * dl + 2 * dl, 3 * dl, k, heads);
  }
  be.SoftmaxBackward(a.att, datt_, datt_, batch * heads * t, t);
  for (int b = 0; b < batch; ++b) {
    const size_t row = static_cast<size_t>(b) * t;
    const float* q = a.qkv + row * 3 * dl;
    const float* ds = datt_ + b * heads * att;
    // dq_h = scale ds_h k_h; dk_h = scale ds_h^T q_h.
    be.GemmBatched(false, false, t, k, t, scale, ds, t, att, q + dl, 3 * dl, k, 0.0f,
                   dqkv_ + row * 3 * dl, 3 * dl, k, heads);
    be.GemmBatched(true, false, t, k, t, scale, ds, t, att, q, 3 * dl, k, 0.0f,
                   dqkv_ + row * 3 * dl + dl, 3 * dl, k, heads);
  }
  // qkv = ln1 Wqkv + bqkv (Wqkv: this worker's heads' columns; d ln1 summed).
  be.Gemm(true, false, d, 3 * dl, n, 1.0f, a.ln1, dqkv_, 1.0f, G(l, kQkvWeight));
  be.Gemm(false, false, 1, 3 * dl, n, 1.0f, ones_, dqkv_, 1.0f, G(l, kQkvBias));
  be.Gemm(false, true, n, d, 3 * dl, 1.0f, dqkv_, W(l, kQkvWeight), 0.0f, dln_);
  RETURN_IF_ERROR(AllReduce(dln_, nd, hooks));
  be.LayerNormBackward(dln_, x, W(l, kLn1Gamma), a.mean1, a.rstd1, n, d, tmp_, G(l, kLn1Gamma),
                       G(l, kLn1Beta));
  be.Axpy(1.0f, tmp_, dx_, nd);
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Gpt::ForwardBackward(const float* x, const int32_t* y, int batch,
                                                const LayerHooks* hooks) {
  RETURN_IF_ERROR(CheckStage(0, batch));
  if (!whole()) {
    return absl::FailedPreconditionError("ForwardBackward needs the whole model; use Stage*");
  }
  if (share_ && hooks == nullptr) {
    return absl::FailedPreconditionError("shared layer buffers need LayerHooks");
  }
  if (tp_ > 1 && (hooks == nullptr || !hooks->all_reduce_sum || !hooks->all_gather_columns)) {
    return absl::FailedPreconditionError(
        "a tensor-parallel gpt needs the hooks' all_reduce_sum and all_gather_columns");
  }
  RETURN_IF_ERROR(CheckTokens(x, 0, batch));
  RETURN_IF_ERROR(CheckLabels(y, 0, batch));
  if (share_) {  // the blocks' shared gradients are zeroed block by block in Backward
    for (int i : {kWte, kWpe, LnfGamma(o_.layers), LnfGamma(o_.layers) + 1}) ZeroGrad(i);
  } else {
    ZeroGrads();
  }
  Slot& s = slots_[0];
  RETURN_IF_ERROR(Forward(s, x, batch, hooks));
  const int n = batch * o_.context;
  StepResult result;
  result.examples = n;
  result.loss = backend_->SoftmaxCrossEntropy(s.logits, y, n, o_.vocab, s.logits, &result.correct);
  RETURN_IF_ERROR(Backward(s, batch, 1.0f, hooks));
  return result;
}

absl::Status Gpt::StageForward(int slot, const float* x, int batch, float* out) {
  RETURN_IF_ERROR(CheckStage(slot, batch));
  if (embed_) RETURN_IF_ERROR(CheckTokens(x, 0, batch));
  Slot& s = slots_[slot];
  RETURN_IF_ERROR(Forward(s, x, batch, nullptr));
  if (!head_) {
    backend_->Download(s.xs.back(), out, static_cast<size_t>(batch) * o_.context * o_.width);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Gpt::StageBackward(int slot, const int32_t* labels, const float* dout,
                                              int batch, float grad_scale, float* dx) {
  RETURN_IF_ERROR(CheckStage(slot, batch));
  Slot& s = slots_[slot];
  const size_t nd = static_cast<size_t>(batch) * o_.context * o_.width;
  StepResult result;
  if (head_) {
    RETURN_IF_ERROR(CheckLabels(labels, 0, batch));
    const int n = batch * o_.context;
    result.examples = n;
    result.loss =
        backend_->SoftmaxCrossEntropy(s.logits, labels, n, o_.vocab, s.logits, &result.correct);
  } else {
    backend_->Upload(dout, dx_, nd);
  }
  RETURN_IF_ERROR(Backward(s, batch, grad_scale, nullptr));
  if (!embed_) backend_->Download(dx_, dx, nd);
  return result;
}

absl::StatusOr<StepResult> Gpt::Evaluate(const float* x, const int32_t* y, int64_t count) {
  if (count < 0 || count * o_.context > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("count ", count, " examples of ", o_.context, " tokens is outside [0, 2^31)"));
  }
  if (share_ || !whole() || tp_ > 1) {
    return absl::FailedPreconditionError(
        "Evaluate needs the whole model with its own buffers, not split");
  }
  RETURN_IF_ERROR(CheckTokens(x, 0, static_cast<int>(count)));
  RETURN_IF_ERROR(CheckLabels(y, 0, static_cast<int>(count)));
  StepResult result;
  double total = 0;
  const size_t width = o_.context;
  Slot& s = slots_[0];
  for (int64_t start = 0; start < count; start += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, count - start));
    (void)Forward(s, x + start * width, batch, nullptr);  // no hooks: cannot fail
    const int n = batch * o_.context;
    int correct = 0;
    const float loss =
        backend_->SoftmaxCrossEntropy(s.logits, y + start * width, n, o_.vocab, nullptr, &correct);
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
  using Split = TensorSplit;
  auto add = [&](std::string name, std::vector<int64_t> shape, float normal_scale, float constant,
                 Split split = {}) {
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
    spec.splits.push_back(split);
  };
  const float sigma = 0.02f, residual = 0.02f / std::sqrt(2.0f * std::max(o.layers, 1));
  const Split rows{Split::kRows, 1}, columns{Split::kColumns, 1}, qkv{Split::kColumns, 3};
  add("wte", {o.vocab, d}, sigma, 0, rows);  // TENSOR: split by vocabulary
  add("wpe", {o.context, d}, sigma, 0);
  for (int l = 0; l < o.layers; ++l) {
    const std::string h = absl::StrCat("h", l, ".");
    add(h + "ln1.gamma", {d}, 0, 1);
    add(h + "ln1.beta", {d}, 0, 0);
    add(h + "attn.qkv.weight", {d, 3 * d}, sigma, 0, qkv);  // column-parallel, by heads
    add(h + "attn.qkv.bias", {3 * d}, 0, 0, qkv);
    add(h + "attn.proj.weight", {d, d}, residual, 0, rows);  // row-parallel
    add(h + "attn.proj.bias", {d}, 0, 0);
    add(h + "ln2.gamma", {d}, 0, 1);
    add(h + "ln2.beta", {d}, 0, 0);
    add(h + "mlp.fc.weight", {d, 4 * d}, sigma, 0, columns);  // column-parallel
    add(h + "mlp.fc.bias", {4 * d}, 0, 0, columns);
    add(h + "mlp.proj.weight", {4 * d, d}, residual, 0, rows);  // row-parallel
    add(h + "mlp.proj.bias", {d}, 0, 0);
  }
  add("lnf.gamma", {d}, 0, 1);
  add("lnf.beta", {d}, 0, 0);
  spec.max_tensor_parallel = std::gcd(o.heads, o.vocab);
  const int lnf = LnfGamma(o.layers);
  const double t = o.context;
  spec.layer_params.push_back({kWte, kWpe});  // the embedding: a lookup and an add
  spec.layer_costs.push_back(t * d);
  for (int l = 0; l < o.layers; ++l) {
    std::vector<int> block;
    for (int i = 0; i < kBlockTensors; ++i) block.push_back(BlockParam(l, i));
    spec.layer_params.push_back(std::move(block));
    spec.layer_costs.push_back(t * 12 * d * d + 2 * t * t * d);  // weights + attention
  }
  spec.layer_params.push_back({lnf, lnf + 1});  // the head, which reads wte
  spec.layer_costs.push_back(t * d * o.vocab);
  spec.layer_reads.assign(spec.layer_params.size(), {});
  spec.layer_reads.back() = {kWte};
  return spec;
}

absl::StatusOr<std::unique_ptr<ModelDef>> MakeGptDef(const GptOptions& options, uint64_t seed) {
  RETURN_IF_ERROR(ValidateGpt(options));
  return std::unique_ptr<ModelDef>(new GptDef(options, seed));
}

}  // namespace pscluster::model
