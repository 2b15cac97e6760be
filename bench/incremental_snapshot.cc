// Incremental snapshots against full ones (issue 46): one shard holding a sparse Adagrad
// table of ROWS rows of dim 16, pushes touching 1 % and 10 % of the rows, then the same
// state snapshotted both ways, interleaved (which goes first alternates by round). Each
// snapshot is timed from the request until its file is durable. Prints one JSON object:
// the medians of the bytes and seconds of both, and their ratios.
//   bazel run -c opt //bench:incremental_snapshot -- [ROWS=1000000] [ROUNDS=5] [DIR=/var/tmp]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/median.h"
#include "server/ps/snapshot/snapshotter.h"
#include "server/ps/table/shard.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {
namespace {

constexpr uint32_t kDim = 16;

TableSpec Spec() {
  TableSpec spec;
  spec.set_table_id(1);
  spec.set_name("emb");
  spec.set_kind(TableSpec::SPARSE);
  spec.set_dim(kDim);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.05f);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
  spec.mutable_initializer()->set_scale(0.1f);
  return spec;
}

void Push(SparseTable* table, int64_t step, const std::vector<uint64_t>& keys) {
  constexpr size_t kBatch = 65536;
  for (size_t at = 0; at < keys.size(); at += kBatch) {
    const size_t n = std::min(kBatch, keys.size() - at);
    std::vector<float> grads(n * kDim, 0.01f * static_cast<float>(step % 7 + 1));
    bool skipped = false;
    // One push per step and worker: the batches go as the parts of one push.
    absl::Status s = table->Push(0, step, absl::MakeConstSpan(keys.data() + at, n), grads, &skipped,
                                 at / kBatch, (keys.size() + kBatch - 1) / kBatch);
    if (!s.ok()) {
      std::fprintf(stderr, "push of step %lld: %s\n", static_cast<long long>(step),
                   s.ToString().c_str());
      std::exit(1);
    }
  }
}

struct Taken {
  double seconds = 0;
  uint64_t bytes = 0;
};

Taken SnapshotAndWait(Snapshotter& s, int64_t step) {
  SnapshotRequest r;
  r.set_step(step);
  const absl::Time start = absl::Now();
  auto done = s.Snapshot(r, absl::Now() + absl::Minutes(10));
  if (!done.ok() || !s.AwaitIdle(absl::Now() + absl::Minutes(10)) ||
      !s.Status().last_error().empty()) {
    std::fprintf(stderr, "snapshot of step %lld failed: %s %s\n", static_cast<long long>(step),
                 done.status().ToString().c_str(), s.Status().last_error().c_str());
    std::exit(1);
  }
  Taken t{absl::ToDoubleSeconds(absl::Now() - start), 0};
  const absl::StatusOr<ListSnapshotsResponse> list = s.List();
  for (const SnapshotInfo& i : list->snapshots()) {
    if (i.step() == step) t.bytes = i.bytes();
  }
  return t;
}

std::unique_ptr<Snapshotter> Make(Shard* shard, const std::string& root, int full_every) {
  SnapshotterOptions o;
  o.root = root;
  o.full_every = full_every;
  o.keep_last = 2;
  auto s = Snapshotter::Create(shard, o);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(s);
}

int Main(uint64_t rows, int rounds, const std::string& dir) {
  const std::string root = absl::StrCat(dir, "/pscluster_incremental_", getpid());
  ShardOptions o;
  o.track_row_versions = true;
  Shard shard(o);
  shard.RegisterWorker(0);
  if (!shard.CreateTable(Spec()).ok()) return 1;
  SparseTable* table = *shard.GetSparse(1, 0);
  std::vector<uint64_t> all(rows);
  for (uint64_t k = 0; k < rows; ++k) all[k] = k;
  int64_t step = 0;
  Push(table, step++, all);
  auto full = Make(&shard, root + "/full", 1);
  auto incremental = Make(&shard, root + "/incremental", 1000);
  SnapshotAndWait(*incremental, step);  // the chain's full snapshot
  std::mt19937_64 rng(1);
  std::map<std::string, std::vector<double>> seen;
  for (int round = 0; round < rounds; ++round) {
    for (double fraction : {0.01, 0.10}) {
      std::vector<uint64_t> keys;
      std::sample(all.begin(), all.end(), std::back_inserter(keys),
                  static_cast<size_t>(rows * fraction), rng);
      Push(table, ++step, keys);
      const std::string at = absl::StrCat(static_cast<int>(fraction * 100), "pct");
      Taken f, i;
      if (round % 2 == 0) {
        f = SnapshotAndWait(*full, step);
        i = SnapshotAndWait(*incremental, step);
      } else {
        i = SnapshotAndWait(*incremental, step);
        f = SnapshotAndWait(*full, step);
      }
      seen["full_bytes"].push_back(f.bytes);
      seen["full_seconds"].push_back(f.seconds);
      seen[at + "_bytes"].push_back(i.bytes);
      seen[at + "_seconds"].push_back(i.seconds);
      seen[at + "_bytes_ratio"].push_back(static_cast<double>(i.bytes) / f.bytes);
      seen[at + "_seconds_ratio"].push_back(i.seconds / f.seconds);
      std::fprintf(
          stderr,
          "round %d, %s of the rows: full %.1f MB in %.3f s, incremental %.1f MB in %.3f s\n",
          round + 1, at.c_str(), f.bytes / 1e6, f.seconds, i.bytes / 1e6, i.seconds);
    }
  }
  std::filesystem::remove_all(root);
  std::printf("{\"rows\": %llu, \"dim\": %u, \"rounds\": %d", static_cast<unsigned long long>(rows),
              kDim, rounds);
  for (auto& [name, values] : seen)
    std::printf(", \"%s\": %.6g", name.c_str(), bench::Median(values));
  std::printf("}\n");
  return 0;
}

}  // namespace
}  // namespace pscluster::ps

int main(int argc, char** argv) {
  const uint64_t rows = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string dir = argc > 3 ? argv[3] : "/var/tmp";
  return pscluster::ps::Main(rows, rounds, dir);
}
