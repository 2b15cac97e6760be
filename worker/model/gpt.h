// A decoder-only transformer language model (GPT-2's layout) on a compute::Backend:
// token and position embeddings, `layers` blocks of (LayerNorm, causal multi-head
// self-attention, residual, LayerNorm, GELU MLP of 4 x width, residual), a final LayerNorm
// and a head tied to the token embedding, with the cross-entropy of every next token.
//
// Data: an example is a window of `context` token ids, held as floats (x, dim = context),
// and its labels are the next token at every position (y, label_width = context). The
// loss is the mean over all positions of the batch; StepResult::examples and correct
// count positions (tokens), so correct / examples is the next-token accuracy.
//
// Parameters (spec order; y = x W + b, W stored in x out):
//   0 "wte" {vocab, width}, 1 "wpe" {context, width},
//   then for block l, from index 2 + 12 l: "h<l>.ln1.gamma", "h<l>.ln1.beta",
//   "h<l>.attn.qkv.weight" {width, 3 width} (columns: q, k, v; head h is columns
//   [h dh, (h + 1) dh) of each, dh = width / heads), "h<l>.attn.qkv.bias",
//   "h<l>.attn.proj.weight" {width, width}, "h<l>.attn.proj.bias", "h<l>.ln2.gamma",
//   "h<l>.ln2.beta", "h<l>.mlp.fc.weight" {width, 4 width}, "h<l>.mlp.fc.bias",
//   "h<l>.mlp.proj.weight" {4 width, width}, "h<l>.mlp.proj.bias",
//   and last "lnf.gamma", "lnf.beta".
// Layers (ModelSpec::layer_params): layer 0 is the embedding (wte, wpe), layer 1 + l is
// block l, and layer layers + 1 the head (lnf), which also reads wte (layer_reads): the
// tied embedding's gradient is complete only after the embedding's backward, which comes
// last. A pipeline stage holding the head keeps a copy of wte (the pipeline placement
// sums the two copies' gradients).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/compute/backend.h"
#include "worker/model/model.h"

namespace pscluster::model {

struct GptOptions {
  int layers = 4;
  int heads = 4;
  int width = 256;    // divisible by heads
  int context = 128;  // tokens per example
  int vocab = 256;    // bytes
  float ln_eps = 1e-5f;
};

// INVALID_ARGUMENT (naming the field) for sizes < 1 or a width not divisible by heads.
absl::Status ValidateGpt(const GptOptions& options);

// The spec: weights N(0, 0.02^2) (the residual projections, attn.proj and mlp.proj, with
// 0.02 / sqrt(2 layers) as GPT-2), biases and LayerNorm betas 0, gammas 1; tensor i seeded
// by seed * 1000 + i. Layer costs: multiply-adds per example.
ModelSpec GptSpec(const GptOptions& options, uint64_t seed);

// The GPT as a ModelDef: instances of the whole model or of a pipeline stage (any layer
// range, with slots for the micro-batches in flight).
absl::StatusOr<std::unique_ptr<ModelDef>> MakeGptDef(const GptOptions& options, uint64_t seed);

}  // namespace pscluster::model
