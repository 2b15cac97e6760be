// PlanTable and RecommendationWhy (plan_format.h).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tools/psctl/plan_format.h"

namespace pscluster::plan {
namespace {

std::string Bytes(double b) {
  if (b >= 1e12) return absl::StrFormat("%.2f TB", b / 1e12);
  if (b >= 1e9) return absl::StrFormat("%.1f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.1f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.1f kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
}

std::string Seconds(double s) {
  if (s < 1e-3) return absl::StrFormat("%.3g us", s * 1e6);
  if (s < 1) return absl::StrFormat("%.3g ms", s * 1e3);
  if (s < 120) return absl::StrFormat("%.1f s", s);
  if (s < 7200) return absl::StrFormat("%.1f min", s / 60);
  if (s < 172800) return absl::StrFormat("%.1f h", s / 3600);
  return absl::StrFormat("%.1f days", s / 86400);
}

std::string Count(double n) {
  if (n >= 1e12) return absl::StrFormat("%.2f T", n / 1e12);
  if (n >= 1e9) return absl::StrFormat("%.2f B", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.2f M", n / 1e6);
  if (n >= 1e4) return absl::StrFormat("%.1f K", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

std::string Percent(double fraction) {
  return absl::StrFormat(fraction < 0.1 ? "%.2g%%" : "%.0f%%", 100 * fraction);
}

// "1 node", "4 nodes"; `many` where the plural is not one + "s".
std::string Plural(double n, absl::string_view one, absl::string_view many = "") {
  if (n == 1) return absl::StrCat("1 ", one);
  return many.empty() ? absl::StrFormat("%.15g %ss", n, one) : absl::StrFormat("%.15g %s", n, many);
}

std::string FlopRate(double flops) {
  return flops >= 1e12 ? absl::StrFormat("%.0f TFLOP/s", flops / 1e12)
                       : absl::StrFormat("%.3g GFLOP/s", flops / 1e9);
}

// label, value, then what it assumes or how it is computed.
std::string Row(absl::string_view label, absl::string_view value, absl::string_view why) {
  std::string row = absl::StrFormat("  %-20s %-22s %s", label, value, why);
  absl::StripTrailingAsciiWhitespace(&row);
  return row + "\n";
}

// `text` in lines of at most kWidth bytes, each starting with `indent`; a figure stays on the
// line of its unit.
std::string Wrap(absl::string_view text, absl::string_view indent) {
  constexpr size_t kWidth = 96;
  static const auto* const kUnits = new std::set<absl::string_view>{
      "us", "ms", "s", "min", "h", "days", "B", "kB", "MB", "GB", "TB", "GB/s"};
  std::vector<std::string> words;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    const absl::string_view bare = word.substr(0, word.find_first_of(",;:.)"));
    if (!words.empty() && kUnits->count(bare) > 0) {
      absl::StrAppend(&words.back(), " ", word);
    } else {
      words.emplace_back(word);
    }
  }
  std::string out, line(indent);
  for (const std::string& word : words) {
    if (line.size() > indent.size() && line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, line, "\n");
      line = std::string(indent);
    }
    absl::StrAppend(&line, line.size() > indent.size() ? " " : "", word);
  }
  return absl::StrCat(out, line, "\n");
}

std::string Header(const Plan& p) {
  const Model& m = p.model;
  const std::string count =
      m.params_given ? absl::StrCat("--params (the shape counts ", Count(m.shape_params), ")")
                     : "12·L·h² + 13·L·h + V·h + s·h + 2h (GPT-2 style, tied head)";
  const std::string shape = m.shape_derived
                                ? "from --params: h = 128·L, 128 per head (as GPT-3 13B)"
                                : "--layers --width --heads --vocab --context";
  return absl::StrCat(
      absl::StrFormat("psctl plan: %s parameters on %s x %d %s = %d GPUs\n\n", Count(m.params),
                      Plural(p.input.nodes, "node"), p.input.gpus_per_node, p.device.name, p.gpus),
      "Model\n", Row("parameters N", Count(m.params), count),
      Row("shape", absl::StrFormat("L=%d h=%d a=%d", m.layers, m.width, m.heads), shape),
      Row("", absl::StrFormat("V=%d s=%d", m.vocab, m.context), "vocabulary, context (tokens)"),
      "\n");
}

std::string DataSection(const Plan& p) {
  const DataSplit& d = p.data;
  const PlanInput& in = p.input;
  const std::string source = in.dataset_tokens > 0
                                 ? std::string("--dataset_tokens")
                                 : absl::StrFormat("%s / %s per token", Bytes(in.dataset_bytes),
                                                   Plural(in.bytes_per_token, "byte"));
  return absl::StrCat(
      "1. Data\n",
      Row("tokens D", Count(d.total_tokens),
          absl::StrFormat("%s, x %s", source, Plural(in.epochs, "epoch"))),
      Row("tokens per GPU", Count(d.tokens_per_gpu), absl::StrFormat("D / %d GPUs", p.gpus)),
      Row("global batch", absl::StrCat(Count(d.batch_tokens), " tokens"),
          absl::StrFormat("%s of %d (--global_batch_tokens=%.15g)",
                          Plural(d.batch_sequences, "sequence"), p.model.context,
                          in.global_batch_tokens)),
      Row("accumulation", Plural(d.micro_batches, "micro-batch", "micro-batches"),
          absl::StrFormat("of %s per step, D=%d (%s)", Plural(in.micro_batch, "sequence"),
                          d.data_parallel, d.layout)),
      Row("steps", absl::StrFormat("%d per epoch", d.steps_per_epoch),
          absl::StrFormat("%d in all", d.total_steps)),
      "\n");
}

const char* FitName(Fit f) {
  return f == Fit::kFits ? "yes" : f == Fit::kWithRecompute ? "recompute" : "no";
}

// How section 2's figures are counted, for the input's precision and flags.
std::string MemoryLegend(const PlanInput& in) {
  const bool fp32 = in.precision == "fp32";
  return absl::StrCat(
      fp32 ? "  state: fp32 Adam, 16 bytes/param (4 weights + 4 gradients + 8 m, v) over T·P;\n"
             "    ZeRO-1 divides the 8 by D, ZeRO-2 also the 4 gradient bytes, ZeRO-3 all 16;\n"
           : "  state: mixed-precision Adam, 16 bytes/param (2 bf16 weights + 2 bf16 gradients +\n"
             "    12 fp32 master, m, v) over T·P; ZeRO-1 divides the 12 by D, ZeRO-2 also the 2\n"
             "    gradient bytes, ZeRO-3 all 16;\n",
      in.state_bytes_per_param > 0
          ? absl::StrFormat("    DDP %g bytes/param (--state_bytes_per_param: the framework's "
                            "copies; ZeRO-1 divides\n    what is beyond the weights and "
                            "gradients by D);\n",
                            in.state_bytes_per_param)
          : "",
      "    the TxPxD rows shard the optimizer over D (ZeRO-1, Megatron's distributed\n"
      "    optimizer). T is tensor parallelism within a node, P pipeline stages.\n",
      fp32 ? "  activ: s·b·h·(64 + 4·a·s/h) bytes per layer per micro-batch (Korthikanti et al.'s\n"
             "    tensors in fp32, no dropout),"
           : "  activ: s·b·h·(34 + 5·a·s/h) bytes per layer per micro-batch (Korthikanti et al.\n"
             "    2022),",
      in.sequence_parallel ? " /T with sequence parallelism.\n"
                           : absl::StrCat(" /T with sequence parallelism; here without\n    it "
                                          "(--nosequence_parallel): s·b·h·(",
                                          fp32 ? "16 + (48 + 4·a·s/h)/T" : "10 + (24 + 5·a·s/h)/T",
                                          "), the LayerNorms' part whole.\n"),
      "    A stage holds ceil(L/P) layers, min(P, micro-batches) of them in flight under\n"
      "    1F1B. act.rc: full recomputation, 2·s·b·h/T per layer (its input) + one layer's\n"
      "    full activations. buffers: the logits (4·s·b·V/T) and one layer's activation\n"
      "    gradients while its backward runs.\n",
      "  est. step: (6·N + 12·L·s·h) FLOP per token at --mfu_high (PaLM's count: attention's\n"
      "    products too), + the element-wise kernels (LayerNorm, GELU, softmax, residuals:\n"
      "    54·h + 6·a·s elements per token per layer) and the optimizer (its state read and\n"
      "    written once) at --memory_gbps; x4/3 with recomputation, x(1 + (P-1)/m) for the\n"
      "    1F1B bubble; + communication (section 4), none of it assumed hidden. The layouts\n"
      "    are ranked by it per sequence of their batch.\n\n");
}

std::string MemorySection(const Plan& p) {
  double largest = 0;
  for (const Layout& l : p.layouts) {
    largest = std::max(largest, l.model_state_bytes + l.buffer_bytes + l.activation_bytes);
  }
  // The unit keeps the largest figure within the columns' 7 characters (a model far past
  // any GPU: terabytes and up).
  static constexpr std::pair<double, const char*> kUnits[] = {
      {1e3, "kB"}, {1e6, "MB"}, {1e9, "GB"}, {1e12, "TB"}, {1e15, "PB"}, {1e18, "EB"}};
  size_t i = largest >= 1e9 ? 2 : largest >= 1e6 ? 1 : 0;
  while (i + 1 < std::size(kUnits) && largest / kUnits[i].first >= 1e5) ++i;
  const auto [unit, name] = kUnits[i];
  auto memory = [&](double bytes) {  // a GPU's memory in this unit: tiny past GB
    return absl::StrFormat(unit > 1e9 ? "%.3g" : "%.1f", bytes / unit);
  };
  std::string out = absl::StrFormat(
      "2. Memory per GPU, %s: %s usable of %s (%s kept free)\n"
      "  %-14s %-9s %7s %7s %7s %7s %7s %7s  %-9s  %s\n",
      name, memory(p.usable_memory_bytes), memory(p.device.memory_bytes),
      Percent(p.input.memory_headroom), "layout", "TxPxD", "state", "buffers", "activ", "act.rc",
      "total", "tot.rc", "fits", "est. step");
  for (const Layout& l : p.layouts) {
    const double state = l.model_state_bytes / unit, fixed = state + l.buffer_bytes / unit;
    std::string row = absl::StrFormat(
        "  %-14s %-9s %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f  %-9s  %s", l.name,
        absl::StrFormat("%dx%dx%d", l.t, l.p, l.d), state, l.buffer_bytes / unit,
        l.activation_bytes / unit, l.activation_recompute_bytes / unit,
        fixed + l.activation_bytes / unit, fixed + l.activation_recompute_bytes / unit,
        FitName(l.fit), l.fit == Fit::kNo ? "" : Seconds(l.step_seconds));
    absl::StripTrailingAsciiWhitespace(&row);
    absl::StrAppend(&out, row, "\n");
  }
  absl::StrAppend(&out, MemoryLegend(p.input));
  return out;
}

std::string Need(const Layout& l) {
  if (l.fit == Fit::kFits) return absl::StrCat("fits, ", Seconds(l.step_seconds), " per step");
  if (l.fit == Fit::kWithRecompute) {
    return absl::StrCat("fits only with recomputation, ", Seconds(l.step_seconds), " per step");
  }
  return absl::StrCat("needs ",
                      Bytes(l.model_state_bytes + l.buffer_bytes + l.activation_recompute_bytes),
                      " even with recomputation");
}

std::string RecommendSection(const Plan& p) {
  std::string out = "3. Recommended layout: ";
  if (p.recommended < 0) return absl::StrCat(out, "none\n", Wrap(RecommendationWhy(p), "  "), "\n");
  const Layout& l = p.layouts[p.recommended];
  absl::StrAppendFormat(&out, "%s (T=%d tensor x P=%d pipeline x D=%d data)%s\n", l.name, l.t, l.p,
                        l.d, l.recompute ? " with full recomputation" : "");
  return absl::StrCat(out, Wrap(RecommendationWhy(p), "  "), "\n");
}

std::string CommSection(const Plan& p) {
  if (p.recommended < 0) return "";
  const Layout& l = p.layouts[p.recommended];
  std::string out = absl::StrFormat(
      "4. Communication per step, %s (bytes each GPU sends; it receives as many)\n", l.name);
  for (const Collective& x : l.collectives) {
    const std::string link = x.inter_node ? absl::StrFormat("inter-node %.1f GB/s", x.gbps)
                                          : absl::StrFormat("intra-node %g GB/s", x.gbps);
    absl::StrAppend(&out,
                    Row(x.what, Bytes(x.bytes), absl::StrCat(link, " -> ", Seconds(x.seconds))),
                    Wrap(x.how, "    "));
  }
  if (l.collectives.empty()) out += "  none: one GPU\n";
  absl::StrAppend(
      &out,
      Row("total", Bytes(l.comm_bytes),
          absl::StrFormat("%s, %s of the %s step at --mfu_high", Seconds(l.comm_seconds),
                          Percent(l.comm_seconds / p.compute.step_seconds_high),
                          Seconds(p.compute.step_seconds_high))),
      absl::StrFormat(
          "  links: %g GB/s per GPU within a node (NVLink); between nodes %.1f GB/s per node\n"
          "    (--inter_node_gbit=%g), shared by the node's groups that cross it at once\n\n",
          p.device.intra_node_gbps, p.input.inter_node_gbit / 8, p.input.inter_node_gbit));
  return out;
}

std::string ComputeSection(const Plan& p) {
  const Compute& c = p.compute;
  const PlanInput& in = p.input;
  const std::string mfu = absl::StrFormat("MFU %g .. %g", in.mfu_high, in.mfu_low);
  const std::string hours = c.total_seconds_low < 3600
                                ? ""
                                : absl::StrFormat(" = %.0f .. %.0f h", c.total_seconds_high / 3600,
                                                  c.total_seconds_low / 3600);
  return absl::StrCat(
      "5. Compute\n",
      Row("total", absl::StrFormat("%.2e FLOP", c.flops),
          absl::StrFormat("6·N·D = 6 x %s x %s tokens", Count(p.model.params),
                          Count(p.data.total_tokens))),
      Row("cluster peak", absl::StrFormat("%.2e FLOP/s", c.peak_flops),
          absl::StrFormat("%d x %s (%s)", p.gpus, FlopRate(p.device.flops), p.device.name)),
      Row("step", absl::StrCat(Seconds(c.step_seconds_high), " .. ", Seconds(c.step_seconds_low)),
          absl::StrCat("6·N·(batch tokens) / (peak · MFU), ", mfu)),
      Row("wall time",
          absl::StrCat(Seconds(c.total_seconds_high), " .. ", Seconds(c.total_seconds_low)),
          absl::StrCat("6·N·D / (peak · MFU)", hours, ", ", mfu)),
      "\n");
}

std::string CheckpointSection(const Plan& p) {
  const Checkpoint& c = p.checkpoint;
  const PlanInput& in = p.input;
  const double step = p.compute.step_seconds_high;
  const auto steps = [step](double s) {
    return s < step ? std::string("every step (a step takes longer)")
                    : absl::StrFormat("%.0f steps", std::floor(s / step));
  };
  return absl::StrCat(
      "6. Checkpoints\n",
      Row("size", Bytes(c.bytes), "12 bytes/param: fp32 master weights, Adam's m and v"),
      Row("write", Seconds(c.write_seconds),
          absl::StrFormat("/ (%s x %g GB/s of storage each)", Plural(in.nodes, "node"),
                          in.checkpoint_write_gbps)),
      Row("async pause", Seconds(c.pause_seconds),
          absl::StrFormat("%s per GPU copied to host memory at %g GB/s", Bytes(c.bytes / p.gpus),
                          p.device.host_copy_gbps)),
      Row("cluster MTBF", absl::StrFormat("%.0f h", c.cluster_mtbf_seconds / 3600),
          absl::StrFormat("%g h per node / %s", in.mtbf_hours, Plural(in.nodes, "node"))),
      Row("interval", absl::StrCat(Seconds(c.interval_seconds), ", ", steps(c.interval_seconds)),
          absl::StrFormat("Young/Daly sqrt(2 · write · MTBF); overhead %s", Percent(c.overhead))),
      Row("async interval",
          absl::StrCat(Seconds(c.async_interval_seconds), ", ", steps(c.async_interval_seconds)),
          absl::StrFormat("sqrt(2 · pause · MTBF), >= write; overhead %s",
                          Percent(c.async_overhead))),
      Row("lost per failure",
          absl::StrCat(Seconds(c.lost_seconds), " / ", Seconds(c.async_lost_seconds)),
          "half an interval (sync / async)"),
      Row("failures in the run", absl::StrFormat("%.2g", c.expected_failures),
          "wall time at --mfu_low / cluster MTBF"),
      Wrap("The bf16 weights are the master's rounding and the gradients are empty at a step "
           "boundary, so a resume needs nothing more. Overhead = write (or pause) / interval + "
           "interval / (2·MTBF); steps at --mfu_high; restarts not counted.",
           "  "));
}

}  // namespace

std::string RecommendationWhy(const Plan& p) {
  if (p.recommended < 0) {
    return absl::StrCat("Nothing fits in ", Bytes(p.usable_memory_bytes),
                        " per GPU, even with full recomputation: add GPUs, take GPUs with "
                        "more memory, or shorten --context.");
  }
  const Layout& l = p.layouts[p.recommended];
  std::string why = absl::StrCat(
      "It fits (",
      Bytes(l.model_state_bytes + l.buffer_bytes +
            (l.recompute ? l.activation_recompute_bytes : l.activation_bytes)),
      " of ", Bytes(p.usable_memory_bytes), ") with the shortest estimated step, ",
      Seconds(l.step_seconds), ": ", Seconds(l.compute_seconds), " of compute",
      l.recompute ? " (x4/3 for recomputation)" : "", l.p > 1 ? " (with the pipeline bubble)" : "",
      " + ", Seconds(l.comm_seconds), " of communication.");
  std::vector<std::string> simpler;
  for (int i = 0; i < std::min(p.recommended, 4); ++i) {
    simpler.push_back(absl::StrCat(p.layouts[i].name, " ", Need(p.layouts[i])));
  }
  if (!simpler.empty()) absl::StrAppend(&why, " Simpler: ", absl::StrJoin(simpler, "; "), ".");
  return why;
}

std::string PlanTable(const Plan& p) {
  return absl::StrCat(Header(p), DataSection(p), MemorySection(p), RecommendSection(p),
                      CommSection(p), ComputeSection(p), CheckpointSection(p));
}

}  // namespace pscluster::plan
