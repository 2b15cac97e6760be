#include "worker/model/mlp.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"

namespace pscluster::model {

absl::Status Mlp::Validate(const MlpOptions& options, int max_batch) {
  if (options.layers.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mlp needs at least 2 layer sizes (input and classes), got ", options.layers.size()));
  }
  for (size_t i = 0; i < options.layers.size(); ++i) {
    if (options.layers[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Mlp layer ", i, " has size ", options.layers[i], "; sizes must be >= 1"));
    }
  }
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Mlp max_batch must be >= 1, got ", max_batch));
  }
  const int total = static_cast<int>(options.layers.size()) - 1;
  const int end = options.end_layer < 0 ? total : options.end_layer;
  if (options.first_layer < 0 || options.first_layer >= end || end > total) {
    return absl::InvalidArgumentError(absl::StrCat("Mlp layer range [", options.first_layer, ", ",
                                                   end, ") is not within the ", total, " layers"));
  }
  if (options.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Mlp slots must be >= 1, got ", options.slots));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(compute::Backend* backend, MlpOptions options,
                                                 int max_batch) {
  if (backend == nullptr) return absl::InvalidArgumentError("Mlp needs a backend");
  RETURN_IF_ERROR(Validate(options, max_batch));
  const int total = static_cast<int>(options.layers.size()) - 1;
  const int end = options.end_layer < 0 ? total : options.end_layer;
  // Not make_unique: the constructor is private. The destructor frees whatever was
  // allocated should an allocation below fail.
  std::unique_ptr<Mlp> mlp(new Mlp(backend, std::move(options), max_batch));
  mlp->first_ = mlp->options_.first_layer;
  mlp->end_ = end;
  const std::vector<int>& layers = mlp->options_.layers;
  auto alloc = [&](size_t n) {
    float* p = backend->Alloc(n);
    if (p != nullptr) mlp->owned_.push_back(p);
    return p;
  };
  auto exhausted = [&](const std::string& what) {
    return absl::ResourceExhaustedError(
        absl::StrCat("backend ", backend->name(), " could not allocate ", what));
  };
  size_t max_weight = 0, max_bias = 0;
  for (int i = mlp->first_; i < end; ++i) {
    const size_t in = layers[i], out = layers[i + 1];
    mlp->params_.push_back({absl::StrCat("fc", i, ".weight"), in * out, 2 * i});
    mlp->params_.push_back({absl::StrCat("fc", i, ".bias"), out, 2 * i + 1});
    max_weight = std::max(max_weight, in * out);
    max_bias = std::max(max_bias, out);
  }
  if (mlp->options_.share_layer_buffers) {  // one layer's weight + bias, reused by every layer
    float* values = alloc(max_weight + max_bias);
    float* grads = alloc(max_weight + max_bias);
    if (values == nullptr || grads == nullptr) return exhausted("the shared layer buffers");
    for (int i = mlp->first_; i < end; ++i) {
      mlp->values_.insert(mlp->values_.end(), {values, values + max_weight});
      mlp->grads_.insert(mlp->grads_.end(), {grads, grads + max_weight});
    }
  } else {
    for (const Param& p : mlp->params_) {
      mlp->values_.push_back(alloc(p.size));
      mlp->grads_.push_back(alloc(p.size));
      if (mlp->values_.back() == nullptr || mlp->grads_.back() == nullptr) return exhausted(p.name);
    }
  }
  const size_t rows = static_cast<size_t>(max_batch) * mlp->options_.slots;
  for (int i = mlp->first_; i <= end; ++i) {
    mlp->activations_.push_back(alloc(rows * layers[i]));
    mlp->deltas_.push_back(alloc(rows * layers[i]));
    if (mlp->activations_.back() == nullptr || mlp->deltas_.back() == nullptr) {
      return exhausted("activations");
    }
  }
  mlp->ones_ = alloc(max_batch);
  if (mlp->ones_ == nullptr) return exhausted("activations");
  backend->Upload(std::vector<float>(max_batch, 1.0f).data(), mlp->ones_, max_batch);
  return mlp;
}

Mlp::Mlp(compute::Backend* backend, MlpOptions options, int max_batch)
    : backend_(backend), options_(std::move(options)), max_batch_(max_batch) {}

Mlp::~Mlp() {
  for (float* p : owned_) backend_->Free(p);
}

std::vector<std::vector<float>> Mlp::InitialParams(const MlpOptions& options, uint64_t seed) {
  std::vector<std::vector<float>> params;
  for (const TensorSpec& t : MlpSpec(options, seed).params) {
    params.emplace_back(t.size());
    core::InitDense(t.init, 0, absl::MakeSpan(params.back()));
  }
  return params;
}

void Mlp::SetParam(int index, const float* host) {
  assert(index >= 0 && index < static_cast<int>(params_.size()));
  backend_->Upload(host, values_[index], params_[index].size);
}

void Mlp::GetParam(int index, float* host) const {
  assert(index >= 0 && index < static_cast<int>(params_.size()));
  backend_->Download(values_[index], host, params_[index].size);
}

void Mlp::GetInputGrad(float* host, int batch) const {
  assert(options_.input_gradient && first_ == 0);
  backend_->Download(delta(0, 0), host, static_cast<size_t>(batch) * options_.layers[0]);
}

void Mlp::GetGrad(int index, float* host) const {
  assert(index >= 0 && index < static_cast<int>(params_.size()));
  backend_->Download(grads_[index], host, params_[index].size);
}

absl::Status Mlp::CheckLabels(const int32_t* y, int64_t count) const {
  for (int64_t i = 0; i < count; ++i) {
    if (y[i] < 0 || y[i] >= classes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", y[i], " of example ", i, " is outside [0, ", classes(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status Mlp::CheckBatch(int batch) const {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch ", batch, " is outside [1, max_batch = ", max_batch_, "]"));
  }
  return absl::OkStatus();
}

absl::Status Mlp::Forward(int slot, const float* x, int batch, const LayerHooks* hooks) {
  const std::vector<int>& layers = options_.layers;
  const int top = static_cast<int>(layers.size()) - 1;
  backend_->Upload(x, activation(first_, slot), static_cast<size_t>(batch) * layers[first_]);
  for (int i = first_; i < end_; ++i) {
    if (hooks != nullptr && hooks->before) {
      RETURN_IF_ERROR(hooks->before(i, /*backward=*/false));
    }
    const int in = layers[i], out = layers[i + 1];
    float* y = activation(i + 1, slot);
    // y[batch x out] = x[batch x in] * W[in x out] + b.
    backend_->Gemm(false, false, batch, out, in, 1.0f, activation(i, slot), value(i, 0), 0.0f, y);
    backend_->AddRowVector(y, value(i, 1), batch, out);
    if (i + 1 < top) backend_->Relu(y, y, static_cast<size_t>(batch) * out);
  }
  return absl::OkStatus();
}

absl::Status Mlp::Backward(int slot, int batch, float grad_scale, bool accumulate, bool input_delta,
                           const LayerHooks* hooks) {
  const std::vector<int>& layers = options_.layers;
  const float beta = accumulate ? 1.0f : 0.0f;
  for (int i = end_ - 1; i >= first_; --i) {
    // Only the input gradient reads W: a first layer that computes none needs no load (for
    // FSDP, the all-gather of the largest layer of most MLPs, saved).
    const bool input_grad = i > first_ || input_delta;
    if (input_grad && hooks != nullptr && hooks->before) {
      RETURN_IF_ERROR(hooks->before(i, /*backward=*/true));
    }
    const int in = layers[i], out = layers[i + 1];
    const float* dy = delta(i + 1, slot);
    // dW[in x out] = x^T[in x batch] * dy[batch x out]; db = column sums of dy.
    backend_->Gemm(true, false, in, out, batch, grad_scale, activation(i, slot), dy, beta,
                   grad(i, 0));
    if (accumulate || grad_scale != 1.0f) {  // db[1 x out] += scale * ones[1 x batch] * dy
      backend_->Gemm(false, false, 1, out, batch, grad_scale, ones_, dy, beta, grad(i, 1));
    } else {
      backend_->ColumnSums(dy, batch, out, grad(i, 1));
    }
    if (input_grad) {
      // dx[batch x in] = dy[batch x out] * W^T[out x in], then through the ReLU that made x.
      float* dx = delta(i, slot);
      backend_->Gemm(false, true, batch, in, out, 1.0f, dy, value(i, 0), 0.0f, dx);
      backend_->ReluBackward(activation(i, slot), dx, dx, static_cast<size_t>(batch) * in);
    }
    if (hooks != nullptr && hooks->after_backward) {
      RETURN_IF_ERROR(hooks->after_backward(i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Mlp::ForwardBackward(const float* x, const int32_t* y, int batch,
                                                const LayerHooks* hooks) {
  RETURN_IF_ERROR(CheckBatch(batch));
  if (!first_stage() || !last_stage()) {
    return absl::FailedPreconditionError("ForwardBackward needs the whole network; use Stage*");
  }
  if (options_.share_layer_buffers && hooks == nullptr) {
    return absl::FailedPreconditionError("shared layer buffers need LayerHooks");
  }
  RETURN_IF_ERROR(CheckLabels(y, batch));
  RETURN_IF_ERROR(Forward(0, x, batch, hooks));
  StepResult result;
  result.examples = batch;
  result.loss = backend_->SoftmaxCrossEntropy(activation(end_, 0), y, batch, classes(),
                                              delta(end_, 0), &result.correct);
  RETURN_IF_ERROR(Backward(0, batch, 1.0f, false, options_.input_gradient, hooks));
  return result;
}

absl::Status Mlp::CheckStage(int slot, int batch) const {
  RETURN_IF_ERROR(CheckBatch(batch));
  if (slot < 0 || slot >= options_.slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " is outside [0, ", options_.slots, ")"));
  }
  return absl::OkStatus();
}

absl::Status Mlp::StageForward(int slot, const float* x, int batch, float* out) {
  RETURN_IF_ERROR(CheckStage(slot, batch));
  RETURN_IF_ERROR(Forward(slot, x, batch, nullptr));
  if (!last_stage()) {
    backend_->Download(activation(end_, slot), out, static_cast<size_t>(batch) * output_width());
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Mlp::StageBackward(int slot, const int32_t* labels, const float* dout,
                                              int batch, float grad_scale, float* dx) {
  RETURN_IF_ERROR(CheckStage(slot, batch));
  StepResult result;
  if (last_stage()) {
    RETURN_IF_ERROR(CheckLabels(labels, batch));
    result.examples = batch;
    result.loss = backend_->SoftmaxCrossEntropy(activation(end_, slot), labels, batch, classes(),
                                                delta(end_, slot), &result.correct);
  } else {
    backend_->Upload(dout, delta(end_, slot), static_cast<size_t>(batch) * output_width());
  }
  RETURN_IF_ERROR(Backward(slot, batch, grad_scale, true, !first_stage(), nullptr));
  if (!first_stage()) {
    backend_->Download(delta(first_, slot), dx, static_cast<size_t>(batch) * input_width());
  }
  return result;
}

void Mlp::ZeroGrads() {
  for (size_t i = 0; i < params_.size(); ++i) {
    backend_->Upload(std::vector<float>(params_[i].size, 0.0f).data(), grads_[i], params_[i].size);
  }
}

absl::StatusOr<StepResult> Mlp::Evaluate(const float* x, const int32_t* y, int64_t count) {
  if (count < 0 || count > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("count ", count, " is outside [0, 2^31)"));
  }
  if (!first_stage() || !last_stage() || options_.share_layer_buffers) {
    return absl::FailedPreconditionError("Evaluate needs the whole network with its own buffers");
  }
  RETURN_IF_ERROR(CheckLabels(y, count));
  StepResult result;
  double total_loss = 0;
  const size_t width = options_.layers[0];
  for (int64_t start = 0; start < count; start += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, count - start));
    (void)Forward(0, x + start * width, batch, nullptr);  // no hooks: cannot fail
    int correct = 0;
    const float loss = backend_->SoftmaxCrossEntropy(activation(end_, 0), y + start, batch,
                                                     classes(), nullptr, &correct);
    total_loss += static_cast<double>(loss) * batch;
    result.correct += correct;
  }
  result.examples = static_cast<int>(count);
  result.loss = count > 0 ? static_cast<float>(total_loss / count) : 0.0f;
  return result;
}

namespace {

class MlpDef final : public ModelDef {
 public:
  MlpDef(MlpOptions options, uint64_t seed)
      : options_(std::move(options)), spec_(MlpSpec(options_, seed)) {}
  const ModelSpec& spec() const override { return spec_; }
  absl::StatusOr<std::unique_ptr<Model>> Create(compute::Backend* backend,
                                                const InstanceOptions& o) const override {
    MlpOptions options = options_;
    options.first_layer = o.first_layer;
    options.end_layer = o.end_layer;
    options.slots = o.slots;
    options.share_layer_buffers = o.share_layer_buffers;
    absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(backend, options, o.max_batch);
    if (!mlp.ok()) return mlp.status();
    return std::unique_ptr<Model>(*std::move(mlp));
  }

 private:
  const MlpOptions options_;
  const ModelSpec spec_;
};

}  // namespace

ModelSpec MlpSpec(const MlpOptions& options, uint64_t seed) {
  ModelSpec spec;
  spec.kind = "mlp";
  const std::vector<int>& w = options.layers;
  spec.input_width = w.empty() ? 0 : w.front();
  spec.classes = w.empty() ? 0 : w.back();
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    TensorSpec weight{absl::StrCat("fc", i, ".weight"), {w[i], w[i + 1]}, {}};
    weight.init.set_kind(ps::InitializerConfig::UNIFORM);  // Glorot uniform
    weight.init.set_scale(std::sqrt(6.0f / (w[i] + w[i + 1])));
    weight.init.set_seed(seed * 1000 + 2 * i);
    spec.params.push_back(std::move(weight));
    spec.params.push_back({absl::StrCat("fc", i, ".bias"), {w[i + 1]}, {}});  // zeros
    spec.layer_params.push_back({static_cast<int>(2 * i), static_cast<int>(2 * i + 1)});
    spec.layer_costs.push_back(double{1} * w[i] * w[i + 1]);
  }
  return spec;
}

absl::StatusOr<std::unique_ptr<ModelDef>> MakeMlpDef(const MlpOptions& options, uint64_t seed) {
  RETURN_IF_ERROR(Mlp::Validate(options, 1));
  return std::unique_ptr<ModelDef>(new MlpDef(options, seed));
}

}  // namespace pscluster::model
