// The PIPELINE mode's measured bubble against the 1F1B schedule's ideal (K-1)/(M+K-1):
// K = 2 stages (two ranks as threads, Gloo over loopback) of an MLP whose stages do the
// same work: 768 -> 512, then 4 x 512 -> 512 and a 512 -> 10 head, cut after the second
// layer (the first stage computes no gradient of its input, so its first layer is 1.5x
// wider). A global batch of 128 split into M = 1, 2, 4, 8, 16 micro-batches. The bubble is
// the share of a stage's step time it spends in messages (waiting for its neighbour, or
// sending). Also the throughput. Rounds interleave the M; the figures are medians.
//
//   bazel run -c opt //bench:pipeline_bubble -- [--steps=60] [--rounds=5]
//
// The figures cover every step (the first ones, with their allocations, included).
#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/median.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "worker/collective/communicator.h"
#include "worker/modes/trainer.h"

ABSL_FLAG(int, steps, 60, "Steps per configuration and round.");
ABSL_FLAG(int, rounds, 5, "Rounds over every M; the figures are medians.");

using namespace pscluster;

namespace {

struct Figures {
  double ideal, bubble[2], samples_per_s;
};

Figures Run(int micro, int steps) {
  const int world = 2;
  static const data::Dataset data = data::MakeSynthetic(4096, 768, 10, 1);
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<std::pair<std::string, double>>> figures(world);
  double seconds = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      modes::TrainerOptions o;
      o.mode = coord::PIPELINE;
      o.rank = r;
      o.world = world;
      o.batch_size = 64;
      o.epochs = 100;
      o.model.mlp.layers = {768, 512, 512, 512, 512, 10};
      o.optimizer.set_kind(ps::OptimizerConfig::ADAM);
      o.optimizer.set_learning_rate(1e-3f);
      o.micro_batches = micro;
      o.evaluate = false;
      o.connect =
          [&store,
           r](const std::string& gen) -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
        gloo::rendezvous::PrefixStore prefixed(gen, store);
        return collective::CreateGlooCommunicator(&prefixed, collective::GlooOptions{r, 2});
      };
      auto t = modes::Trainer::Create(o, &data, nullptr, compute::MakeCpuBackend(1));
      if (!t.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, t.status().ToString().c_str());
        std::exit(1);
      }
      const absl::Time start = absl::Now();
      for (int s = 0; s < steps; ++s) {
        if (auto l = (*t)->Step(s); !l.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", r, l.status().ToString().c_str());
          std::exit(1);
        }
      }
      if (r == 0) seconds = absl::ToDoubleSeconds(absl::Now() - start);
      figures[r] = (*t)->Figures();
    });
  }
  for (auto& t : threads) t.join();
  auto get = [](const std::vector<std::pair<std::string, double>>& f, const std::string& k) {
    for (const auto& [name, value] : f) {
      if (name == k) return value;
    }
    return -1.0;
  };
  return {get(figures[0], "pipeline_bubble_ideal"),
          {get(figures[0], "pipeline_bubble"), get(figures[1], "pipeline_bubble")},
          steps * 128.0 / seconds};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps), rounds = absl::GetFlag(FLAGS_rounds);
  const std::vector<int> micros = {1, 2, 4, 8, 16};
  std::vector<std::vector<Figures>> runs(micros.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < micros.size(); ++i) runs[i].push_back(Run(micros[i], steps));
    std::fprintf(stderr, "round %d of %d done\n", round + 1, rounds);
  }
  std::printf(
      "| micro-batches M | ideal (K-1)/(M+K-1) | bubble stage 0 | bubble stage 1 | "
      "larger / ideal | samples/s |\n|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < micros.size(); ++i) {
    std::vector<double> b0, b1, rate;
    for (const Figures& f : runs[i]) {
      b0.push_back(f.bubble[0]);
      b1.push_back(f.bubble[1]);
      rate.push_back(f.samples_per_s);
    }
    const double ideal = runs[i][0].ideal, m0 = bench::Median(b0), m1 = bench::Median(b1);
    std::printf("| %d | %.3f | %.3f | %.3f | %.2f | %.0f |\n", micros[i], ideal, m0, m1,
                std::max(m0, m1) / ideal, bench::Median(rate));
  }
  return 0;
}
