// psctl plan's flags (--params, --nodes, --gpu, ...: one per PlanInput field, same name and
// default) read into a PlanInput. MakePlan checks the values.
#pragma once

#include "tools/psctl/plan.h"

namespace pscluster::plan {

PlanInput PlanInputFromFlags();

}  // namespace pscluster::plan
