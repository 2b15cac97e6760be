#include "worker/model/mlp.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pscluster::model {

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(compute::Backend* backend, MlpOptions options,
                                                 int max_batch) {
  if (backend == nullptr) return absl::InvalidArgumentError("Mlp needs a backend");
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
  // Not make_unique: the constructor is private. The destructor frees whatever was
  // allocated should an allocation below fail.
  std::unique_ptr<Mlp> mlp(new Mlp(backend, std::move(options), max_batch));
  const std::vector<int>& layers = mlp->options_.layers;
  for (int i = 0; i < mlp->num_layers(); ++i) {
    const size_t in = layers[i], out = layers[i + 1];
    mlp->params_.push_back({absl::StrCat("fc", i, ".weight"), in * out});
    mlp->params_.push_back({absl::StrCat("fc", i, ".bias"), out});
  }
  for (const Param& p : mlp->params_) {
    mlp->values_.push_back(backend->Alloc(p.size));
    mlp->grads_.push_back(backend->Alloc(p.size));
    if (mlp->values_.back() == nullptr || mlp->grads_.back() == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("backend ", backend->name(), " could not allocate ", p.name));
    }
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const size_t n = static_cast<size_t>(max_batch) * layers[i];
    mlp->activations_.push_back(backend->Alloc(n));
    mlp->deltas_.push_back(i == 0 ? nullptr : backend->Alloc(n));
    if (mlp->activations_.back() == nullptr || (i > 0 && mlp->deltas_.back() == nullptr)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("backend ", backend->name(), " could not allocate activations"));
    }
  }
  return mlp;
}

Mlp::Mlp(compute::Backend* backend, MlpOptions options, int max_batch)
    : backend_(backend), options_(std::move(options)), max_batch_(max_batch) {}

Mlp::~Mlp() {
  for (auto* buffers : {&values_, &grads_, &activations_, &deltas_}) {
    for (float* p : *buffers) backend_->Free(p);
  }
}

std::vector<std::vector<float>> Mlp::InitialParams(const MlpOptions& options, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<float>> params;
  for (size_t i = 0; i + 1 < options.layers.size(); ++i) {
    const int in = options.layers[i], out = options.layers[i + 1];
    const double limit = std::sqrt(6.0 / (in + out));
    std::vector<float> weight(static_cast<size_t>(in) * out);
    for (float& w : weight) {
      const double u = static_cast<double>(gen() >> 40) * 0x1p-24;  // [0, 1), 24 bits
      w = static_cast<float>(limit * (2 * u - 1));
    }
    params.push_back(std::move(weight));
    params.emplace_back(out, 0.0f);
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

void Mlp::Forward(const float* x, int batch) {
  const std::vector<int>& layers = options_.layers;
  backend_->Upload(x, activations_[0], static_cast<size_t>(batch) * layers[0]);
  for (int i = 0; i < num_layers(); ++i) {
    const int in = layers[i], out = layers[i + 1];
    float* y = activations_[i + 1];
    // y[batch x out] = x[batch x in] * W[in x out] + b.
    backend_->Gemm(false, false, batch, out, in, 1.0f, activations_[i], values_[2 * i], 0.0f, y);
    backend_->AddRowVector(y, values_[2 * i + 1], batch, out);
    if (i + 1 < num_layers()) backend_->Relu(y, y, static_cast<size_t>(batch) * out);
  }
}

absl::StatusOr<StepResult> Mlp::ForwardBackward(const float* x, const int32_t* y, int batch) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch ", batch, " is outside [1, max_batch = ", max_batch_, "]"));
  }
  if (absl::Status s = CheckLabels(y, batch); !s.ok()) return s;
  Forward(x, batch);

  const std::vector<int>& layers = options_.layers;
  const int top = num_layers();
  StepResult result;
  result.examples = batch;
  result.loss = backend_->SoftmaxCrossEntropy(activations_[top], y, batch, classes(), deltas_[top],
                                              &result.correct);
  for (int i = top - 1; i >= 0; --i) {
    const int in = layers[i], out = layers[i + 1];
    // dW[in x out] = x^T[in x batch] * dy[batch x out]; db = column sums of dy.
    backend_->Gemm(true, false, in, out, batch, 1.0f, activations_[i], deltas_[i + 1], 0.0f,
                   grads_[2 * i]);
    backend_->ColumnSums(deltas_[i + 1], batch, out, grads_[2 * i + 1]);
    if (i == 0) break;  // no gradient needed for the input
    // dx[batch x in] = dy[batch x out] * W^T[out x in], then through the ReLU that made x.
    backend_->Gemm(false, true, batch, in, out, 1.0f, deltas_[i + 1], values_[2 * i], 0.0f,
                   deltas_[i]);
    backend_->ReluBackward(activations_[i], deltas_[i], deltas_[i],
                           static_cast<size_t>(batch) * in);
  }
  return result;
}

absl::StatusOr<StepResult> Mlp::Evaluate(const float* x, const int32_t* y, int64_t count) {
  if (count < 0 || count > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("count ", count, " is outside [0, 2^31)"));
  }
  if (absl::Status s = CheckLabels(y, count); !s.ok()) return s;
  StepResult result;
  double total_loss = 0;
  const size_t width = options_.layers[0];
  for (int64_t start = 0; start < count; start += max_batch_) {
    const int batch = static_cast<int>(std::min<int64_t>(max_batch_, count - start));
    Forward(x + start * width, batch);
    int correct = 0;
    const float loss = backend_->SoftmaxCrossEntropy(activations_.back(), y + start, batch,
                                                     classes(), nullptr, &correct);
    total_loss += static_cast<double>(loss) * batch;
    result.correct += correct;
  }
  result.examples = static_cast<int>(count);
  result.loss = count > 0 ? static_cast<float>(total_loss / count) : 0.0f;
  return result;
}

}  // namespace pscluster::model
