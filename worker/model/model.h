// The model interface every placement and the trainer are written against.
//
// A model is described by a ModelSpec (what it holds: named dense tensors with shapes and
// initializers, grouped into layers with a cost each, and embedding tables keyed by
// uint64 id) and instantiated on a compute backend as a Model (buffers, forward and
// backward). The spec is enough to lay out tables, check a hand-over state, initialise
// and split into pipeline stages; instances compute. The optimiser lives outside: a
// model computes losses and gradients, and parameters move in and out with
// SetParam/GetGrad (dense) and SetRows/GetRowGrads (embedding rows).
//
// Sparse inputs: a model with embedding tables maps each example to ids (Keys); before a
// forward pass the rows of the ids it touches must have been set (SetRows; rows set once
// stay until replaced), and after the backward pass GetRowGrads returns the gradient of
// each row the batch touched. PS mode pulls and pushes just those rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"
#include "worker/compute/backend.h"

namespace pscluster::model {

struct TensorSpec {
  std::string name;            // unique in the model, e.g. "fc0.weight"
  std::vector<int64_t> shape;  // row-major
  ps::InitializerConfig init;  // the one initializer (core/init): tables and references alike
  size_t size() const;         // product of shape
};

// How TENSOR mode splits a dense tensor over T workers (Megatron-LM): kRows gives worker r
// rows [r n/T, (r + 1) n/T) of the first dimension; kColumns columns of the last dimension
// (a 1-D tensor is one row), cut into `groups` equal groups first and each group split
// (the fused q|k|v projection: worker r takes its heads' q, k and v columns).
struct TensorSplit {
  enum Kind { kReplicated, kRows, kColumns };
  Kind kind = kReplicated;
  int groups = 1;
};

struct EmbeddingSpec {
  std::string name;            // unique in the model, e.g. "emb0"
  int dim = 0;                 // floats per row
  uint64_t vocab = 0;          // ids are in [0, vocab)
  ps::InitializerConfig init;  // a row is created on first touch from (init, id)
};

struct ModelSpec {
  std::string kind;                            // "mlp", "embedding", ...
  std::vector<TensorSpec> params;              // dense tensors, in a fixed order
  std::vector<EmbeddingSpec> embeddings;       // sparse tables
  std::vector<std::vector<int>> layer_params;  // per layer: indices into params
  // Per layer (empty, or one entry per layer): tensors of OTHER layers it also reads (a
  // tied weight, as the GPT's head reads the token embedding). A pipeline stage holding
  // such a layer keeps a copy of the tensor, and the two copies' gradients are summed.
  std::vector<std::vector<int>> layer_reads;
  std::vector<double> layer_costs;  // per layer: multiply-adds per example
  int input_width = 0;              // floats per example of the input
  int label_width = 1;              // labels per example (a language model: context)
  int classes = 0;
  int eval_batch = 1024;  // examples per chunk when evaluating (memory)
  // TENSOR mode: per param, how it splits (empty: the model has no tensor-parallel form).
  std::vector<TensorSplit> splits;
  // TENSOR mode: a worker count T can split the model when T divides this.
  int max_tensor_parallel = 1;
  int num_layers() const { return static_cast<int>(layer_params.size()); }
};

// FSDP: called by ForwardBackward around each layer. `before` must load the layer's
// tensors with SetParam (backward: true when it is for the layer's backward pass); a pass
// that reads none of them calls no `before` (the MLP's first layer's backward without an
// input gradient, the GPT's embedding's). after_backward may read the layer's gradients
// with GetGrad.
struct LayerHooks {
  std::function<absl::Status(int layer, bool backward)> before;
  std::function<absl::Status(int layer)> after_backward;
  // TENSOR mode (an instance with tensor_size > 1), on backend buffers: sum `n` floats over
  // the tensor-parallel workers in place; and concatenate every worker's rows x cols
  // matrix side by side into `out` (rows x tensor_size * cols, worker r's columns at r cols).
  std::function<absl::Status(float* data, size_t n)> all_reduce_sum;
  std::function<absl::Status(const float* local, int rows, int cols, float* out)>
      all_gather_columns;
};

struct StepResult {
  float loss = 0;   // mean loss over the examples
  int correct = 0;  // examples whose argmax logit is the label
  int examples = 0;
};

// How one instance is built.
struct InstanceOptions {
  int max_batch = 64;
  // Pipeline stages: the instance computes layers [first_layer, end_layer) only (-1: to
  // the last); its params() are those layers' tensors, names kept.
  int first_layer = 0;
  int end_layer = -1;
  int slots = 1;  // pipeline: activations kept for this many micro-batches
  // FSDP: one layer's tensors at a time, loaded through LayerHooks.
  bool share_layer_buffers = false;
  // TENSOR: this instance holds worker tensor_rank's part of every tensor
  // (ModelSpec::splits); params() sizes are the parts'. ForwardBackward then needs the
  // hooks' collectives.
  int tensor_rank = 0;
  int tensor_size = 1;
};

// The whole model for batches of up to max_batch examples.
inline InstanceOptions WholeModel(int max_batch) {
  InstanceOptions o;
  o.max_batch = max_batch;
  return o;
}

// One instance on a backend. Not thread-safe.
class Model {
 public:
  virtual ~Model() = default;

  struct Param {
    std::string name;
    size_t size;
    int index;  // in ModelSpec::params
  };
  // This instance's dense tensors (a stage's subset), in spec order.
  virtual const std::vector<Param>& params() const = 0;
  // Copies params()[index].size floats in (SetParam) or out (GetParam, GetGrad).
  virtual void SetParam(int index, const float* host) = 0;
  virtual void GetParam(int index, float* host) const = 0;
  virtual void GetGrad(int index, float* host) const = 0;

  // Embedding table `table`'s ids of `batch` examples of x: sorted, unique.
  virtual std::vector<uint64_t> Keys(int table, const float* x, int batch) const { return {}; }
  // Rows of `keys` (keys.size() * dim floats) into the instance's rows of `table`.
  virtual absl::Status SetRows(int table, absl::Span<const uint64_t> keys,
                               absl::Span<const float> rows) {
    return absl::FailedPreconditionError("this model has no embedding tables");
  }
  // After ForwardBackward: the gradient of each row of Keys(table, batch) in key order.
  virtual void GetRowGrads(int table, absl::Span<float> grads) const {}

  // Forward and backward on a host batch (x: batch * input_width floats, y: labels);
  // INVALID_ARGUMENT for a bad batch size or label, FAILED_PRECONDITION for a row not set.
  // Gradients are of the MEAN loss over the batch.
  virtual absl::StatusOr<StepResult> ForwardBackward(const float* x, const int32_t* y, int batch,
                                                     const LayerHooks* hooks = nullptr) = 0;
  // Forward only over `count` examples (gradients untouched).
  virtual absl::StatusOr<StepResult> Evaluate(const float* x, const int32_t* y, int64_t count) = 0;

  // Pipeline stages (see Mlp for the contract). Gradients accumulate scaled by grad_scale.
  virtual absl::Status StageForward(int slot, const float* x, int batch, float* out) = 0;
  virtual absl::StatusOr<StepResult> StageBackward(int slot, const int32_t* labels,
                                                   const float* dout, int batch, float grad_scale,
                                                   float* dx) = 0;
  virtual void ZeroGrads() = 0;
  virtual bool first_stage() const = 0;
  virtual bool last_stage() const = 0;
  virtual int input_width() const = 0;   // floats per example into this instance
  virtual int output_width() const = 0;  // floats per example out of it
};

// A model kind with its sizes: the spec and a factory of instances. Immutable.
class ModelDef {
 public:
  virtual ~ModelDef() = default;
  virtual const ModelSpec& spec() const = 0;
  // INVALID_ARGUMENT for options the model cannot honour (e.g. stages of a model with
  // embeddings), RESOURCE_EXHAUSTED when the backend cannot allocate.
  virtual absl::StatusOr<std::unique_ptr<Model>> Create(compute::Backend* backend,
                                                        const InstanceOptions& options) const = 0;
};

}  // namespace pscluster::model
