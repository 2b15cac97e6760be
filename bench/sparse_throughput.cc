// Sparse pull and push throughput (issue 46) against raw gRPC moving the same bytes in the
// same run: 1 and 2 shards, 1k to 1M ids a call, rows of dim 16 (SGD, ASP), every row in
// RAM. PS calls and the raw ones alternate, medians of --reps rounds after 2 warm-ups.
//
//   bazel run -c opt //bench:sparse_throughput -- --reps=5 [--ids=1000,...] [--shards=1,2]
//
// The ceiling (grpc_ceiling.h): a stream of the same bytes in messages as large (4 MiB) to each
// shard's raw server, split as the ids split, with no table work. For a push that is the
// ids and the gradients; for a pull, the rows coming back (the ids going up are left out:
// a slightly higher ceiling). Beside it, the physical ceiling: the same bytes over plain
// loopback TCP sockets (tcp_ceiling.h). The client is the real PsClient; one JSON line per
// figure.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/grpc_ceiling.h"
#include "bench/median.h"
#include "bench/tcp_ceiling.h"
#include "client/ps/ps_client.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service/shard_services.h"

ABSL_FLAG(int, reps, 5, "Timed rounds per figure (medians), after 2 warm-ups.");
ABSL_FLAG(std::vector<std::string>, ids,
          std::vector<std::string>({"1000", "16000", "65536", "262144", "1048576"}),
          "Ids per call.");
ABSL_FLAG(std::vector<std::string>, shards, std::vector<std::string>({"1", "2"}), "Shard counts.");

namespace pscluster::bench {
namespace {

constexpr uint32_t kDim = 16;
// The shards' default --max_chunk_bytes: the most a sparse message carries, PS and raw.
constexpr uint64_t kChunk = uint64_t{4} << 20;

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "sparse_throughput: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

struct Cluster {
  std::vector<std::unique_ptr<ps::Shard>> shards;
  std::vector<std::unique_ptr<ps::ShardServices>> services;
  std::vector<std::unique_ptr<RawService>> raws;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<std::string> ps_addresses, raw_addresses;
};

// A server on a free loopback port with what `add` registers; its address in *address.
std::unique_ptr<grpc::Server> Serve(const std::function<void(grpc::ServerBuilder*)>& add,
                                    std::string* address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxReceiveMessageSize(64 << 20);
  b.SetMaxSendMessageSize(64 << 20);
  add(&b);
  auto server = b.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

Cluster Start(uint32_t n) {
  Cluster c;
  for (uint32_t s = 0; s < n; ++s) {
    ps::ShardOptions so;
    so.shard_id = s;
    so.num_shards = n;
    c.shards.push_back(std::make_unique<ps::Shard>(so));
    c.services.push_back(
        std::make_unique<ps::ShardServices>(c.shards.back().get(), nullptr, ps::ServiceOptions()));
    ps::ShardServices* services = c.services.back().get();
    c.ps_addresses.emplace_back();
    c.servers.push_back(Serve([services](grpc::ServerBuilder* b) { services->RegisterWith(b); },
                              &c.ps_addresses.back()));
    c.raws.push_back(std::make_unique<RawService>(kChunk));
    RawService* raw = c.raws.back().get();
    c.raw_addresses.emplace_back();
    c.servers.push_back(
        Serve([raw](grpc::ServerBuilder* b) { b->RegisterService(raw); }, &c.raw_addresses.back()));
  }
  return c;
}

std::unique_ptr<PsClient> Connect(const Cluster& c) {
  PsClientOptions o;
  o.shard_addresses = c.ps_addresses;
  auto client = *PsClient::Create(o);
  ps::TableSpec spec;
  spec.set_table_id(1);
  spec.set_kind(ps::TableSpec::SPARSE);
  spec.set_dim(kDim);
  spec.mutable_optimizer()->set_learning_rate(1e-6f);
  spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(ps::InitializerConfig::ZEROS);
  Check(client->RegisterWorker(), "registering");
  Check(client->CreateTable(spec), "creating the table");
  return client;
}

template <typename Fn>
double Seconds(Fn fn) {
  const absl::Time t0 = absl::Now();
  fn();
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

void Measure(uint32_t shards, uint64_t ids, int reps) {
  Cluster cluster = Start(shards);
  auto client = Connect(cluster);
  RawClient raw(cluster.raw_addresses, kChunk);
  std::vector<std::unique_ptr<TcpServer>> tcp_servers;  // the physical ceiling
  for (uint32_t s = 0; s < shards; ++s) tcp_servers.push_back(std::make_unique<TcpServer>());
  TcpClient tcp(tcp_servers);
  std::vector<uint64_t> keys(ids);
  for (uint64_t i = 0; i < ids; ++i) keys[i] = i * 2654435761u;  // spread over the shards
  std::vector<float> grads(ids * kDim, 0.5f), rows(ids * kDim);
  // The raw calls move as many floats: ids + gradients up for a push, the rows down.
  std::vector<float> raw_push(ids * (kDim + 2), 1.0f), raw_pull(ids * kDim);
  Check(client->PushSparse(1, 0, keys, grads), "first push");  // every row stored
  std::vector<double> push, pull, push_ratio, pull_ratio, push_tcp, pull_tcp;
  for (int i = 0; i < reps + 2; ++i) {
    const double a = Seconds([&] { Check(client->PushSparse(1, i + 1, keys, grads), "push"); });
    const double b = Seconds([&] { raw.Push(raw_push); });
    const double c =
        Seconds([&] { Check(client->PullSparse(1, i + 1, keys, absl::MakeSpan(rows)), "pull"); });
    const double d = Seconds([&] { raw.Pull(&raw_pull); });
    const double e = Seconds([&] { tcp.Push(raw_push); });
    const double f = Seconds([&] { tcp.Pull(&raw_pull); });
    if (i < 2) continue;
    push.push_back(a), pull.push_back(c), push_ratio.push_back(b / a), pull_ratio.push_back(d / c);
    push_tcp.push_back(e / a), pull_tcp.push_back(f / c);
  }
  if (rows.front() >= 0.0f || rows.back() != rows.front()) std::abort();  // SGD moved them alike
  const double push_s = Median(push), pull_s = Median(pull);
  std::printf(
      "{\"shards\": %u, \"ids\": %llu, \"dim\": %u, \"push_rows_per_s\": %.4g, \"push_gbps\": "
      "%.4g, "
      "\"push_to_raw_grpc\": %.3f, \"pull_rows_per_s\": %.4g, \"pull_gbps\": %.4g, "
      "\"pull_to_raw_grpc\": %.3f, \"push_to_tcp\": %.3f, \"pull_to_tcp\": %.3f}\n",
      shards, static_cast<unsigned long long>(ids), kDim, ids / push_s,
      ids * (kDim * 4 + 8) / push_s / 1e9, Median(push_ratio), ids / pull_s,
      ids * kDim * 4 / pull_s / 1e9, Median(pull_ratio), Median(push_tcp), Median(pull_tcp));
  std::fflush(stdout);
  for (auto& s : cluster.servers) s->Shutdown();
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  for (const std::string& s : absl::GetFlag(FLAGS_shards)) {
    for (const std::string& n : absl::GetFlag(FLAGS_ids)) {
      uint32_t shards = 0;
      uint64_t ids = 0;
      if (!absl::SimpleAtoi(s, &shards) || !absl::SimpleAtoi(n, &ids) || shards == 0 || ids == 0) {
        std::fprintf(stderr, "sparse_throughput: --shards and --ids take positive numbers\n");
        return 2;
      }
      pscluster::bench::Measure(shards, ids, absl::GetFlag(FLAGS_reps));
    }
  }
  return 0;
}
