// Snapshot write throughput against a sequential fsync'd write of the same bytes to the same
// directory, and the training stall: push latency while a snapshot is written vs without.
//
//   bazel run -c opt //bench:snapshot_throughput -- --dir=/var/tmp/pscluster_bench
//
// One shard in this process, one dense Adam table (values + 2 state arrays) of the given
// total size, ASP. Per size and round: ceiling write, then a snapshot (capture + background
// write until durable), interleaved. A pusher thread sends 1 MiB pushes to the table
// throughout a round's snapshot and, before it, for as long without one.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/ps/snapshot/snapshotter.h"

ABSL_FLAG(std::string, dir, "/var/tmp/pscluster_snapshot_bench", "Directory on the disk to test.");
ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"64", "512", "2048"}),
          "Parameters + optimizer state per run, MiB.");
ABSL_FLAG(int, rounds, 3, "Rounds per size (median reported).");
ABSL_FLAG(bool, cow_ab, false,
          "Instead: per round, a snapshot with copy-on-write capture and one with the whole "
          "state copied under the lock (alternating which goes first); write MB/s and pause "
          "of each.");

namespace pscluster::bench {
namespace {

namespace fs = std::filesystem;
using ps::DenseTable;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Sequential write of `bytes` in 4 MiB writes, then fsync: the disk's ceiling.
double CeilingSeconds(const std::string& path, uint64_t bytes) {
  std::vector<char> buf(4 << 20, 1);
  absl::Time t0 = absl::Now();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) std::abort();
  for (uint64_t done = 0; done < bytes; done += buf.size()) {
    if (write(fd, buf.data(), std::min<uint64_t>(buf.size(), bytes - done)) < 0) std::abort();
  }
  fsync(fd);
  close(fd);
  double s = absl::ToDoubleSeconds(absl::Now() - t0);
  fs::remove(path);
  return s;
}

// Pushes 1 MiB gradients to `table` until `stop`, recording each push's latency.
struct Pusher {
  DenseTable* table;
  std::atomic<bool> stop{false};
  std::vector<double> latencies;
  std::thread thread;

  void Start() {
    stop = false;
    latencies.clear();
    thread = std::thread([this] {
      std::vector<float> g(1 << 18, 1e-3f);
      bool skipped;
      for (int64_t i = 0; !stop; ++i) {
        uint64_t begin = (i * g.size()) % (table->range().size() - g.size());
        absl::Time t0 = absl::Now();
        if (!table->Push(0, i, begin, {absl::MakeConstSpan(g)}, &skipped).ok()) std::abort();
        latencies.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      }
    });
  }
  void Stop() {
    stop = true;
    thread.join();
  }
};

// One size's shard (a table of that many bytes of Adam state), its snapshotter, and a
// pusher to run beside the snapshots.
struct SizeRun {
  SizeRun(uint64_t bytes, const std::string& dir) : root(dir) {
    shard.RegisterWorker(0);
    ps::TableSpec spec;
    spec.set_table_id(1);
    spec.set_size(bytes / 12);  // values + Adam m and v
    spec.mutable_optimizer()->set_kind(ps::OptimizerConfig::ADAM);
    spec.mutable_optimizer()->set_learning_rate(1e-3f);
    spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
    if (!shard.CreateTable(spec).ok()) std::abort();
    ps::SnapshotterOptions so;
    so.root = root;
    so.keep_last = 2 * absl::GetFlag(FLAGS_rounds) + 1;  // no retention work inside the timing
    snapshotter = *ps::Snapshotter::Create(&shard, so);
    pusher.reset(new Pusher{*shard.GetDense(1, 0)});
  }
  // One snapshot: its seconds from request to durable (a failure ends the program).
  double Snapshot(double* pause_seconds) {
    ps::SnapshotRequest req;
    req.set_step(step++);
    absl::Time t0 = absl::Now();
    auto r = snapshotter->Snapshot(req, absl::InfiniteFuture());
    capture.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    if (!r.ok() || !snapshotter->AwaitIdle(absl::InfiniteFuture()) ||
        !snapshotter->Status().last_error().empty()) {
      std::fprintf(stderr, "snapshot failed: %s %s\n", r.status().ToString().c_str(),
                   snapshotter->Status().last_error().c_str());
      std::exit(1);
    }
    *pause_seconds = r->pause_seconds();
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

  const std::string root;
  ps::Shard shard{ps::ShardOptions{}};
  std::unique_ptr<ps::Snapshotter> snapshotter;
  std::unique_ptr<Pusher> pusher;
  std::vector<double> capture;  // each Snapshot call's seconds
  int64_t step = 0;
};

// --cow_ab: write rate and pause with a whole copy against copy on write, interleaved.
void CowAb(SizeRun& run, const std::string& mib, uint64_t bytes) {
  ps::DenseTable* table = *run.shard.GetDense(1, 0);
  std::vector<double> mbs[2], pauses[2];  // [0] whole copy, [1] copy on write
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (int k = 0; k < 2; ++k) {
      const int cow = (round + k) % 2;
      table->set_copy_on_write(cow == 1);
      double p = 0, seconds = run.Snapshot(&p);
      mbs[cow].push_back(bytes / seconds / 1e6);
      pauses[cow].push_back(p / seconds);
    }
  }
  table->set_copy_on_write(true);
  std::printf(
      "%-8s whole copy: %.0f MB/s, pause %.2f%%; copy on write: %.0f MB/s, pause "
      "%.2f%%; write MB/s cow/whole %.2f\n",
      mib.c_str(), Median(mbs[0]), 100 * Median(pauses[0]), Median(mbs[1]), 100 * Median(pauses[1]),
      Median(mbs[1]) / Median(mbs[0]));
  std::fflush(stdout);
}

// Throughput alone against the fsync ceiling, and pushes' latency beside a snapshot.
void Rounds(SizeRun& run, const std::string& mib, uint64_t bytes) {
  std::vector<double> snap, ceiling, pause, idle_p50, busy_p50, busy_max;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    // Throughput: the ceiling, then a snapshot with nothing else running.
    ceiling.push_back(bytes / CeilingSeconds(run.root + "/ceiling.bin", bytes) / 1e6);
    double p = 0, seconds = run.Snapshot(&p);
    snap.push_back(bytes / seconds / 1e6);
    pause.push_back(p / seconds);
    // Stall: 1 MiB pushes for as long as a snapshot takes, then during one.
    run.pusher->Start();
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(1000 * seconds)));
    run.pusher->Stop();
    idle_p50.push_back(Median(run.pusher->latencies));
    run.pusher->Start();
    double busy_seconds = run.Snapshot(&p);
    run.pusher->Stop();
    busy_p50.push_back(Median(run.pusher->latencies));
    busy_max.push_back(
        *std::max_element(run.pusher->latencies.begin(), run.pusher->latencies.end()));
    std::printf(
        "  round %d: %.0f MB/s alone (fsync ceiling %.0f), pause %.1f ms of %.2f s "
        "(capture call %.2f s); under pushes %.2f s, slowest push %.1f ms\n",
        round, snap.back(), ceiling.back(), 1e3 * p, seconds, run.capture[run.capture.size() - 2],
        busy_seconds, 1e3 * busy_max.back());
  }
  std::printf("%-8s %11.0f %11.0f %6.2f %7.2f%% %12.3f %12.3f %7.2f %9.1f\n", mib.c_str(),
              Median(snap), Median(ceiling), Median(snap) / Median(ceiling), 100 * Median(pause),
              1e3 * Median(idle_p50), 1e3 * Median(busy_p50), Median(busy_p50) / Median(idle_p50),
              1e3 * Median(busy_max));
  std::fflush(stdout);
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace pscluster::bench;
  const std::string dir = absl::GetFlag(FLAGS_dir);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::printf("%-8s %11s %11s %6s %8s %12s %12s %7s %9s\n", "MiB", "snap MB/s", "fsync MB/s",
              "ratio", "pause %", "push p50 ms", "during p50", "ratio", "max ms");
  for (const std::string& mib_flag : absl::GetFlag(FLAGS_sizes_mib)) {
    const uint64_t bytes = std::stoull(mib_flag) << 20;
    SizeRun run(bytes, dir + "/" + mib_flag);
    if (absl::GetFlag(FLAGS_cow_ab)) {
      CowAb(run, mib_flag, bytes);
    } else {
      Rounds(run, mib_flag, bytes);
    }
  }
  fs::remove_all(dir);
  return 0;
}
