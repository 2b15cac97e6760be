// PlanJson (plan_format.h), with nlohmann-json: numbers that read back as written, strings
// escaped, a non-finite figure as null (JSON has no NaN or infinity).
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/psctl/plan_format.h"

namespace pscluster::plan {
namespace {

// Insertion-ordered: the fields come out in the order a reader of the plan expects.
using Json = nlohmann::ordered_json;

// A whole number as an integer (13000000000, not 13000000000.0: what the figure means, and
// what this file wrote before it used a library); a non-finite one comes out as null.
Json Number(double v) {
  constexpr double kExactInteger = 9007199254740992.0;  // 2^53: every integer below is a double
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < kExactInteger) {
    return Json(static_cast<int64_t>(v));
  }
  return Json(v);
}

Json ModelJson(const Model& m) {
  return Json({{"params", Number(m.params)},
               {"shape_params", Number(m.shape_params)},
               {"params_given", Json(m.params_given)},
               {"shape_derived", Json(m.shape_derived)},
               {"layers", Number(m.layers)},
               {"width", Number(m.width)},
               {"heads", Number(m.heads)},
               {"vocab", Number(m.vocab)},
               {"context", Number(m.context)}});
}

Json DeviceJson(const Plan& p) {
  const Device& d = p.device;
  return Json({{"name", Json(d.name)},
               {"memory_bytes", Number(d.memory_bytes)},
               {"flops", Number(d.flops)},
               {"intra_node_gbps", Number(d.intra_node_gbps)},
               {"host_copy_gbps", Number(d.host_copy_gbps)},
               {"memory_gbps", Number(d.memory_gbps)}});
}

Json ClusterJson(const Plan& p) {
  const PlanInput& in = p.input;
  return Json({{"nodes", Number(in.nodes)},
               {"gpus_per_node", Number(in.gpus_per_node)},
               {"gpus", Number(p.gpus)},
               {"inter_node_gbit", Number(in.inter_node_gbit)},
               {"memory_headroom", Number(in.memory_headroom)},
               {"sequence_parallel", Json(in.sequence_parallel)},
               {"usable_memory_bytes", Number(p.usable_memory_bytes)}});
}

Json DataJson(const DataSplit& d) {
  return Json({{"tokens", Number(d.tokens)},
               {"total_tokens", Number(d.total_tokens)},
               {"tokens_per_gpu", Number(d.tokens_per_gpu)},
               {"layout", Json(d.layout)},
               {"data_parallel", Number(d.data_parallel)},
               {"batch_sequences", Number(d.batch_sequences)},
               {"batch_tokens", Number(d.batch_tokens)},
               {"micro_batches", Number(d.micro_batches)},
               {"steps_per_epoch", Number(d.steps_per_epoch)},
               {"total_steps", Number(d.total_steps)}});
}

Json CommunicationJson(const Layout& l) {
  Json collectives = Json::array();
  for (const Collective& x : l.collectives) {
    collectives.push_back(Json({{"what", Json(x.what)},
                                {"how", Json(x.how)},
                                {"bytes", Number(x.bytes)},
                                {"link", Json(x.inter_node ? "inter_node" : "intra_node")},
                                {"gbps", Number(x.gbps)},
                                {"seconds", Number(x.seconds)}}));
  }
  return Json({{"bytes", Number(l.comm_bytes)},
               {"seconds", Number(l.comm_seconds)},
               {"collectives", collectives}});
}

Json LayoutJson(const Layout& l) {
  const char* fits = l.fit == Fit::kFits            ? "yes"
                     : l.fit == Fit::kWithRecompute ? "recompute"
                                                    : "no";
  const bool fitting = l.fit != Fit::kNo;
  return Json({{"name", Json(l.name)},
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
               {"fits", Json(fits)},
               {"recompute", Json(l.recompute)},
               {"gemm_seconds", fitting ? Number(l.gemm_seconds) : Json()},
               {"memory_seconds", fitting ? Number(l.memory_seconds) : Json()},
               {"compute_seconds", fitting ? Number(l.compute_seconds) : Json()},
               {"step_seconds", fitting ? Number(l.step_seconds) : Json()},
               {"communication", fitting ? CommunicationJson(l) : Json()}});
}

Json ComputeJson(const Compute& c) {
  return Json({{"flops", Number(c.flops)},
               {"peak_flops", Number(c.peak_flops)},
               {"step_seconds_mfu_low", Number(c.step_seconds_low)},
               {"step_seconds_mfu_high", Number(c.step_seconds_high)},
               {"total_seconds_mfu_low", Number(c.total_seconds_low)},
               {"total_seconds_mfu_high", Number(c.total_seconds_high)}});
}

Json CheckpointJson(const Checkpoint& c) {
  return Json({{"bytes", Number(c.bytes)},
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
  Json layouts = Json::array();
  for (const Layout& l : p.layouts) layouts.push_back(LayoutJson(l));
  const Json recommended = p.recommended < 0 ? Json() : Json(p.layouts[p.recommended].name);
  const Json plan = {{"model", ModelJson(p.model)},
                     {"device", DeviceJson(p)},
                     {"cluster", ClusterJson(p)},
                     {"data", DataJson(p.data)},
                     {"layouts", layouts},
                     {"recommended", recommended},
                     {"why", RecommendationWhy(p)},
                     {"compute", ComputeJson(p.compute)},
                     {"checkpoint", CheckpointJson(p.checkpoint)}};
  return plan.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace pscluster::plan
