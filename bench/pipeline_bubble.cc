// The PIPELINE mode's measured bubble against the 1F1B schedule's ideal (K-1)/(M+K-1):
// K = 2 stages (two ranks as threads, Gloo over loopback) of an MLP whose stages do the
// same work: 768 -> 512, then 4 x 512 -> 512 and a 512 -> 10 head, cut after the second
// layer (the first stage computes no gradient of its input, so its first layer is 1.5x
// wider). A global batch of 128 split into M = 1, 2, 4, 8, 16 micro-batches. The bubble is
// the share of a stage's step time it spends in messages (waiting for its neighbour, or
// sending). Also the throughput. Rounds interleave the M; the figures are medians.
//
// Equal work is not equal time: the stages' measured forward, backward and update times
// (the workers' pipeline_*_ms figures) are played out in the same 1F1B schedule with free
// messages (bench/one_f_one_b.h), which gives the bubble these stages' compute alone leaves;
// the measured bubble over that one is what the messages and the stages' jitter add.
//
//   bazel run -c opt //bench:pipeline_bubble -- [--steps=60] [--warmup=5] [--rounds=5]
//                                               [--input_width=768]
//
// The figures cover the steps after the warm-up ones (whose first allocates the buffers and
// wakes OpenBLAS: a few times a steady step, which in 60 steps moved the bubble by 0.01-0.04).
#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/median.h"
#include "bench/one_f_one_b.h"
#include "worker/collective/communicator.h"
#include "worker/modes/trainer.h"

ABSL_FLAG(int, steps, 60, "Steps per configuration and round, after the warm-up.");
ABSL_FLAG(int, warmup, 5, "Steps before those measured.");
ABSL_FLAG(int, input_width, 768,
          "The first layer's inputs: 768 makes the stages' multiply-adds equal; wider moves "
          "compute (and parameters) to the first stage.");
ABSL_FLAG(int, rounds, 5, "Rounds over every M; the figures are medians.");

using namespace pscluster;

namespace {

struct Figures {
  double ideal, bubble[2], samples_per_s;
  std::vector<bench::StageTimes> stages;  // by stage
  std::vector<double> scheduled;          // by stage: the bubble these times leave in 1F1B
};

using Named = std::vector<std::pair<std::string, double>>;

double Get(const Named& f, const std::string& k) {
  for (const auto& [name, value] : f) {
    if (name == k) return value;
  }
  std::fprintf(stderr, "no figure %s from the pipeline\n", k.c_str());
  std::exit(1);
}

// A stage's figures over the steps between two readings of them, `before` after `n0` steps
// and `after` after `n1` (each a mean over the steps until then).
void Between(const Named& before, const Named& after, int n0, int n1, double* bubble,
             bench::StageTimes* times) {
  auto total = [&](const Named& f, const std::string& k, int n) { return Get(f, k) * n; };
  const double step0 = total(before, "pipeline_step_ms", n0),
               step1 = total(after, "pipeline_step_ms", n1);
  *bubble = (Get(after, "pipeline_bubble") * step1 - Get(before, "pipeline_bubble") * step0) /
            (step1 - step0);
  auto mean = [&](const std::string& k) {
    return (total(after, k, n1) - total(before, k, n0)) / (n1 - n0);
  };
  *times = {mean("pipeline_forward_ms"), mean("pipeline_backward_ms"), mean("pipeline_update_ms")};
}

Figures Run(int micro, int steps, int warmup) {
  const int world = 2;
  const int width = absl::GetFlag(FLAGS_input_width);
  static const data::Dataset data = data::MakeSynthetic(4096, width, 10, 1);
  collective::MemoryRendezvous store;
  std::vector<Named> warm(world), figures(world);
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
      o.model.mlp.layers = {width, 512, 512, 512, 512, 10};
      o.optimizer.set_kind(ps::OptimizerConfig::ADAM);
      o.optimizer.set_learning_rate(1e-3f);
      o.micro_batches = micro;
      o.evaluate = false;
      o.connect =
          [&store,
           r](const std::string& gen) -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
        collective::GlooOptions g{r, 2};
        g.key_prefix = gen;
        return collective::CreateGlooCommunicator(&store, g);
      };
      auto t = modes::Trainer::Create(o, &data, nullptr, compute::MakeCpuBackend(1));
      if (!t.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, t.status().ToString().c_str());
        std::exit(1);
      }
      absl::Time start;
      for (int s = 0; s < warmup + steps; ++s) {
        if (s == warmup) {
          warm[r] = (*t)->Figures();
          start = absl::Now();
        }
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
  Figures out{Get(figures[0], "pipeline_bubble_ideal"),
              {0, 0},
              steps * 128.0 / seconds,
              std::vector<bench::StageTimes>(world),
              {}};
  for (int r = 0; r < world; ++r) {
    Between(warm[r], figures[r], warmup, warmup + steps, &out.bubble[r], &out.stages[r]);
  }
  out.scheduled = bench::OneFOneBBubble(out.stages, micro, 3);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int steps = absl::GetFlag(FLAGS_steps), rounds = absl::GetFlag(FLAGS_rounds),
            warmup = absl::GetFlag(FLAGS_warmup);
  const std::vector<int> micros = {1, 2, 4, 8, 16};
  std::vector<std::vector<Figures>> runs(micros.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < micros.size(); ++i) runs[i].push_back(Run(micros[i], steps, warmup));
    std::fprintf(stderr, "round %d of %d done\n", round + 1, rounds);
  }
  std::printf(
      "| micro-batches M | ideal (K-1)/(M+K-1) | bubble stage 0 | bubble stage 1 | "
      "larger / ideal | forward, backward stage 0 / 1, ms | update stage 0 / 1, ms | these stages' "
      "1F1B bubble 0 / 1 | measured / these stages' (larger) | samples/s |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < micros.size(); ++i) {
    // The median over the rounds of one figure of a run.
    auto med = [&](auto figure) {
      std::vector<double> v;
      for (const Figures& f : runs[i]) v.push_back(figure(f));
      return bench::Median(v);
    };
    const double ideal = runs[i][0].ideal;
    const double m0 = med([](const Figures& f) { return f.bubble[0]; });
    const double m1 = med([](const Figures& f) { return f.bubble[1]; });
    auto stage = [&](int k, double bench::StageTimes::*time) {
      return med([=](const Figures& f) { return f.stages[k].*time; });
    };
    std::printf(
        "| %d | %.3f | %.3f | %.3f | %.2f | %.3f, %.3f / %.3f, %.3f | %.3f / %.3f | %.3f / %.3f | "
        "%.2f | %.0f |\n",
        micros[i], ideal, m0, m1, std::max(m0, m1) / ideal, stage(0, &bench::StageTimes::forward),
        stage(0, &bench::StageTimes::backward), stage(1, &bench::StageTimes::forward),
        stage(1, &bench::StageTimes::backward), stage(0, &bench::StageTimes::update),
        stage(1, &bench::StageTimes::update), med([](const Figures& f) { return f.scheduled[0]; }),
        med([](const Figures& f) { return f.scheduled[1]; }), med([](const Figures& f) {
          return std::max(f.bubble[0] / f.scheduled[0], f.bubble[1] / f.scheduled[1]);
        }),
        med([](const Figures& f) { return f.samples_per_s; }));
  }
  return 0;
}
