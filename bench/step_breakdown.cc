// Where one training step's time goes on this machine, per component, for the MLP our
// workers train (batch 64): forward + backward (OpenBLAS, 1 thread), the optimizer pass
// over every parameter (the server's code), and the copies in and out of the model.
// Compare with PyTorch's per-step figures from bench/step_torch.py.
//
//   bazel run -c opt //bench:step_breakdown -- [--steps=1000]
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "core/optimizer/optimizer_config.h"
#include "worker/compute/backend.h"
#include "worker/data/dataset.h"
#include "worker/model/mlp.h"
#include "worker/modes/placement.h"

ABSL_FLAG(int, steps, 1000, "Timed repetitions of each component.");
ABSL_FLAG(int, batch, 64, "Examples per step.");

using namespace pscluster;

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps), batch = absl::GetFlag(FLAGS_batch);
  model::MlpOptions mlp_options;
  auto backend = compute::MakeCpuBackend(1);
  auto mlp = *model::Mlp::Create(backend.get(), mlp_options, batch);
  ps::OptimizerConfig adam;
  adam.set_kind(ps::OptimizerConfig::ADAM);
  adam.set_learning_rate(1e-3f);
  auto opt = *core::MakeOptimizer(adam);
  modes::ModelState state = modes::InitialState(model::MlpSpec(mlp_options, 1), *opt);
  data::Dataset data = data::MakeSynthetic(batch, 784, 10, 1);
  std::vector<std::vector<float>> grads;
  for (const auto& p : state.params) grads.emplace_back(p.size());
  auto time = [&](const char* what, auto fn) {
    for (int i = 0; i < steps / 10 + 1; ++i) fn(i);  // warm-up
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < steps; ++i) fn(i);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / steps;
    std::printf("%-34s %8.3f ms/step\n", what, ms);
    return ms;
  };
  double total = 0;
  total += time("set parameters (host -> model)", [&](int) {
    for (size_t i = 0; i < state.params.size(); ++i) mlp->SetParam(i, state.params[i].data());
  });
  total += time("forward + backward",
                [&](int) { (void)mlp->ForwardBackward(data.x.data(), data.y.data(), batch); });
  total += time("get gradients (model -> host)", [&](int) {
    for (size_t i = 0; i < grads.size(); ++i) mlp->GetGrad(i, grads[i].data());
  });
  total += time("adam over every parameter", [&](int i) {
    for (size_t p = 0; p < state.params.size(); ++p) {
      float* slots[] = {state.slots[p][0].data(), state.slots[p][1].data()};
      opt->Apply(state.params[p].data(), grads[p].data(), slots, state.params[p].size(), i + 1);
    }
  });
  std::printf("%-34s %8.3f ms/step (%.0f samples/s per worker before communication)\n", "sum",
              total, batch / total * 1e3);
  return 0;
}
