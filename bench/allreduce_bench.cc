// Gloo all-reduce through our Communicator: algbw and busbw (nccl-tests definitions) for
// 1 KiB .. 64 MiB of float32 across N processes on loopback, checked for correctness.
// Its baseline is bench/allreduce_torch.py (PyTorch's torch.distributed gloo all_reduce),
// run the same way; bench/allreduce_compare.sh runs both interleaved.
//
//   bazel-bin/bench/allreduce_bench --ranks=2 --iters=20 --json=/tmp/ours.json
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/file_rendezvous.h"
#include "worker/collective/communicator.h"

ABSL_FLAG(int, ranks, 2, "Processes (one rank each).");
ABSL_FLAG(int, iters, 20, "Timed all-reduces per size (median), after 3 warm-ups.");
ABSL_FLAG(std::string, json, "", "Rank 0 writes the results here as JSON.");
ABSL_FLAG(int64_t, min_bytes, 1024, "The smallest all-reduce (then x4 up to --max_bytes).");
ABSL_FLAG(int64_t, max_bytes, int64_t{64} << 20, "The largest all-reduce.");
ABSL_FLAG(absl::Duration, collective_spin, absl::Microseconds(200),
          "How long a receive polls before it sleeps (ps_worker's flag of the same name).");

namespace {

int RunRank(int rank, int ranks, const std::string& store_dir) {
  pscluster::bench::FileRendezvous store(store_dir);
  pscluster::collective::GlooOptions options{rank, ranks, "127.0.0.1", absl::Seconds(60)};
  options.spin = absl::GetFlag(FLAGS_collective_spin);
  auto comm = pscluster::collective::CreateGlooCommunicator(&store, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 1;
  }
  std::string json = "[\n";
  if (rank == 0)
    std::printf("%12s %12s %12s %12s\n", "bytes", "time us", "algbw GB/s", "busbw GB/s");
  const size_t min_bytes = std::max<int64_t>(absl::GetFlag(FLAGS_min_bytes), sizeof(float) * 2);
  for (size_t bytes = min_bytes; bytes <= static_cast<size_t>(absl::GetFlag(FLAGS_max_bytes));
       bytes *= 4) {
    const size_t n = bytes / sizeof(float);
    std::vector<float> x(n);
    std::vector<double> times;
    for (int i = 0; i < absl::GetFlag(FLAGS_iters) + 3; ++i) {
      std::fill(x.begin(), x.end(), static_cast<float>(rank + 1));
      if (!(*comm)->Barrier().ok()) return 1;
      absl::Time t0 = absl::Now();
      if (!(*comm)->AllReduceSum(absl::MakeSpan(x)).ok()) return 1;
      if (i >= 3) times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      if (x[n / 2] != ranks * (ranks + 1) / 2.0f) {
        std::fprintf(stderr, "wrong sum %g\n", x[n / 2]);
        return 1;
      }
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double algbw = bytes / t / 1e9, busbw = algbw * 2.0 * (ranks - 1) / ranks;
    if (rank == 0) {
      std::printf("%12zu %12.1f %12.3f %12.3f\n", bytes, t * 1e6, algbw, busbw);
      absl::StrAppend(&json, bytes > min_bytes ? ",\n" : "", "  {\"bytes\": ", bytes,
                      ", \"algbw\": ", algbw, ", \"busbw\": ", busbw, "}");
    }
  }
  if (rank == 0 && !absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << json << "\n]\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const std::string dir = absl::StrCat("/tmp/pscluster_allreduce_", getpid());
  std::filesystem::create_directories(dir);
  std::vector<pid_t> children;
  for (int r = 1; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(r, ranks, dir));
    children.push_back(pid);
  }
  int rc = RunRank(0, ranks, dir);
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}
