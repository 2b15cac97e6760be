// The GPT's instances (worker/model/gpt.h): the Model a GptDef creates, with its buffers.
// gpt_model.cc builds instances and checks their input; gpt_layers.cc computes the forward
// and backward passes. Only worker/model/gpt.cc and these use it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/model/gpt.h"
#include "worker/model/model.h"

namespace pscluster::model::internal {

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

inline int BlockParam(int block, int tensor) { return 2 + kBlockTensors * block + tensor; }
inline int LnfGamma(int layers) { return 2 + kBlockTensors * layers; }

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

}  // namespace pscluster::model::internal
