#include "worker/model/internal/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::model::internal {

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

}  // namespace pscluster::model::internal
