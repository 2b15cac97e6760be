// PlanJson (plan_format.h), written by hand: psctl has no JSON library.
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/psctl/plan_format.h"

namespace pscluster::plan {
namespace {

using Fields = std::vector<std::pair<std::string, std::string>>;

std::string String(absl::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, ch));
    } else if (c < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += ch;  // UTF-8 bytes pass through
    }
  }
  return out + "\"";
}

// The shortest of %.15g and %.17g that reads back as v; JSON has no NaN or infinity.
std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  const std::string shorter = absl::StrFormat("%.15g", v);
  return std::strtod(shorter.c_str(), nullptr) == v ? shorter : absl::StrFormat("%.17g", v);
}

std::string Bool(bool b) { return b ? "true" : "false"; }

std::string Object(const Fields& fields) {
  return absl::StrCat(
      "{",
      absl::StrJoin(fields, ",",
                    [](std::string* out, const std::pair<std::string, std::string>& f) {
                      absl::StrAppend(out, String(f.first), ":", f.second);
                    }),
      "}");
}

std::string ModelJson(const Model& m) {
  return Object({{"params", Number(m.params)},
                 {"shape_params", Number(m.shape_params)},
                 {"params_given", Bool(m.params_given)},
                 {"shape_derived", Bool(m.shape_derived)},
                 {"layers", Number(m.layers)},
                 {"width", Number(m.width)},
                 {"heads", Number(m.heads)},
                 {"vocab", Number(m.vocab)},
                 {"context", Number(m.context)}});
}

std::string DeviceJson(const Plan& p) {
  const Device& d = p.device;
  return Object({{"name", String(d.name)},
                 {"memory_bytes", Number(d.memory_bytes)},
                 {"flops", Number(d.flops)},
                 {"intra_node_gbps", Number(d.intra_node_gbps)},
                 {"host_copy_gbps", Number(d.host_copy_gbps)},
                 {"memory_gbps", Number(d.memory_gbps)}});
}

std::string ClusterJson(const Plan& p) {
  const PlanInput& in = p.input;
  return Object({{"nodes", Number(in.nodes)},
                 {"gpus_per_node", Number(in.gpus_per_node)},
                 {"gpus", Number(p.gpus)},
                 {"inter_node_gbit", Number(in.inter_node_gbit)},
                 {"memory_headroom", Number(in.memory_headroom)},
                 {"sequence_parallel", Bool(in.sequence_parallel)},
                 {"usable_memory_bytes", Number(p.usable_memory_bytes)}});
}

std::string DataJson(const DataSplit& d) {
  return Object({{"tokens", Number(d.tokens)},
                 {"total_tokens", Number(d.total_tokens)},
                 {"tokens_per_gpu", Number(d.tokens_per_gpu)},
                 {"layout", String(d.layout)},
                 {"data_parallel", Number(d.data_parallel)},
                 {"batch_sequences", Number(d.batch_sequences)},
                 {"batch_tokens", Number(d.batch_tokens)},
                 {"micro_batches", Number(d.micro_batches)},
                 {"steps_per_epoch", Number(d.steps_per_epoch)},
                 {"total_steps", Number(d.total_steps)}});
}

std::string CommunicationJson(const Layout& l) {
  std::vector<std::string> collectives;
  for (const Collective& x : l.collectives) {
    collectives.push_back(Object({{"what", String(x.what)},
                                  {"how", String(x.how)},
                                  {"bytes", Number(x.bytes)},
                                  {"link", String(x.inter_node ? "inter_node" : "intra_node")},
                                  {"gbps", Number(x.gbps)},
                                  {"seconds", Number(x.seconds)}}));
  }
  return Object({{"bytes", Number(l.comm_bytes)},
                 {"seconds", Number(l.comm_seconds)},
                 {"collectives", absl::StrCat("[", absl::StrJoin(collectives, ","), "]")}});
}

std::string LayoutJson(const Layout& l) {
  const char* fits = l.fit == Fit::kFits            ? "yes"
                     : l.fit == Fit::kWithRecompute ? "recompute"
                                                    : "no";
  const bool fitting = l.fit != Fit::kNo;
  return Object({{"name", String(l.name)},
                 {"t", Number(l.t)},
                 {"p", Number(l.p)},
                 {"d", Number(l.d)},
                 {"zero", Number(l.zero)},
                 {"micro_batches", Number(l.micro_batches)},
                 {"batch_sequences", Number(l.batch_sequences)},
                 {"model_state_bytes", Number(l.model_state_bytes)},
                 {"buffer_bytes", Number(l.buffer_bytes)},
                 {"activation_bytes", Number(l.activation_bytes)},
                 {"activation_recompute_bytes", Number(l.activation_recompute_bytes)},
                 {"fits", String(fits)},
                 {"recompute", Bool(l.recompute)},
                 {"gemm_seconds", fitting ? Number(l.gemm_seconds) : "null"},
                 {"memory_seconds", fitting ? Number(l.memory_seconds) : "null"},
                 {"compute_seconds", fitting ? Number(l.compute_seconds) : "null"},
                 {"step_seconds", fitting ? Number(l.step_seconds) : "null"},
                 {"communication", fitting ? CommunicationJson(l) : "null"}});
}

std::string ComputeJson(const Compute& c) {
  return Object({{"flops", Number(c.flops)},
                 {"peak_flops", Number(c.peak_flops)},
                 {"step_seconds_mfu_low", Number(c.step_seconds_low)},
                 {"step_seconds_mfu_high", Number(c.step_seconds_high)},
                 {"total_seconds_mfu_low", Number(c.total_seconds_low)},
                 {"total_seconds_mfu_high", Number(c.total_seconds_high)}});
}

std::string CheckpointJson(const Checkpoint& c) {
  return Object({{"bytes", Number(c.bytes)},
                 {"write_seconds", Number(c.write_seconds)},
                 {"pause_seconds", Number(c.pause_seconds)},
                 {"cluster_mtbf_seconds", Number(c.cluster_mtbf_seconds)},
                 {"interval_seconds", Number(c.interval_seconds)},
                 {"async_interval_seconds", Number(c.async_interval_seconds)},
                 {"lost_seconds", Number(c.lost_seconds)},
                 {"async_lost_seconds", Number(c.async_lost_seconds)},
                 {"overhead", Number(c.overhead)},
                 {"async_overhead", Number(c.async_overhead)},
                 {"expected_failures", Number(c.expected_failures)}});
}

}  // namespace

std::string PlanJson(const Plan& p) {
  std::vector<std::string> layouts;
  for (const Layout& l : p.layouts) layouts.push_back(LayoutJson(l));
  const std::string recommended =
      p.recommended < 0 ? "null" : String(p.layouts[p.recommended].name);
  return absl::StrCat(Object({{"model", ModelJson(p.model)},
                              {"device", DeviceJson(p)},
                              {"cluster", ClusterJson(p)},
                              {"data", DataJson(p.data)},
                              {"layouts", absl::StrCat("[", absl::StrJoin(layouts, ","), "]")},
                              {"recommended", recommended},
                              {"why", String(RecommendationWhy(p))},
                              {"compute", ComputeJson(p.compute)},
                              {"checkpoint", CheckpointJson(p.checkpoint)}}),
                      "\n");
}

}  // namespace pscluster::plan
