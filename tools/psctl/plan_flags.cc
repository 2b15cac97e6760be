#include "tools/psctl/plan_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

namespace {
// Each flag's default is its PlanInput field's.
pscluster::plan::PlanInput Defaults() { return {}; }
}  // namespace

// The model.
ABSL_FLAG(
    double, params, Defaults().params,
    "plan: parameter count, e.g. 13e9 (0: count it from --layers/--width/--vocab/--context).");
ABSL_FLAG(int64_t, layers, Defaults().layers,
          "plan: transformer layers L (0: derived from --params).");
ABSL_FLAG(int64_t, width, Defaults().width, "plan: model width h (0: derived from --params).");
ABSL_FLAG(int64_t, heads, Defaults().heads,
          "plan: attention heads a, dividing --width (0: derived from --params).");
ABSL_FLAG(int64_t, vocab, Defaults().vocab, "plan: vocabulary size V.");
ABSL_FLAG(int64_t, context, Defaults().context, "plan: tokens per sequence s.");
// The data.
ABSL_FLAG(double, dataset_bytes, Defaults().dataset_bytes,
          "plan: dataset size in bytes, e.g. 200e9 (or --dataset_tokens).");
ABSL_FLAG(double, dataset_tokens, Defaults().dataset_tokens,
          "plan: dataset size in tokens (or --dataset_bytes).");
ABSL_FLAG(double, bytes_per_token, Defaults().bytes_per_token,
          "plan: bytes of text per token (4: BPE on English; 1: byte-level).");
ABSL_FLAG(double, epochs, Defaults().epochs, "plan: passes over the dataset.");
ABSL_FLAG(double, global_batch_tokens, Defaults().global_batch_tokens,
          "plan: tokens per optimizer step (4 Mi, as GPT-3-class runs; 0: one micro-batch per "
          "data-parallel rank).");
ABSL_FLAG(int64_t, micro_batch, Defaults().micro_batch,
          "plan: sequences per GPU per micro-step; gradient accumulation makes up the batch.");
// The cluster.
ABSL_FLAG(int64_t, nodes, Defaults().nodes, "plan: nodes.");
ABSL_FLAG(int64_t, gpus_per_node, Defaults().gpus_per_node, "plan: GPUs (workers) per node.");
ABSL_FLAG(std::string, gpu, Defaults().gpu,
          "plan: a100-40gb, a100-80gb, h100-80gb or h200-141gb; any other name (e.g. cpu) "
          "needs --gpu_memory_bytes, --gpu_flops, --host_copy_gbps, --memory_gbps (and "
          "--intra_node_gbps with several per node).");
ABSL_FLAG(double, gpu_memory_bytes, Defaults().gpu_memory_bytes,
          "plan: memory per GPU in bytes (0: the --gpu preset's).");
ABSL_FLAG(double, gpu_flops, Defaults().gpu_flops,
          "plan: peak FLOP/s per GPU, dense BF16 or a measured GEMM rate (0: the preset's).");
ABSL_FLAG(double, intra_node_gbps, Defaults().intra_node_gbps,
          "plan: GB/s per GPU within a node, one direction (NVLink; 0: the preset's: 300 on "
          "A100, 450 on H100/H200).");
ABSL_FLAG(double, host_copy_gbps, Defaults().host_copy_gbps,
          "plan: GB/s per GPU from device to host memory, for asynchronous checkpoints (PCIe; "
          "0: the preset's).");
ABSL_FLAG(double, memory_gbps, Defaults().memory_gbps,
          "plan: GB/s of each GPU's memory, read + write (HBM; 0: the preset's: 1555 A100 40GB, "
          "2039 A100 80GB, 3350 H100, 4800 H200), for the element-wise kernels and the "
          "optimizer.");
ABSL_FLAG(double, inter_node_gbit, Defaults().inter_node_gbit,
          "plan: Gbit/s per node between nodes, one direction, all its NICs together.");
ABSL_FLAG(double, checkpoint_write_gbps, Defaults().checkpoint_write_gbps,
          "plan: GB/s per node to checkpoint storage.");
ABSL_FLAG(double, mtbf_hours, Defaults().mtbf_hours,
          "plan: mean time between failures of one node, hours.");
ABSL_FLAG(double, mfu_low, Defaults().mfu_low, "plan: model FLOPs utilisation, low end.");
ABSL_FLAG(double, mfu_high, Defaults().mfu_high, "plan: model FLOPs utilisation, high end.");
ABSL_FLAG(double, memory_headroom, Defaults().memory_headroom,
          "plan: fraction of GPU memory kept free (CUDA context, allocator, buffers).");
ABSL_FLAG(std::string, precision, Defaults().precision,
          "plan: mixed (bf16 with fp32 master weights and Adam) or fp32 (everything in float32, "
          "no dropout: pscluster's CPU workers).");
ABSL_FLAG(double, state_bytes_per_param, Defaults().state_bytes_per_param,
          "plan: > 0: DDP's state bytes per parameter in the framework planned for (0: the "
          "precision's 16; pscluster's CPU replica keeps 24).");
ABSL_FLAG(bool, sequence_parallel, Defaults().sequence_parallel,
          "plan: tensor parallelism splits the LayerNorm and residual activations too "
          "(Megatron-LM's sequence parallelism); false: they stay whole on every GPU, as in "
          "pscluster's tensor mode.");

namespace pscluster::plan {

PlanInput PlanInputFromFlags() {
  PlanInput in;
  in.params = absl::GetFlag(FLAGS_params);
  in.layers = absl::GetFlag(FLAGS_layers);
  in.width = absl::GetFlag(FLAGS_width);
  in.heads = absl::GetFlag(FLAGS_heads);
  in.vocab = absl::GetFlag(FLAGS_vocab);
  in.context = absl::GetFlag(FLAGS_context);
  in.dataset_bytes = absl::GetFlag(FLAGS_dataset_bytes);
  in.dataset_tokens = absl::GetFlag(FLAGS_dataset_tokens);
  in.bytes_per_token = absl::GetFlag(FLAGS_bytes_per_token);
  in.epochs = absl::GetFlag(FLAGS_epochs);
  in.global_batch_tokens = absl::GetFlag(FLAGS_global_batch_tokens);
  in.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  in.nodes = absl::GetFlag(FLAGS_nodes);
  in.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  in.gpu = absl::GetFlag(FLAGS_gpu);
  in.gpu_memory_bytes = absl::GetFlag(FLAGS_gpu_memory_bytes);
  in.gpu_flops = absl::GetFlag(FLAGS_gpu_flops);
  in.intra_node_gbps = absl::GetFlag(FLAGS_intra_node_gbps);
  in.host_copy_gbps = absl::GetFlag(FLAGS_host_copy_gbps);
  in.memory_gbps = absl::GetFlag(FLAGS_memory_gbps);
  in.inter_node_gbit = absl::GetFlag(FLAGS_inter_node_gbit);
  in.checkpoint_write_gbps = absl::GetFlag(FLAGS_checkpoint_write_gbps);
  in.mtbf_hours = absl::GetFlag(FLAGS_mtbf_hours);
  in.mfu_low = absl::GetFlag(FLAGS_mfu_low);
  in.mfu_high = absl::GetFlag(FLAGS_mfu_high);
  in.memory_headroom = absl::GetFlag(FLAGS_memory_headroom);
  in.precision = absl::GetFlag(FLAGS_precision);
  in.state_bytes_per_param = absl::GetFlag(FLAGS_state_bytes_per_param);
  in.sequence_parallel = absl::GetFlag(FLAGS_sequence_parallel);
  return in;
}

}  // namespace pscluster::plan
