#include "tools/psctl/internal/layouts.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pscluster::plan::internal {
namespace {

// Bytes of a communicated element: bf16 in mixed precision, float32 in fp32.
double Element(const Cluster& c) { return c.input.precision == "fp32" ? 4 : 2; }

Layout Shape(std::string name, int64_t t, int64_t p, int64_t d, int zero) {
  Layout l;
  l.name = std::move(name);
  l.t = t;
  l.p = p;
  l.d = d;
  l.zero = zero;
  return l;
}

std::vector<Layout> Candidates(const Cluster& c) {
  const int64_t g = c.gpus, per_node = c.input.gpus_per_node;
  std::vector<Layout> out = {Shape("DDP", 1, 1, g, 0), Shape("ZeRO-1", 1, 1, g, 1),
                             Shape("ZeRO-2", 1, 1, g, 2), Shape("ZeRO-3/FSDP", 1, 1, g, 3)};
  std::vector<Layout> pipelined;
  for (int64_t t = 1; t <= per_node && t <= g; t *= 2) {
    if (per_node % t != 0 || g % t != 0 || c.model.heads % t != 0) continue;
    for (int64_t p = 1; p <= g / t && p <= c.model.layers; ++p) {
      if ((g / t) % p != 0 || (t == 1 && p == 1)) continue;
      const int64_t d = g / t / p;
      Layout l = Shape(absl::StrCat("T", t, "xP", p, "xD", d), t, p, d, 1);
      (p == 1 ? out : pipelined).push_back(std::move(l));
    }
  }
  std::stable_sort(pipelined.begin(), pipelined.end(),
                   [](const Layout& a, const Layout& b) { return a.p < b.p; });
  out.insert(out.end(), pipelined.begin(), pipelined.end());
  return out;
}

// Gradient accumulation: the global batch in micro-batches of micro_batch sequences on each
// of the D data-parallel ranks, rounded up (or one micro-batch with no global batch given).
void SetBatch(const Cluster& c, Layout& l) {
  const double rank_sequences = static_cast<double>(l.d) * c.input.micro_batch;
  const double wanted = c.input.global_batch_tokens > 0
                            ? std::ceil(c.input.global_batch_tokens / c.model.context)
                            : rank_sequences;
  l.micro_batches = std::max<int64_t>(1, std::llround(std::ceil(wanted / rank_sequences)));
  l.batch_sequences = l.micro_batches * rank_sequences;
}

// A pipeline stage holds ceil(L/P) layers; under 1F1B the first stage keeps min(P, m)
// micro-batches in flight. Full recomputation keeps each layer's input (2·s·b·h bytes, /T
// with sequence parallelism) and recomputes one layer at a time.
void SetMemory(const Cluster& c, Layout& l) {
  const Model& m = c.model;
  const int64_t b = c.input.micro_batch;
  const bool fp32 = c.input.precision == "fp32";
  l.model_state_bytes =
      StateBytesPerParam(l.zero, l.d, fp32, c.input.state_bytes_per_param) * m.params / (l.t * l.p);
  const double stage_layers = std::ceil(static_cast<double>(m.layers) / l.p);
  const double in_flight = l.p > 1 ? std::min(l.p, l.micro_batches) : 1;
  const bool sp = c.input.sequence_parallel;
  const double layer = ActivationBytesPerLayer(m.context, b, m.width, m.heads, l.t, fp32, sp);
  const double layer_input = (fp32 ? 4.0 : 2.0) * m.context * b * m.width / (sp ? l.t : 1);
  l.activation_bytes = stage_layers * in_flight * layer;
  l.activation_recompute_bytes = stage_layers * in_flight * layer_input + layer;
  l.buffer_bytes = 4.0 * m.context * b * m.vocab / l.t + layer;
  const double fixed = l.model_state_bytes + l.buffer_bytes;
  if (fixed + l.activation_bytes <= c.usable_memory_bytes) {
    l.fit = Fit::kFits;
  } else if (fixed + l.activation_recompute_bytes <= c.usable_memory_bytes) {
    l.fit = Fit::kWithRecompute;
    l.recompute = true;
  }
}

Collective OnLink(std::string what, std::string how, double bytes, const Link& link) {
  Collective x;
  x.what = std::move(what);
  x.how = std::move(how);
  x.bytes = bytes;
  x.inter_node = link.inter_node;
  x.gbps = link.gbps;
  x.seconds = bytes / (link.gbps * 1e9);
  return x;
}

// bf16 gradients (and parameters) of N/(T·P) per GPU, over the D ranks.
Collective DataParallel(const Cluster& c, const Layout& l) {
  const double w = Element(c) * c.model.params / (l.t * l.p);
  const double f = (l.d - 1.0) / l.d, m = l.micro_batches;
  const Link link = GroupLink(c, l.t, l.d);
  const std::string each = absl::StrCat("(D-1)/D x 2 bytes x N/(T·P), D=", l.d);
  switch (l.zero) {
    case 0:
      return OnLink("data parallel",
                    absl::StrCat("gradient ring all-reduce once per step: 2 x ", each), 2 * f * w,
                    link);
    case 1:
      return OnLink("data parallel",
                    absl::StrCat("gradient reduce-scatter + parameter all-gather once per step, ",
                                 "each ", each),
                    2 * f * w, link);
    case 2:
      return OnLink("data parallel",
                    absl::StrCat("a gradient reduce-scatter per micro-batch (", l.micro_batches,
                                 ": the full gradients are not kept) and one parameter ",
                                 "all-gather, each ", each),
                    (m + 1) * f * w, link);
    default:
      return OnLink("data parallel",
                    absl::StrCat("per micro-batch (", l.micro_batches,
                                 ") the parameters gathered for forward and again for backward, "
                                 "the gradients reduce-scattered: 3 x ",
                                 each),
                    3 * m * f * w, link);
  }
}

// Megatron's 2 all-reduces per layer forward and 2 backward (with sequence parallelism
// all-gather + reduce-scatter pairs of the same bytes), 2 more when the forward is recomputed.
Collective TensorParallel(const Cluster& c, const Layout& l) {
  const double sbh = static_cast<double>(c.model.context) * c.input.micro_batch * c.model.width;
  const int count = l.recompute ? 6 : 4;
  const int64_t stage_layers = (c.model.layers + l.p - 1) / l.p;
  const double bytes =
      2.0 * (l.t - 1) / l.t * Element(c) * sbh * count * stage_layers * l.micro_batches;
  return OnLink("tensor parallel",
                absl::StrCat(count, " all-reduces per layer per micro-batch of the s·b·h bf16 ",
                             "activations, ring 2(T-1)/T, T=", l.t, ": x ", stage_layers,
                             " layers x ", l.micro_batches, " micro-batches"),
                bytes, GroupLink(c, 1, l.t));
}

Collective Pipeline(const Cluster& c, const Layout& l) {
  const double sbh = static_cast<double>(c.model.context) * c.input.micro_batch * c.model.width;
  return OnLink("pipeline",
                absl::StrCat("per micro-batch the s·b·h/T bf16 activations to the next stage and ",
                             "their gradients back: 2 x 2 bytes x s·b·h/T x ", l.micro_batches,
                             " micro-batches"),
                2.0 * Element(c) * sbh / l.t * l.micro_batches, GroupLink(c, l.t * l.d, l.p));
}

void SetTraffic(const Cluster& c, Layout& l) {
  if (l.d > 1) l.collectives.push_back(DataParallel(c, l));
  if (l.t > 1) l.collectives.push_back(TensorParallel(c, l));
  if (l.p > 1) l.collectives.push_back(Pipeline(c, l));
  for (const Collective& x : l.collectives) {
    l.comm_bytes += x.bytes;
    l.comm_seconds += x.seconds;
  }
  const Model& m = c.model;
  const double tokens = l.batch_sequences * m.context;
  l.gemm_seconds = FlopsPerToken(m) * tokens / (c.gpus * c.device.flops * c.input.mfu_high);
  // Each GPU runs the element-wise kernels of its data shard's tokens through its stage's
  // layers, its 1/T of them (the whole part on every GPU without sequence parallelism), the
  // loss's softmax (the last stage's, which sets the pace), and the optimizer over its state.
  const ElementwiseCounts e = ElementwisePerTokenLayer(m);
  const double token_layers = tokens / l.d * std::ceil(static_cast<double>(m.layers) / l.p);
  const double whole = c.input.sequence_parallel ? e.whole / l.t : e.whole;
  const double elements = token_layers * (whole + e.split / l.t) + tokens / l.d * e.loss / l.t;
  l.memory_seconds =
      (Element(c) * elements + 2 * l.model_state_bytes) / (c.device.memory_gbps * 1e9);
  const double bubble = 1 + (l.p - 1.0) / l.micro_batches;
  l.compute_seconds = (l.gemm_seconds + l.memory_seconds) * (l.recompute ? 4.0 / 3 : 1) * bubble;
  l.step_seconds = l.compute_seconds + l.comm_seconds;
}

}  // namespace

Link GroupLink(const Cluster& c, int64_t stride, int64_t size) {
  const int64_t per_node = c.input.gpus_per_node;
  if (stride * size <= per_node) return {false, c.device.intra_node_gbps, 1};
  const int64_t members = std::max<int64_t>(1, std::min(size, per_node / stride));
  const int64_t sharing = per_node / members;
  return {true, c.input.inter_node_gbit / 8 / sharing, sharing};
}

double StateBytesPerParam(int zero, int64_t d, bool fp32, double replica) {
  switch (zero) {
    case 0:
      return replica > 0 ? replica : 16;
    case 1: {  // the weights and gradients stay whole; the rest is the optimizer's, sharded
      const double whole = fp32 ? 8 : 4;
      return whole + ((replica > 0 ? replica : 16) - whole) / d;
    }
    case 2:
      return fp32 ? 4 + 12.0 / d : 2 + 14.0 / d;
    default:
      return 16.0 / d;
  }
}

std::vector<Layout> EvaluateLayouts(const Cluster& c) {
  std::vector<Layout> layouts = Candidates(c);
  for (Layout& l : layouts) {
    SetBatch(c, l);
    SetMemory(c, l);
    SetTraffic(c, l);
  }
  return layouts;
}

}  // namespace pscluster::plan::internal
