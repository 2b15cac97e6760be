// A multi-layer perceptron (fully connected layers, ReLU between them, softmax
// cross-entropy on top) trained through a compute::Backend, so the same code runs on the
// CPU and on CUDA. The model computes losses and gradients only; the optimiser (and the
// parameter server) live outside and move parameters in and out with Set/GetParam.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"

namespace pscluster::model {

struct MlpOptions {
  // Input width, hidden widths..., number of classes.
  std::vector<int> layers = {784, 256, 128, 64, 10};
};

struct StepResult {
  float loss = 0;   // mean softmax cross-entropy over the examples
  int correct = 0;  // examples whose argmax logit is the label
  int examples = 0;
};

// A multi-layer perceptron on a compute Backend. Parameters: for each layer i,
// "fc<i>.weight" of in x out floats (row-major, y = x W + b) and "fc<i>.bias" of out floats,
// in that order (index 2i and 2i+1). Parameters start at zero; set them with SetParam
// (for instance from InitialParams). The backend must outlive the Mlp, which holds all its
// buffers (parameters, gradients, activations for max_batch examples) from Create on.
// Not thread-safe.
class Mlp {
 public:
  // INVALID_ARGUMENT for a null backend, fewer than 2 layers, a layer size < 1, or
  // max_batch < 1; RESOURCE_EXHAUSTED if the backend cannot allocate.
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(compute::Backend* backend, MlpOptions options,
                                                     int max_batch);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  struct Param {
    std::string name;
    size_t size;
  };
  const std::vector<Param>& params() const { return params_; }
  const MlpOptions& options() const { return options_; }
  int max_batch() const { return max_batch_; }

  // Glorot-uniform weights U(-sqrt(6/(in+out)), +sqrt(6/(in+out))) and zero biases, from
  // std::mt19937_64(seed): the reference initialisation, host vectors in params() order.
  // Each weight, in order, is limit * (2u - 1) with u = (gen() >> 40) * 2^-24, so the
  // values are the same with every standard library.
  static std::vector<std::vector<float>> InitialParams(const MlpOptions& options, uint64_t seed);

  // Copies params()[index].size floats in (SetParam) or out (GetParam). index must be in
  // [0, params().size()).
  void SetParam(int index, const float* host);
  void GetParam(int index, float* host) const;

  // Forward and backward on a host batch (x: batch * layers[0] floats, y: labels in
  // [0, classes)); INVALID_ARGUMENT if batch > max_batch or < 1, or a label is out of
  // range. Gradients of the MEAN loss over the batch, readable with GetGrad.
  absl::StatusOr<StepResult> ForwardBackward(const float* x, const int32_t* y, int batch);
  // Copies the gradient of params()[index] from the last ForwardBackward.
  void GetGrad(int index, float* host) const;

  // Forward only, over any number of examples (processed in max_batch chunks; gradients
  // untouched). The loss is the mean over all `count`. count == 0 gives an all-zero
  // result; INVALID_ARGUMENT for count < 0, count >= 2^31 (StepResult counts are int) or a
  // label out of range.
  absl::StatusOr<StepResult> Evaluate(const float* x, const int32_t* y, int64_t count);

 private:
  Mlp(compute::Backend* backend, MlpOptions options, int max_batch);

  int num_layers() const { return static_cast<int>(options_.layers.size()) - 1; }
  int classes() const { return options_.layers.back(); }
  absl::Status CheckLabels(const int32_t* y, int64_t count) const;
  // Uploads `batch` examples and runs the layers; the logits end in activations_.back().
  void Forward(const float* x, int batch);

  compute::Backend* const backend_;
  const MlpOptions options_;
  const int max_batch_;
  std::vector<Param> params_;
  std::vector<float*> values_;  // backend buffers in params() order
  std::vector<float*> grads_;   // same shapes as values_
  // activations_[0] is the input; activations_[i + 1] the output of layer i (after ReLU
  // for hidden layers, the logits for the last). deltas_[i] is d(loss)/d(activations_[i])
  // for i >= 1 (deltas_[0] is unused and null).
  std::vector<float*> activations_;
  std::vector<float*> deltas_;
};

}  // namespace pscluster::model
