// Tests of psctl plan: the README's exercise as a PlanInput, and a plan that must succeed.
#pragma once

#include "gtest/gtest.h"
#include "tools/psctl/plan.h"

namespace pscluster::plan::testing {

// psctl plan --params=13e9 --dataset_bytes=200e9 --bytes_per_token=4 --nodes=4
//   --gpus_per_node=8 --gpu=a100-80gb --inter_node_gbit=200 --mfu_low=0.4 --mfu_high=0.5
inline PlanInput Exercise13B() {
  PlanInput in;
  in.params = 13e9;
  in.dataset_bytes = 200e9;
  in.bytes_per_token = 4;
  in.nodes = 4;
  in.gpus_per_node = 8;
  in.gpu = "a100-80gb";
  in.inter_node_gbit = 200;
  in.mfu_low = 0.4;
  in.mfu_high = 0.5;
  return in;
}

inline Plan MustPlan(const PlanInput& in) {
  absl::StatusOr<Plan> plan = MakePlan(in);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : Plan{};
}

}  // namespace pscluster::plan::testing
