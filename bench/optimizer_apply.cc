// What a server-side optimizer's update costs per parameter, against a ceiling: memcpy
// between two buffers as large together as the update's arrays (parameters, gradient,
// slots), in the same run. GB/s counts the bytes read and written: the update reads the
// parameters, the gradient and the slots and writes the parameters and the slots; memcpy
// reads one half and writes the other.
//
//   bazel run -c opt //bench:optimizer_apply -- --values=242000,16777216 --rounds=5
//
// Prints one markdown row per optimizer and size: ns per value (median of rounds), the
// update's bytes per second, memcpy's, and their ratio.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/median.h"
#include "core/optimizer/optimizer.h"

ABSL_FLAG(std::string, values, "242000,16777216", "parameters per update, comma-separated");
ABSL_FLAG(int, rounds, 5, "rounds; the median is printed");
ABSL_FLAG(double, seconds, 0.2, "time per round and kind");

namespace {

using pscluster::bench::Median;
using pscluster::core::Optimizer;
using pscluster::core::OptimizerOptions;
using Clock = std::chrono::steady_clock;

// Calls fn() for about `seconds`; returns ns per call.
template <typename Fn>
double TimePerCall(double seconds, Fn fn) {
  const auto start = Clock::now();
  int64_t calls = 0;
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  return elapsed * 1e9 / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const struct {
    const char* name;
    OptimizerOptions::Kind kind;
  } kinds[] = {{"sgd", OptimizerOptions::Kind::kSgd},
               {"momentum", OptimizerOptions::Kind::kMomentum},
               {"adagrad", OptimizerOptions::Kind::kAdagrad},
               {"adam", OptimizerOptions::Kind::kAdam},
               {"ftrl", OptimizerOptions::Kind::kFtrl}};
  std::printf(
      "| optimizer | values | ns / value | update GB/s | memcpy GB/s (same arrays) | "
      "update / memcpy |\n|---|---|---|---|---|---|\n");
  for (absl::string_view field : absl::StrSplit(absl::GetFlag(FLAGS_values), ',')) {
    size_t n = 0;
    if (!absl::SimpleAtoi(field, &n) || n == 0) {
      std::fprintf(stderr, "--values: '%s' is not a count > 0\n", std::string(field).c_str());
      return 2;
    }
    for (const auto& k : kinds) {
      OptimizerOptions options;
      options.kind = k.kind;
      options.learning_rate = 1e-3f;
      const std::unique_ptr<Optimizer> opt = *Optimizer::Create(options);
      const int slots = opt->num_slots();
      std::vector<float> w(n, 0.5f), g(n);
      for (size_t i = 0; i < n; ++i)
        g[i] = static_cast<float>((i * 2654435761u) % 1000) / 1e3f - 0.5f;
      std::vector<std::vector<float>> slot(slots);
      std::vector<float*> slot_ptr;
      for (int s = 0; s < slots; ++s) {
        slot[s].assign(n, opt->slot_initial_value(s));
        slot_ptr.push_back(slot[s].data());
      }
      const size_t bytes = (2 * (1 + slots) + 1) * n * sizeof(float);  // read + written
      const size_t half = (2 + slots) * n * sizeof(float) / 2;         // of the arrays
      std::vector<char> from(half, 1), to(half);
      std::vector<double> update_ns, copy_ns;
      int64_t step = 1;
      for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
        update_ns.push_back(TimePerCall(absl::GetFlag(FLAGS_seconds), [&] {
          opt->Apply(w.data(), g.data(), slot_ptr.data(), n, step++);
        }));
        copy_ns.push_back(TimePerCall(absl::GetFlag(FLAGS_seconds), [&] {
          std::memcpy(to.data(), from.data(), from.size());
          from[0] = to[1];  // keeps the copy from being dropped
        }));
      }
      const double u = Median(update_ns), c = Median(copy_ns);
      std::printf("| %s | %zu | %.3f | %.1f | %.1f | %.2f |\n", k.name, n, u / n, bytes / u,
                  2.0 * half / c, (bytes / u) / (2.0 * half / c));
    }
  }
  return 0;
}
