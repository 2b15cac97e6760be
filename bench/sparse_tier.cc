// The disk tier of sparse tables (issue 46) against the same table all in RAM, in the same
// run: two in-process clusters of --shards shards each hold --rows rows of dim 16 with
// Adagrad, one with every row in RAM, one with a RAM budget of --memory_fraction of its
// rows (ps_server --sparse_memory_bytes) and the rest in RocksDB under --dir. Then rounds
// that alternate between them: --steps steps each of a 4096-id pull and the push of its
// gradients, ids drawn log-uniformly over the rows (Zipf with exponent 1: a few hot, most
// cold). One JSON line per cluster: fill and training rows/s, the pull's p50/p99 latency
// (medians over rounds), the RAM tier's hit rate, rows on disk, disk and RAM bytes.
//
//   bazel run -c opt //bench:sparse_tier -- --rows=20000000 --dir=/var/tmp/tier
//   ... --rows=200000000 --memory_fraction=0.1 --baseline=false   (more than this machine's RAM)
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/median.h"
#include "client/ps/ps_client.h"
#include "common/sharding.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service/shard_services.h"
#include "server/ps/table/disk_tier.h"

ABSL_FLAG(uint64_t, rows, 20'000'000, "Rows in the table (all shards).");
ABSL_FLAG(uint32_t, shards, 2, "Shards per cluster.");
ABSL_FLAG(double, memory_fraction, 0.25, "The tiered cluster's RAM budget, as rows' share.");
ABSL_FLAG(int, rounds, 5, "Alternating rounds (medians).");
ABSL_FLAG(int, steps, 100, "Pull-and-push steps per round.");
ABSL_FLAG(bool, baseline, true,
          "Also run the all-RAM cluster (false: the tiered one only, for tables larger than RAM).");
ABSL_FLAG(std::string, dir, "/var/tmp/pscluster_sparse_tier", "The disk tier's root.");

namespace pscluster::bench {
namespace {

constexpr uint32_t kDim = 16;
constexpr size_t kBatch = 4096;
constexpr size_t kFillBatch = 65536;

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "sparse_tier: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

struct Cluster {
  std::string name;
  std::vector<std::unique_ptr<ps::DiskTier>> tiers;
  std::vector<std::unique_ptr<ps::Shard>> shards;
  std::vector<std::unique_ptr<ps::ShardServices>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::unique_ptr<PsClient> client;
  double fill_rows_per_s = 0;
  int64_t step = 0;
  std::vector<double> p50, p99, rows_per_s;
};

ps::TableSpec Spec() {
  ps::TableSpec spec;
  spec.set_table_id(1);
  spec.set_kind(ps::TableSpec::SPARSE);
  spec.set_dim(kDim);
  spec.mutable_optimizer()->set_kind(ps::OptimizerConfig::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  return spec;
}

std::unique_ptr<Cluster> Start(const std::string& name, uint64_t memory_bytes) {
  auto c = std::make_unique<Cluster>();
  c->name = name;
  PsClientOptions o;
  const uint32_t n = absl::GetFlag(FLAGS_shards);
  for (uint32_t s = 0; s < n; ++s) {
    ps::ShardOptions so;
    so.shard_id = s;
    so.num_shards = n;
    if (memory_bytes > 0) {
      const std::string dir = absl::StrCat(absl::GetFlag(FLAGS_dir), "/shard-", s);
      auto tier = ps::DiskTier::Open({dir, memory_bytes, uint64_t{1} << 30});
      Check(tier.status(), "opening the disk tier");
      c->tiers.push_back(*std::move(tier));
      so.disk_tier = c->tiers.back().get();
    }
    c->shards.push_back(std::make_unique<ps::Shard>(so));
    c->services.push_back(
        std::make_unique<ps::ShardServices>(c->shards.back().get(), nullptr, ps::ServiceOptions()));
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.SetMaxReceiveMessageSize(64 << 20);
    c->services.back()->RegisterWith(&b);
    c->servers.push_back(b.BuildAndStart());
    o.shard_addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  c->client = *PsClient::Create(o);
  Check(c->client->RegisterWorker(), "registering");
  Check(c->client->CreateTable(Spec()), "creating the table");
  return c;
}

// Every row stored, in pushes of kFillBatch new ids.
void Fill(Cluster* c, uint64_t rows) {
  std::vector<uint64_t> keys;
  std::vector<float> grads(kFillBatch * kDim, 0.1f);
  const absl::Time t0 = absl::Now();
  for (uint64_t r = 0; r < rows; r += kFillBatch) {
    keys.clear();
    for (uint64_t i = r; i < std::min(rows, r + kFillBatch); ++i) keys.push_back(Mix64(i));
    Check(
        c->client->PushSparse(1, c->step++, keys, absl::MakeSpan(grads.data(), keys.size() * kDim)),
        "filling");
    if (r % (rows / 10 / kFillBatch * kFillBatch + kFillBatch) == 0) {
      std::fprintf(stderr, "sparse_tier: %s: %llu of %llu rows stored\n", c->name.c_str(),
                   static_cast<unsigned long long>(r), static_cast<unsigned long long>(rows));
    }
  }
  c->fill_rows_per_s = rows / absl::ToDoubleSeconds(absl::Now() - t0);
}

// One round: pulls of kBatch ids drawn log-uniformly over the rows' ranks, each followed
// by the push of its gradients.
void Round(Cluster* c, uint64_t rows, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<uint64_t> keys(kBatch);
  std::vector<float> values(kBatch * kDim), grads(kBatch * kDim, 0.01f);
  std::vector<double> ms;
  const absl::Time t0 = absl::Now();
  for (int s = 0; s < steps; ++s) {
    for (uint64_t& k : keys)
      k = Mix64(static_cast<uint64_t>(std::exp(u(rng) * std::log(rows))) - 1);
    const absl::Time p = absl::Now();
    Check(c->client->PullSparse(1, c->step, keys, absl::MakeSpan(values)), "pulling");
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - p));
    Check(c->client->PushSparse(1, c->step++, keys, grads), "pushing");
  }
  c->rows_per_s.push_back(steps * kBatch / absl::ToDoubleSeconds(absl::Now() - t0));
  std::sort(ms.begin(), ms.end());
  c->p50.push_back(ms[ms.size() / 2]);
  c->p99.push_back(ms[std::min(ms.size() - 1, ms.size() * 99 / 100)]);
}

void Report(const Cluster& c, uint64_t rows, uint64_t memory_bytes) {
  auto stats = c.client->Stats();
  Check(stats.status(), "stats");
  uint64_t on_disk = 0, disk_bytes = 0, ram_bytes = 0, hits = 0, reads = 0;
  for (const ps::StatsResponse& s : *stats) {
    for (const ps::TableStats& t : s.tables()) {
      on_disk += t.rows_on_disk(), disk_bytes += t.disk_bytes(), ram_bytes += t.memory_bytes();
      hits += t.ram_hits(), reads += t.disk_reads();
    }
  }
  std::printf(
      "{\"cluster\": \"%s\", \"rows\": %llu, \"dim\": %u, \"shards\": %u, "
      "\"sparse_memory_bytes\": %llu, \"fill_rows_per_s\": %.4g, \"train_rows_per_s\": %.4g, "
      "\"pull_p50_ms\": %.3f, \"pull_p99_ms\": %.3f, \"ram_hit_rate\": %.4f, \"rows_on_disk\": "
      "%llu, \"disk_bytes\": %llu, \"ram_row_bytes\": %llu}\n",
      c.name.c_str(), static_cast<unsigned long long>(rows), kDim, absl::GetFlag(FLAGS_shards),
      static_cast<unsigned long long>(memory_bytes), c.fill_rows_per_s, Median(c.rows_per_s),
      Median(c.p50), Median(c.p99), reads + hits == 0 ? 1.0 : double(hits) / (hits + reads),
      static_cast<unsigned long long>(on_disk), static_cast<unsigned long long>(disk_bytes),
      static_cast<unsigned long long>(ram_bytes));
  std::fflush(stdout);
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  using namespace pscluster::bench;
  absl::ParseCommandLine(argc, argv);
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint32_t shards = absl::GetFlag(FLAGS_shards);
  // A row's RAM charge: 16 values and 16 Adagrad slots, key, count, index, step.
  const uint64_t row_bytes = pscluster::ps::SparseTable::RowBytes(Spec(), 1) + 8;
  const uint64_t memory =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_memory_fraction) * rows / shards * row_bytes);
  const bool baseline = absl::GetFlag(FLAGS_baseline);
  auto ram = baseline ? Start("ram", 0) : nullptr;
  auto tier = Start("disk_tier", memory);
  if (ram) Fill(ram.get(), rows);
  Fill(tier.get(), rows);
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    if (ram) Round(ram.get(), rows, absl::GetFlag(FLAGS_steps), r);
    Round(tier.get(), rows, absl::GetFlag(FLAGS_steps), r);
  }
  if (ram) Report(*ram, rows, 0);
  Report(*tier, rows, memory);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  std::fprintf(stderr, "sparse_tier: peak RSS of both clusters %.2f GiB\n",
               ru.ru_maxrss / 1048576.0);
  for (auto* c : {ram.get(), tier.get()}) {
    if (c == nullptr) continue;
    for (auto& s : c->servers) s->Shutdown();
  }
  return 0;
}
