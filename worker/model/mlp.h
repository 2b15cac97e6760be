// A multi-layer perceptron (fully connected layers, ReLU between them, softmax
// cross-entropy on top) trained through a compute::Backend, so the same code runs on the
// CPU and on CUDA. The model computes losses and gradients only; the optimiser (and the
// parameter server) live outside and move parameters in and out with Set/GetParam.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/model/model.h"

namespace pscluster::model {

struct MlpOptions {
  // Input width, hidden widths..., number of classes.
  std::vector<int> layers = {784, 256, 128, 64, 10};
  // Pipeline stages: this Mlp computes layers [first_layer, end_layer) of the network only
  // (end_layer -1: to the last). A stage's parameters are those layers' (names keep the
  // global layer index); its input is the previous stage's output (after the ReLU).
  int first_layer = 0;
  int end_layer = -1;
  // Pipeline: activations are kept for this many micro-batches in flight (slots), each of
  // up to max_batch examples.
  int slots = 1;
  // FSDP: every layer's parameters and gradients live in ONE buffer pair sized for the
  // largest layer, filled layer by layer through LayerHooks; only ForwardBackward with
  // hooks may then be used (not Evaluate).
  bool share_layer_buffers = false;
  // ForwardBackward also computes the gradient w.r.t. the input, through a ReLU on the
  // input (the input must be a ReLU's output or non-negative), for GetInputGrad.
  bool input_gradient = false;
};

// A multi-layer perceptron on a compute Backend. Parameters: for each layer i,
// "fc<i>.weight" of in x out floats (row-major, y = x W + b) and "fc<i>.bias" of out floats,
// in that order (index 2i and 2i+1). Parameters start at zero; set them with SetParam
// (for instance from InitialParams). The backend must outlive the Mlp, which holds all its
// buffers (parameters, gradients, activations for max_batch examples) from Create on.
// Not thread-safe.
class Mlp final : public Model {
 public:
  // INVALID_ARGUMENT for a null backend, fewer than 2 layers, a layer size < 1, or
  // max_batch < 1; RESOURCE_EXHAUSTED if the backend cannot allocate.
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(compute::Backend* backend, MlpOptions options,
                                                     int max_batch);
  // The checks of Create without allocating anything.
  static absl::Status Validate(const MlpOptions& options, int max_batch);
  ~Mlp() override;
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const std::vector<Param>& params() const override { return params_; }
  const MlpOptions& options() const { return options_; }
  int max_batch() const { return max_batch_; }

  // The spec's initial values (MlpSpec: Glorot-uniform weights from core/init, zero
  // biases), host vectors in params() order: what every mode starts from.
  static std::vector<std::vector<float>> InitialParams(const MlpOptions& options, uint64_t seed);

  // Copies params()[index].size floats in (SetParam) or out (GetParam). index must be in
  // [0, params().size()).
  void SetParam(int index, const float* host) override;
  void GetParam(int index, float* host) const override;

  // Forward and backward on a host batch (x: batch * layers[0] floats, y: labels in
  // [0, classes)); INVALID_ARGUMENT if batch > max_batch or < 1, or a label is out of
  // range. Gradients of the MEAN loss over the batch, readable with GetGrad.
  absl::StatusOr<StepResult> ForwardBackward(const float* x, const int32_t* y, int batch,
                                             const LayerHooks* hooks = nullptr) override;
  // With input_gradient: the gradient of the last ForwardBackward's mean loss w.r.t. its
  // input (batch * input_width floats).
  void GetInputGrad(float* host, int batch) const;

  // Pipeline stages (any layer range). StageForward runs micro-batch `slot`'s `batch`
  // examples (x: batch * input width, host) through the stage; unless the stage ends the
  // network, `out` receives its output (batch * output width, after the ReLU).
  // StageBackward for the same slot: the last stage takes the labels (dout null), any
  // other the gradient of the loss w.r.t. its output (labels null). Gradients are
  // ACCUMULATED scaled by grad_scale (start a batch with ZeroGrads); unless the stage
  // starts the network, dx receives the gradient w.r.t. its input, already through the
  // previous stage's ReLU. The last stage returns the micro-batch's loss and accuracy.
  absl::Status StageForward(int slot, const float* x, int batch, float* out) override;
  absl::StatusOr<StepResult> StageBackward(int slot, const int32_t* labels, const float* dout,
                                           int batch, float grad_scale, float* dx) override;
  void ZeroGrads() override;
  bool first_stage() const override { return first_ == 0; }
  bool last_stage() const override { return end_ + 1 == static_cast<int>(options_.layers.size()); }
  int input_width() const override { return options_.layers[first_]; }
  int output_width() const override { return options_.layers[end_]; }
  // Copies the gradient of params()[index] from the last ForwardBackward.
  void GetGrad(int index, float* host) const override;

  // Forward only, over any number of examples (processed in max_batch chunks; gradients
  // untouched). The loss is the mean over all `count`. count == 0 gives an all-zero
  // result; INVALID_ARGUMENT for count < 0, count >= 2^31 (StepResult counts are int) or a
  // label out of range.
  absl::StatusOr<StepResult> Evaluate(const float* x, const int32_t* y, int64_t count) override;

 private:
  Mlp(compute::Backend* backend, MlpOptions options, int max_batch);

  int classes() const { return options_.layers.back(); }
  absl::Status CheckLabels(const int32_t* y, int64_t count) const;
  absl::Status CheckBatch(int batch) const;
  absl::Status CheckStage(int slot, int batch) const;  // CheckBatch, and a slot in range
  // Uploads `batch` examples into slot `slot` and runs the layers (calling hooks->before
  // when given); the output ends in activation(end_, slot).
  absl::Status Forward(int slot, const float* x, int batch, const LayerHooks* hooks);
  // Backward from delta(end_, slot) down to layer first_ (dx: delta(first_) when wanted):
  // accumulate adds into the gradients, scaled by grad_scale.
  absl::Status Backward(int slot, int batch, float grad_scale, bool accumulate, bool input_delta,
                        const LayerHooks* hooks);
  // Buffers of global layer boundary i for micro-batch slot `slot`.
  float* activation(int i, int slot) const {
    return activations_[i - first_] + static_cast<size_t>(slot) * max_batch_ * options_.layers[i];
  }
  float* delta(int i, int slot) const {
    return deltas_[i - first_] + static_cast<size_t>(slot) * max_batch_ * options_.layers[i];
  }
  float* value(int layer, int which) const { return values_[2 * (layer - first_) + which]; }
  float* grad(int layer, int which) const { return grads_[2 * (layer - first_) + which]; }

  compute::Backend* const backend_;
  const MlpOptions options_;
  const int max_batch_;
  int first_ = 0, end_ = 0;  // the layers [first_, end_) this Mlp computes
  std::vector<Param> params_;
  std::vector<float*> owned_;   // every backend allocation (values_/grads_ may alias)
  float* ones_ = nullptr;       // max_batch ones: bias gradients by GEMM (accumulating)
  std::vector<float*> values_;  // backend buffers in params() order
  std::vector<float*> grads_;   // same shapes as values_
  // activations_[i - first_] is the input of layer i (the output of layer i - 1: after
  // the ReLU for hidden layers), activations_[end_ - first_] the stage's output (logits on
  // the last stage); deltas_ alike: d(loss)/d(pre-activation) of the same boundary, after
  // the ReLU backward. Each holds `slots` micro-batches of max_batch rows.
  std::vector<float*> activations_;
  std::vector<float*> deltas_;
};

// The MLP's spec: for each layer i, "fc<i>.weight" ({in, out}, Glorot-uniform seeded by
// seed * 1000 + 2i) and "fc<i>.bias" ({out}, zeros); layer i's cost in * out.
ModelSpec MlpSpec(const MlpOptions& options, uint64_t seed);

// The MLP as a ModelDef (InstanceOptions override the stage fields of `options`).
absl::StatusOr<std::unique_ptr<ModelDef>> MakeMlpDef(const MlpOptions& options, uint64_t seed);

}  // namespace pscluster::model
