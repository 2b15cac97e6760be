// psctl plan: how to lay out a training job on a GPU cluster, by arithmetic alone.
//
// From the model (a parameter count or a GPT-2-style shape), the data and the cluster, a
// Plan gives: memory per GPU for each layout (DDP, ZeRO-1/2/3, tensor x pipeline x data);
// the recommended layout and its communication per step; the data split into steps;
// compute time over an MFU range; checkpoint size, write time and the Young/Daly interval.
// Every figure is a closed formula over the input, written beside its field; nothing is
// measured and nothing reaches a cluster.
//
// Units: bytes, seconds, FLOP and FLOP/s; bandwidths in GB/s (1e9 bytes/s, one direction)
// except PlanInput::inter_node_gbit, in Gbit/s per node as NICs are sold. GB = 1e9 bytes.
//
// Thread-safe: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"

namespace pscluster::plan {

// What the operator gives: psctl plan's flags, one field each (same name). A 0 where the
// comment says so means "take it from elsewhere".
struct PlanInput {
  // The model: params, or the shape (layers, width, heads; vocab and context have
  // defaults). With both, params is the count and the shape gives the activations; with
  // params alone the shape is derived (DeriveShape).
  double params = 0;
  int64_t layers = 0;
  int64_t width = 0;
  int64_t heads = 0;
  int64_t vocab = 50257;   // GPT-2's BPE vocabulary
  int64_t context = 2048;  // tokens per sequence
  // The data: dataset_bytes or dataset_tokens, not both.
  double dataset_bytes = 0;
  double dataset_tokens = 0;
  double bytes_per_token = 4;  // BPE on English text; 1 for a byte-level model
  double epochs = 1;
  double global_batch_tokens = 4194304;  // 4 Mi, as GPT-3-class runs; 0: one micro-batch per rank
  int64_t micro_batch = 1;               // sequences per GPU per micro-step
  // The cluster.
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  std::string gpu = "a100-80gb";     // a preset (GpuPresets), or any name with the fields below
  double gpu_memory_bytes = 0;       // 0: the preset's
  double gpu_flops = 0;              // dense BF16 peak (or a measured GEMM rate); 0: the preset's
  double intra_node_gbps = 0;        // per GPU, one direction (NVLink); 0: the preset's
  double host_copy_gbps = 0;         // per GPU, device to host memory (PCIe); 0: the preset's
  double memory_gbps = 0;            // per GPU, its memory's bandwidth (HBM); 0: the preset's
  double inter_node_gbit = 100;      // per node, one direction, all its NICs together
  double checkpoint_write_gbps = 2;  // per node, to checkpoint storage
  double mtbf_hours = 1000;          // per node; the cluster's is this / nodes
  double mfu_low = 0.35;
  double mfu_high = 0.5;
  double memory_headroom = 0.1;  // fraction of GPU memory kept free (CUDA context, allocator)
  // "mixed" (bf16 weights, gradients and activations, fp32 master and Adam: 16 bytes/param)
  // or "fp32" (everything in float32, no dropout masks: 4 + 4 + 8 = 16 bytes/param, and
  // activations of 4 bytes, as pscluster's CPU workers train).
  std::string precision = "mixed";
  // > 0: the replica's (DDP's) state bytes per parameter of the framework planned for, when
  // it keeps more copies than the precision's 16 (pscluster's CPU replica: 24, the model's
  // weights and gradients beside the optimizer's weights, m, v and a flat gradient). ZeRO-1
  // and the TxPxD layouts shard what is beyond the weights and gradients over D.
  double state_bytes_per_param = 0;
  // Tensor parallelism with sequence parallelism (Megatron-LM since 2022): the LayerNorm and
  // residual activations split over T too. false: they are whole on every GPU (pscluster's
  // TENSOR mode).
  bool sequence_parallel = true;
};

// An accelerator: a --gpu preset, or a custom one (--gpu=cpu with measured figures).
struct Device {
  std::string name;
  double memory_bytes = 0;
  double flops = 0;  // peak FLOP/s
  double intra_node_gbps = 0;
  double host_copy_gbps = 0;
  double memory_gbps = 0;  // device memory bandwidth, read + write together
};

// a100-40gb, a100-80gb, h100-80gb, h200-141gb. Memory in GiB as nvidia-smi counts it (the
// datasheets' "80GB" is 81920 MiB); dense BF16 peaks 312e12 (A100), 989e12 (H100 SXM,
// H200); NVLink 600 and 900 GB/s both directions together, so 300 and 450 one way; PCIe
// 4.0 and 5.0 x16 device-to-host at about 25 and 50 GB/s achieved; HBM 1555 (A100 40GB),
// 2039 (A100 80GB), 3350 (H100 SXM) and 4800 GB/s (H200), the datasheets' figures.
const std::vector<Device>& GpuPresets();

// The preset with the input's fields that are set (non-zero) laid over it; with a name
// that is no preset, every field must be given. Errors name the flag.
absl::StatusOr<Device> ResolveDevice(const PlanInput& input);

struct Model {
  double params = 0;        // N: --params, or shape_params
  double shape_params = 0;  // 12·L·d² + 13·L·d + V·d + T·d + 2d (GPT-2, tied head)
  bool params_given = false;
  bool shape_derived = false;  // no shape given: DeriveShape
  int64_t layers = 0;          // L
  int64_t width = 0;           // h (d)
  int64_t heads = 0;           // a
  int64_t vocab = 0;           // V
  int64_t context = 0;         // s (T)
};

// GPT-2-style count: weights and biases of attention (4d² + 4d) and MLP (8d² + 5d), two
// LayerNorms (4d) per layer; token (V·d) and position (T·d) embeddings; final LayerNorm
// (2d); the head tied to the token embedding.
double ShapeParams(int64_t layers, int64_t width, int64_t vocab, int64_t context);

// A shape for a bare parameter count: GPT-3 13B's proportions, d = 128·L and heads of 128,
// so N ≈ 12·L·d² gives L = round(cbrt(N / (12·128²))) (13e9 -> L 40, d 5120, 40 heads).
Model DeriveShape(double params, int64_t vocab, int64_t context);

absl::StatusOr<Model> ResolveModel(const PlanInput& input);

// Activation bytes of one transformer layer for one micro-batch of b sequences of s tokens,
// width h, a heads, mixed precision, no recomputation (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models"): s·b·h·(34 + 5·a·s/h), divided by
// the tensor-parallel degree t with sequence parallelism; without it the LayerNorms' inputs
// and outputs (and dropout masks) stay whole: s·b·h·(10 + (24 + 5·a·s/h)/t). fp32, with no
// dropout: the same tensors in 4 bytes, s·b·h·(64 + 4·a·s/h), or without sequence
// parallelism s·b·h·(16 + (48 + 4·a·s/h)/t).
double ActivationBytesPerLayer(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t,
                               bool fp32 = false, bool sequence_parallel = true);

// FLOP per token of a training step (forward and backward): 6·N for the products with the
// weights and 12·L·s·h for attention's two products with the context (PaLM's accounting,
// Chowdhery et al. 2022, appendix B).
double FlopsPerToken(const Model& m);

// Elements per token that a training step's element-wise kernels read and write (forward
// and backward: about 3x the forward's; the GEMMs' operands not counted). Per layer,
// forward: two LayerNorms (2·h each), two residual adds (3·h each), GELU (8·h: 4·h in, 4·h
// out), softmax (2·a·s); once per token, the loss's softmax (2·V forward).
struct ElementwiseCounts {
  double whole = 0;  // per layer, 30·h: LayerNorms and residual adds (split over T only
                     // with sequence parallelism)
  double split = 0;  // per layer, 24·h + 6·a·s: GELU and softmax (split over T)
  double loss = 0;   // per token, 6·V: the loss's softmax (split over T)
};
ElementwiseCounts ElementwisePerTokenLayer(const Model& m);

// Young/Daly: the checkpoint interval that minimises lost time, sqrt(2 · C · MTBF).
double YoungDalyInterval(double checkpoint_seconds, double mtbf_seconds);

enum class Fit { kFits, kWithRecompute, kNo };

// Traffic of one kind, per GPU per step.
struct Collective {
  std::string what;  // "data parallel", "tensor parallel" or "pipeline"
  std::string how;   // which collectives, and the formula of their bytes
  double bytes = 0;  // each GPU sends this per step (and receives as much)
  bool inter_node = false;
  double gbps = 0;  // the bandwidth each GPU gets on the link it crosses
  double seconds = 0;
};

// T-way tensor x P-stage pipeline x D-way data parallelism; ZeRO stage `zero` over D.
struct Layout {
  std::string name;  // "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3/FSDP", "T2xP1xD16"
  int64_t t = 1, p = 1, d = 1;
  int zero = 0;                  // 0: state replicated over D
  int64_t micro_batches = 1;     // per data-parallel rank per step (gradient accumulation)
  double batch_sequences = 0;    // the global batch it runs: micro_batches · D · micro_batch
  double model_state_bytes = 0;  // 16 bytes/param, divided by T·P and by ZeRO over D
  double activation_bytes = 0;   // no recomputation
  // Working buffers beside the activations: the logits (4·s·b·V/T, float32 for the loss)
  // and, while a layer's backward runs, the gradients of its activations (one layer's
  // activations' worth).
  double buffer_bytes = 0;
  double activation_recompute_bytes = 0;  // full recomputation
  Fit fit = Fit::kNo;
  bool recompute = false;  // it fits only with full recomputation
  std::vector<Collective> collectives;
  double comm_bytes = 0;
  double comm_seconds = 0;
  // Per step at mfu_high, x4/3 with recomputation (one more forward), x(1 + (P-1)/m) for
  // the 1F1B bubble; plus comm_seconds (none assumed hidden). The recommended layout is the
  // fitting one with the least step_seconds per sequence of its batch (ties, within 1 %, go
  // to the earlier, simpler layout).
  // compute_seconds = (gemm_seconds + memory_seconds) x the factors above: gemm_seconds is
  // FlopsPerToken · tokens / (GPUs · peak · mfu_high), memory_seconds the element-wise
  // kernels' bytes (ElementwisePerTokenLayer, and 6·V/T per token for the loss's softmax)
  // and the optimizer reading and writing its state once, at memory_gbps.
  double gemm_seconds = 0;
  double memory_seconds = 0;
  double compute_seconds = 0;
  double step_seconds = 0;
};

struct DataSplit {
  double tokens = 0;        // per epoch: dataset_tokens or dataset_bytes / bytes_per_token
  double total_tokens = 0;  // tokens · epochs: the D of 6·N·D
  double tokens_per_gpu = 0;
  std::string layout;  // whose data-parallel degree sets the batch below
  int64_t data_parallel = 1;
  double batch_sequences = 0;
  double batch_tokens = 0;
  int64_t micro_batches = 1;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
};

struct Compute {
  double flops = 0;       // 6·N·D
  double peak_flops = 0;  // GPUs · per-GPU peak
  // 6·N·tokens / (peak · MFU): per step (batch tokens) and in all (total tokens).
  double step_seconds_low = 0, step_seconds_high = 0;  // at mfu_low, mfu_high
  double total_seconds_low = 0, total_seconds_high = 0;
};

// Checkpoints hold 12 bytes/param: the fp32 master weights, Adam's m and v. The bf16
// weights are the master's rounding and the gradients are empty at a step boundary, so a
// resume needs nothing else (frameworks that also write the bf16 copy store 14).
struct Checkpoint {
  double bytes = 0;
  double write_seconds = 0;  // bytes / (nodes · checkpoint_write_gbps): every node writes its part
  double pause_seconds = 0;  // asynchronous: each GPU copies bytes / GPUs to host memory
  double cluster_mtbf_seconds = 0;    // mtbf_hours · 3600 / nodes
  double interval_seconds = 0;        // Young/Daly with C = write_seconds
  double async_interval_seconds = 0;  // with C = pause_seconds, at least write_seconds
  double lost_seconds = 0;            // per failure: half an interval
  double async_lost_seconds = 0;
  double overhead = 0;           // C/τ + τ/(2·MTBF), of the run's time
  double async_overhead = 0;     // pause/τ + τ/(2·MTBF)
  double expected_failures = 0;  // the run at mfu_low / the cluster MTBF
};

struct Plan {
  PlanInput input;
  Device device;
  Model model;
  int64_t gpus = 0;
  double usable_memory_bytes = 0;  // memory · (1 - headroom)
  std::vector<Layout> layouts;     // in order of preference when they tie
  int recommended = -1;            // index in layouts; -1: nothing fits
  DataSplit data;
  Compute compute;
  Checkpoint checkpoint;
};

// INVALID_ARGUMENT naming the flag for input that cannot describe a job.
absl::StatusOr<Plan> MakePlan(const PlanInput& input);

// The layout of that name in the plan, or nullopt.
absl::optional<Layout> FindLayout(const Plan& plan, absl::string_view name);

}  // namespace pscluster::plan
