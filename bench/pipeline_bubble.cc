// The PIPELINE mode's measured bubble against the 1F1B schedule's ideal (K-1)/(M+K-1):
// K = 2 stages (two ranks as threads, Gloo over loopback) of an MLP with equal layers
// (4 x 512 -> 512, so the stages are balanced), a global batch of 128 split into
// M = 1, 2, 4, 8, 16 micro-batches. The bubble is the share of a stage's step time it
// spends not computing (waiting for its neighbour, or sending). Also the throughput.
//
//   bazel run -c opt //bench:pipeline_bubble -- [--steps=60]
//
// The figures cover every step (the first ones, with their allocations, included).
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "worker/collective/communicator.h"
#include "worker/modes/trainer.h"

ABSL_FLAG(int, steps, 60, "Steps per configuration.");

using namespace pscluster;

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps), world = 2, width = 512;
  const data::Dataset data = data::MakeSynthetic(4096, width, 10, 1);
  std::printf(
      "| micro-batches M | ideal (K-1)/(M+K-1) | bubble stage 0 | bubble stage 1 | "
      "samples/s |\n|---|---|---|---|---|\n");
  for (int micro : {1, 2, 4, 8, 16}) {
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
        o.model.mlp.layers = {width, width, width, width, 10};
        o.optimizer.set_kind(ps::OptimizerConfig::ADAM);
        o.optimizer.set_learning_rate(1e-3f);
        o.micro_batches = micro;
        o.evaluate = false;
        o.connect = [&store, r](const std::string& gen)
            -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
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
    std::printf("| %d | %.3f | %.3f | %.3f | %.0f |\n", micro,
                get(figures[0], "pipeline_bubble_ideal"), get(figures[0], "pipeline_bubble"),
                get(figures[1], "pipeline_bubble"), steps * 128.0 / seconds);
    std::fflush(stdout);
  }
  return 0;
}
