// The layouts MakePlan weighs (plan.h): which ones a cluster allows, the memory each needs
// per GPU and the traffic each moves per step. Only plan.cc and its tests use it.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/psctl/plan.h"

namespace pscluster::plan::internal {

// What the layouts are evaluated against; references to MakePlan's values.
struct Cluster {
  const PlanInput& input;
  const Model& model;
  const Device& device;
  int64_t gpus = 0;
  double usable_memory_bytes = 0;
};

// The link a collective over `size` GPUs, `stride` ranks apart, crosses. Ranks count the
// tensor dimension fastest, then data, then pipeline (Megatron's order), node by node.
// Within a node each GPU has its own NVLink (intra_node_gbps). A group spanning nodes is
// limited by each node's NICs (inter_node_gbit / 8 GB/s): a ring crosses a node's NICs
// once, so they carry what one member sends, but the node's other groups of the same kind
// cross them at the same time and share them (gpus_per_node / members per node of them).
struct Link {
  bool inter_node = false;
  double gbps = 0;      // per GPU, one direction
  int64_t sharing = 1;  // groups sharing the node's NICs
};
Link GroupLink(const Cluster& c, int64_t stride, int64_t size);

// Bytes per parameter of mixed-precision Adam state on one GPU: 2 (bf16 weights) + 2 (bf16
// gradients) + 12 (fp32 master, m, v). ZeRO-1 divides the 12 by D, ZeRO-2 the 14 of
// gradients and optimizer, ZeRO-3 all 16. fp32: 4 (weights) + 4 (gradients) + 8 (m, v),
// ZeRO dividing the 8, then 12, then 16. `replica` > 0 replaces DDP's 16 (a framework's
// own copies: those beyond the weights and gradients are the optimizer's, which ZeRO-1, and
// the TxPxD layouts, divide by D).
double StateBytesPerParam(int zero, int64_t d, bool fp32 = false, double replica = 0);

// DDP, ZeRO-1, ZeRO-2 and ZeRO-3 over every GPU; then every T x P x D = GPUs with T a power
// of two within a node dividing the heads, P at most the layers (ZeRO-1 over D, as
// Megatron's distributed optimizer): tensor-only by T, then pipelined by P and T. Each
// with its memory, fit, collectives and estimated step time filled in.
std::vector<Layout> EvaluateLayouts(const Cluster& c);

}  // namespace pscluster::plan::internal
