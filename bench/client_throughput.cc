// Dense push and pull goodput of the C++ PsClient against external ps_server shards: the
// C++ side of bench/python_vs_cpp_client.sh (bench/py_client_throughput.py is the Python
// side, same sizes, same warm-ups and repetitions, same JSON).
//
//   bazel build -c opt //bench:client_throughput
//   bazel-bin/bench/client_throughput --shards=127.0.0.1:5000,127.0.0.1:5001 \
//       --sizes_kib=64,1024,16384,65536 --reps=7 --json=/tmp/cpp.json
//
// For each size: an ASP dense table with SGD (learning rate 1e-6, zeros; table id
// --table_id_base + the size's index), 2 warm-ups, then --reps timed PushDense and PullDense
// of the whole tensor, alternating. Goodput = tensor bytes / wall time of one call; the
// median of the timed calls is reported, and the median client CPU time (user + system, all
// threads) of one call.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/ps/ps_client.h"

ABSL_FLAG(std::vector<std::string>, shards, {}, "Shard addresses HOST:PORT, by shard id.");
ABSL_FLAG(std::vector<std::string>, sizes_kib,
          std::vector<std::string>({"64", "1024", "16384", "65536"}), "Tensor sizes in KiB.");
ABSL_FLAG(int, reps, 7, "Timed pushes and pulls per size (median reported), after 2 warm-ups.");
ABSL_FLAG(uint32_t, table_id_base, 1000,
          "Table id of the first size (the next sizes: +1, +2, ...). Creating an existing "
          "table again is fine when its spec is identical.");
ABSL_FLAG(std::string, json, "", "Also write the results as JSON to this file.");

namespace {

namespace ps = pscluster::ps;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPU seconds (user + system, every thread) this process has used.
double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Wall seconds of fn(); adds its CPU seconds to *cpu.
template <typename Fn>
double Seconds(Fn fn, double* cpu) {
  double c0 = CpuSeconds();
  absl::Time t0 = absl::Now();
  fn();
  double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  *cpu = CpuSeconds() - c0;
  return wall;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

struct Result {
  uint64_t bytes;
  double push_gbps, pull_gbps;
  double push_cpu_ms, pull_cpu_ms;  // median client CPU time per call
};

// One tensor size: a fresh table, reps timed pushes and pulls after 2 warm-ups (the pulled
// values must agree), and the medians.
Result MeasureSize(pscluster::PsClient* client, uint32_t table_id, uint64_t bytes, int reps) {
  ps::TableSpec spec;
  spec.set_table_id(table_id);
  spec.set_size(bytes / sizeof(float));
  spec.mutable_optimizer()->set_kind(ps::OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(1e-6f);
  spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(ps::InitializerConfig::ZEROS);
  Check(client->CreateTable(spec), "CreateTable");
  std::vector<float> grad(spec.size(), 0.5f), out(spec.size());
  std::vector<double> push, pull, push_cpu, pull_cpu;
  for (int i = 0; i < reps + 2; ++i) {
    double ca, cb;
    double a =
        Seconds([&] { Check(client->PushDense(spec.table_id(), i, grad), "PushDense"); }, &ca);
    double b = Seconds(
        [&] { Check(client->PullDense(spec.table_id(), i, absl::MakeSpan(out)), "PullDense"); },
        &cb);
    if (i < 2) continue;  // warm-up
    push.push_back(a), pull.push_back(b), push_cpu.push_back(ca), pull_cpu.push_back(cb);
  }
  // Every value took the same SGD steps (negative: gradients are positive).
  for (float v : out) {
    if (v != out[0] || !(v < 0.0f)) {
      std::fprintf(stderr, "pulled values disagree: %g vs %g\n", v, out[0]);
      std::exit(1);
    }
  }
  return Result{bytes, bytes / Median(push) / 1e9, bytes / Median(pull) / 1e9,
                1e3 * Median(push_cpu), 1e3 * Median(pull_cpu)};
}

bool WriteJson(const std::string& path, const std::vector<Result>& results, int shards, int reps) {
  std::ofstream f(path);
  f << "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    f << absl::StrCat("  {\"client\": \"cpp\", \"shards\": ", shards, ", \"bytes\": ", r.bytes,
                      ", \"reps\": ", reps, ", \"push_gbps\": ", r.push_gbps,
                      ", \"pull_gbps\": ", r.pull_gbps, ", \"push_cpu_ms\": ", r.push_cpu_ms,
                      ", \"pull_cpu_ms\": ", r.pull_cpu_ms, "}",
                      i + 1 < results.size() ? ",\n" : "\n");
  }
  f << "]\n";
  if (!f) {
    std::fprintf(stderr, "could not write %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using pscluster::PsClient;
  pscluster::PsClientOptions o;
  o.shard_addresses = absl::GetFlag(FLAGS_shards);
  if (o.shard_addresses.empty()) {
    std::fprintf(stderr, "--shards=HOST:PORT,... is required\n");
    return 2;
  }
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  auto client_or = PsClient::Create(o);
  Check(client_or.status(), "PsClient::Create");
  std::unique_ptr<PsClient> client = std::move(*client_or);
  Check(client->RegisterWorker(), "RegisterWorker");

  std::vector<Result> results;
  std::printf("%-7s %-10s %10s %10s %12s %12s\n", "shards", "tensor", "push GB/s", "pull GB/s",
              "push cpu ms", "pull cpu ms");
  const auto sizes = absl::GetFlag(FLAGS_sizes_kib);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const uint64_t bytes = std::stoull(sizes[k]) << 10;
    const Result r = MeasureSize(client.get(), absl::GetFlag(FLAGS_table_id_base) + k, bytes, reps);
    std::printf("%-7d %6lu KiB %10.3f %10.3f %12.2f %12.2f\n", client->num_shards(),
                static_cast<unsigned long>(bytes >> 10), r.push_gbps, r.pull_gbps, r.push_cpu_ms,
                r.pull_cpu_ms);
    std::fflush(stdout);
    results.push_back(r);
  }
  const std::string path = absl::GetFlag(FLAGS_json);
  if (!path.empty() && !WriteJson(path, results, client->num_shards(), reps)) return 1;
  return 0;
}
