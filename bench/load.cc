// Load: --clients concurrent clients (each a PsClient of its own, as workers are) mixing
// dense pulls, dense pushes, sparse lookups and sparse updates against 2 real ps_server
// processes for --seconds, then an exact check that no acknowledged update was lost and
// none was applied twice or in part.
//
//   bazel build -c opt //bench:load //server/ps:ps_server
//   bazel-bin/bench/load --server=bazel-bin/server/ps/ps_server [--clients=256 --seconds=60]
//
// Tables: a dense one (--dense_values float32, SGD lr 1, zeros, ASP) and a sparse one (dim
// --dim, SGD lr 1, zeros, ASP). Every gradient is all ones, so after n applied pushes a
// value is exactly -n (float32 holds integers exactly to 2^24). The mix: 40 % dense pulls,
// 30 % dense pushes, 20 % sparse lookups, 10 % sparse updates of --keys_per_call uniform
// keys out of --key_space. The check: on each shard every dense value equals minus the
// pushes that shard accepted (Stats), which lies between the pushes acknowledged to
// clients and those plus the ones that failed (a push refused on one shard may have been
// applied on the other); every sparse row touched is -n with n between its acknowledged
// and attempted updates. Prints per operation: count, ok, RESOURCE_EXHAUSTED (refused at
// the shards' --threads bound), other errors, and latency p50/p99/max of each outcome;
// overall ops/s and MB/s; each shard's peak RSS (VmHWM).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/proc_status.h"
#include "client/ps/ps_client.h"
#include "tests/subprocess.h"

ABSL_FLAG(std::string, server, "bazel-bin/server/ps/ps_server", "The ps_server binary.");
ABSL_FLAG(int, clients, 256, "Concurrent clients, each with its own channels.");
ABSL_FLAG(int, seconds, 60, "How long the clients run.");
ABSL_FLAG(int, shard_threads, 64, "ps_server --threads: its bound on calls in flight.");
ABSL_FLAG(uint64_t, dense_values, 65536, "Values of the dense table (x4 bytes per push/pull).");
ABSL_FLAG(uint32_t, dim, 8, "Sparse row width.");
ABSL_FLAG(uint64_t, key_space, 1000000, "Sparse keys drawn uniformly from [0, key_space).");
ABSL_FLAG(int, keys_per_call, 16, "Keys per sparse lookup or update.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of every client's operation mix and keys.");

namespace pscluster::bench {
namespace {

constexpr uint32_t kDense = 1, kSparse = 2;
constexpr int kShards = 2;
enum Op { kPullDense, kPushDense, kPullSparse, kPushSparse, kOps };
constexpr const char* kOpNames[kOps] = {"dense pull", "dense push", "sparse lookup",
                                        "sparse update"};
enum Outcome { kOk, kRefused, kError, kOutcomes };

struct ClientLog {
  std::vector<double> ms[kOps][kOutcomes];
  uint64_t bytes = 0;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> key_updates;  // key -> {ok, failed}
  std::map<std::string, uint64_t> errors;                         // message -> count
};

double Percentile(std::vector<double>* v, double p) {
  if (v->empty()) return 0;
  const size_t at = std::min(v->size() - 1, static_cast<size_t>(p * v->size()));
  std::nth_element(v->begin(), v->begin() + at, v->end());
  return (*v)[at];
}

ps::TableSpec Table(uint32_t id, ps::TableSpec::Kind kind) {
  ps::TableSpec t;
  t.set_table_id(id);
  t.set_kind(kind);
  if (kind == ps::TableSpec::DENSE) t.set_size(absl::GetFlag(FLAGS_dense_values));
  if (kind == ps::TableSpec::SPARSE) t.set_dim(absl::GetFlag(FLAGS_dim));
  t.mutable_optimizer()->set_kind(ps::OptimizerConfig::SGD);
  t.mutable_optimizer()->set_learning_rate(1.0f);
  t.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  return t;
}

std::unique_ptr<PsClient> Connect(const std::vector<std::string>& shards, int worker) {
  PsClientOptions o;
  o.shard_addresses = shards;
  o.worker_id = worker;
  o.rpc_timeout = absl::Seconds(30);
  auto c = PsClient::Create(o);
  if (!c.ok() || !(*c)->RegisterWorker().ok()) {
    std::fprintf(stderr, "load: client %d cannot connect\n", worker);
    std::exit(1);
  }
  return *std::move(c);
}

void RunClient(PsClient* c, int id, absl::Time end, ClientLog* log) {
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed) * 7919 + id);
  const uint64_t n = absl::GetFlag(FLAGS_dense_values);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const int k = absl::GetFlag(FLAGS_keys_per_call);
  std::vector<float> dense(n), ones(n, 1.0f), rows(k * dim), row_grads(k * dim, 1.0f);
  std::vector<uint64_t> keys(k);
  std::uniform_int_distribution<uint64_t> key(0, absl::GetFlag(FLAGS_key_space) - 1);
  for (int64_t step = 0; absl::Now() < end; ++step) {
    const int draw = static_cast<int>(rng() % 10);
    const Op op = draw < 4   ? kPullDense
                  : draw < 7 ? kPushDense
                  : draw < 9 ? kPullSparse
                             : kPushSparse;
    if (op == kPullSparse || op == kPushSparse) {
      for (auto& key_i : keys) key_i = key(rng);
    }
    const absl::Time t0 = absl::Now();
    absl::Status s;
    switch (op) {
      case kPullDense:
        s = c->PullDense(kDense, step, absl::MakeSpan(dense));
        break;
      case kPushDense:
        s = c->PushDense(kDense, step, ones);
        break;
      case kPullSparse:
        s = c->PullSparse(kSparse, step, keys, absl::MakeSpan(rows));
        break;
      default:
        s = c->PushSparse(kSparse, step, keys, row_grads);
        break;
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    const Outcome outcome = s.ok()                                             ? kOk
                            : s.code() == absl::StatusCode::kResourceExhausted ? kRefused
                                                                               : kError;
    log->ms[op][outcome].push_back(ms);
    if (outcome != kOk) ++log->errors[std::string(s.message().substr(0, 160))];
    if (s.ok()) log->bytes += op <= kPushDense ? n * 4 : k * dim * 4;
    if (op == kPushSparse) {
      for (uint64_t key_i : keys) {
        auto& [ok, failed] = log->key_updates[key_i];
        (s.ok() ? ok : failed) += 1;
      }
    }
  }
}

// Starts the shards (ps_server --threads=threads each); false once one did not start.
bool StartShards(int threads, std::vector<testing::Subprocess>* servers,
                 std::vector<std::string>* shards) {
  for (int s = 0; s < kShards; ++s) {
    auto p = testing::Subprocess::Start(
        {absl::GetFlag(FLAGS_server), "--port=0", absl::StrCat("--shard_id=", s),
         absl::StrCat("--num_shards=", kShards), absl::StrCat("--threads=", threads)});
    auto line = p.ok() ? p->WaitForLine("listening on", absl::Seconds(60))
                       : absl::StatusOr<std::string>(p.status());
    if (!line.ok()) {
      std::fprintf(stderr, "load: ps_server: %s\n", line.status().ToString().c_str());
      return false;
    }
    shards->push_back(*testing::ListeningAddress(*line));
    servers->push_back(*std::move(p));
  }
  return true;
}

// Runs every client until --seconds pass, sampling the shards' RSS; the wall time.
double RunClients(const std::vector<std::unique_ptr<PsClient>>& clients,
                  const std::vector<testing::Subprocess>& servers, std::vector<ClientLog>* logs,
                  std::vector<Rss>* peak) {
  const int n = static_cast<int>(clients.size());
  const absl::Time start = absl::Now(), end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::atomic<bool> running{true};
  std::thread sampler([&] {  // RSS while the load runs (VmHWM is the peak anyway)
    while (running) {
      for (int s = 0; s < kShards; ++s) {
        (*peak)[s].rss_kib = std::max((*peak)[s].rss_kib, ReadRss(servers[s].pid()).rss_kib);
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  std::vector<std::thread> workers;
  for (int i = 0; i < n; ++i)
    workers.emplace_back(RunClient, clients[i].get(), i, end, &(*logs)[i]);
  for (auto& w : workers) w.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  running = false;
  sampler.join();

  return wall;
}

// Per operation and outcome, over every client; the shards' peak RSS.
void Report(const std::vector<ClientLog>& logs, double wall,
            const std::vector<testing::Subprocess>& servers, const std::vector<Rss>& peak) {
  uint64_t ops = 0, bytes = 0;
  std::printf("%-14s %9s %9s %9s %7s | %8s %8s %8s | %8s %8s\n", "operation", "count", "ok",
              "refused", "errors", "ok p50", "ok p99", "ok max", "ref p50", "ref p99");
  for (int op = 0; op < kOps; ++op) {
    std::vector<double> all[kOutcomes];
    for (const auto& log : logs) {
      for (int o = 0; o < kOutcomes; ++o) {
        all[o].insert(all[o].end(), log.ms[op][o].begin(), log.ms[op][o].end());
      }
    }
    const size_t count = all[kOk].size() + all[kRefused].size() + all[kError].size();
    ops += count;
    const double ok_max =
        all[kOk].empty() ? 0 : *std::max_element(all[kOk].begin(), all[kOk].end());
    std::printf("%-14s %9zu %9zu %9zu %7zu | %8.2f %8.2f %8.1f | %8.2f %8.2f  (ms)\n", kOpNames[op],
                count, all[kOk].size(), all[kRefused].size(), all[kError].size(),
                Percentile(&all[kOk], 0.5), Percentile(&all[kOk], 0.99), ok_max,
                Percentile(&all[kRefused], 0.5), Percentile(&all[kRefused], 0.99));
  }
  std::map<std::string, uint64_t> errors;
  for (const auto& log : logs) {
    bytes += log.bytes;
    for (const auto& [m, c] : log.errors) errors[m] += c;
  }
  for (auto& [m, c] : errors) std::printf("  refused or failed x%" PRIu64 ": %s\n", c, m.c_str());
  std::printf("throughput: %.0f ops/s, %.1f MB/s of tensor data acknowledged\n", ops / wall,
              bytes / wall / 1e6);
  for (int s = 0; s < kShards; ++s) {
    const Rss now = ReadRss(servers[s].pid());
    std::printf("shard %d: peak RSS %.1f MiB (VmHWM), %.1f MiB now\n", s,
                std::max(peak[s].rss_kib, now.hwm_kib) / 1024.0, now.rss_kib / 1024.0);
  }
}

// Every dense value is -(pushes the shard applied), which lie between the pushes
// acknowledged and those attempted.
bool CheckDense(PsClient* admin, const std::vector<ClientLog>& logs) {
  bool exact = true;
  uint64_t dense_ok = 0, dense_failed = 0;
  for (const auto& log : logs) {
    dense_ok += log.ms[kPushDense][kOk].size();
    dense_failed += log.ms[kPushDense][kRefused].size() + log.ms[kPushDense][kError].size();
  }
  auto stats = admin->Stats();
  std::vector<float> dense(absl::GetFlag(FLAGS_dense_values));
  if (!stats.ok() || !admin->PullDense(kDense, 0, absl::MakeSpan(dense)).ok()) {
    std::fprintf(stderr, "load: cannot read the final state\n");
    return false;
  }
  auto dense_info = admin->DescribeTable(kDense);
  for (int s = 0; s < kShards && dense_info.ok(); ++s) {
    uint64_t accepted = 0;
    for (const auto& t : (*stats)[s].tables()) {
      if (t.info().spec().table_id() == kDense) accepted = t.pushes();
    }
    const auto& info = (*dense_info)[s];
    uint64_t torn = 0;
    for (uint64_t i = info.shard_begin(); i < info.shard_end(); ++i) {
      if (dense[i] != -static_cast<float>(accepted)) ++torn;
    }
    const bool in_range = accepted >= dense_ok && accepted <= dense_ok + dense_failed;
    std::printf("dense, shard %d: %" PRIu64 " pushes applied (acknowledged %" PRIu64
                ", failed %" PRIu64 "); values not equal to -applied: %" PRIu64 " %s\n",
                s, accepted, dense_ok, dense_failed, torn, torn == 0 && in_range ? "OK" : "WRONG");
    exact = exact && torn == 0 && in_range;
  }
  exact = exact && dense_info.ok();
  return exact;
}

// Every sparse row updated is -n, with acknowledged <= n <= attempted updates of its key.
bool CheckSparse(PsClient* admin, const std::vector<ClientLog>& logs) {
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> updates;
  for (const auto& log : logs) {
    for (const auto& [key, c] : log.key_updates) {
      updates[key].first += c.first;
      updates[key].second += c.second;
    }
  }
  std::vector<uint64_t> keys;
  for (auto& [key, c] : updates) keys.push_back(key);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  std::vector<float> rows(keys.size() * dim);
  uint64_t wrong_rows = 0;
  for (size_t at = 0; at < keys.size(); at += 10000) {  // well inside a message
    const size_t len = std::min<size_t>(10000, keys.size() - at);
    if (!admin
             ->PullSparse(kSparse, 0, absl::MakeConstSpan(keys).subspan(at, len),
                          absl::MakeSpan(rows).subspan(at * dim, len * dim))
             .ok()) {
      std::fprintf(stderr, "load: cannot read the sparse rows\n");
      return false;
    }
  }
  for (size_t r = 0; r < keys.size(); ++r) {
    const auto [ok, failed] = updates[keys[r]];
    for (uint32_t j = 0; j < dim; ++j) {
      const float v = -rows[r * dim + j];
      if (v != static_cast<float>(static_cast<uint64_t>(v)) || v < ok || v > ok + failed) {
        ++wrong_rows;
        break;
      }
    }
  }
  std::printf("sparse: %zu rows updated; rows not -n with acknowledged <= n <= attempted: %" PRIu64
              " %s\n",
              keys.size(), wrong_rows, wrong_rows == 0 ? "OK" : "WRONG");
  return wrong_rows == 0;
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace pscluster;
  using namespace pscluster::bench;
  const int threads = absl::GetFlag(FLAGS_shard_threads);
  std::vector<testing::Subprocess> servers;
  std::vector<std::string> shards;
  if (!StartShards(threads, &servers, &shards)) return 1;
  auto admin = Connect(shards, 100000);
  if (!admin->CreateTable(Table(kDense, ps::TableSpec::DENSE)).ok() ||
      !admin->CreateTable(Table(kSparse, ps::TableSpec::SPARSE)).ok()) {
    std::fprintf(stderr, "load: cannot create the tables\n");
    return 1;
  }
  const int n = absl::GetFlag(FLAGS_clients);
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int i = 0; i < n; ++i) clients.push_back(Connect(shards, i));
  std::vector<ClientLog> logs(n);
  std::printf("load: %d clients, 2 shards (--threads=%d each), %d s\n", n, threads,
              absl::GetFlag(FLAGS_seconds));
  std::fflush(stdout);
  std::vector<Rss> peak(kShards);
  const double wall = RunClients(clients, servers, &logs, &peak);
  Report(logs, wall, servers, peak);
  const bool dense = CheckDense(admin.get(), logs);
  const bool exact = CheckSparse(admin.get(), logs) && dense;
  std::printf("exact check: %s\n",
              exact ? "PASSED (no acknowledged update lost, none torn)" : "FAILED");
  clients.clear();
  admin.reset();
  for (auto& s : servers) s.Stop(SIGTERM, absl::Seconds(20)).IgnoreError();
  return exact ? 0 : 1;
}
