// How psctl plan prints a Plan (plan.h): a table for people, one JSON object for scripts.
#pragma once

#include <string>

#include "tools/psctl/plan.h"

namespace pscluster::plan {

// Sections 1-6 (data, memory per layout, recommendation, communication, compute,
// checkpoints), each figure with its formula or assumption beside it. GB = 1e9 bytes.
std::string PlanTable(const Plan& plan);

// One or two sentences: why the recommended layout (or that nothing fits).
std::string RecommendationWhy(const Plan& plan);

// One JSON object on one line (and a newline): "model", "device", "cluster", "data",
// "layouts" (each with "communication", null for a layout that does not fit),
// "recommended" (a layout's name or null), "why", "compute", "checkpoint". Plain units:
// bytes, seconds, FLOP, GB/s; every number finite.
std::string PlanJson(const Plan& plan);

}  // namespace pscluster::plan
