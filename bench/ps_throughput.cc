// Push and pull goodput of the parameter server against three ceilings measured in the
// same run: a raw gRPC stream of the same bytes in the same chunks with no table work
// (what gRPC itself allows), the same bytes over plain loopback TCP sockets (tcp_ceiling.h:
// what a request and its answer cost with no RPC system), and iperf3's one-stream
// loopback bandwidth (what the kernel moves, no request/answer turn at all), measured
// before each figure. PS, raw gRPC and raw TCP calls are interleaved.
//
//   bazel run -c opt //bench:ps_throughput -- --reps=7 --json=/tmp/ps_throughput.json
//
// Shards and the ceiling servers run in this process, each shard its own grpc::Server on
// loopback TCP; the client is the real PsClient. Goodput = tensor bytes / wall time of one
// call.
// --metrics: each shard also counts its RPCs (the interceptor ps_server installs with
// --metrics_port) and serves /metrics, scraped over HTTP every --scrape_ms as Prometheus
// would: run with and without it to see what metrics cost (bench/metrics_cost.sh).
// --ab=metrics|tls: instead of the ceilings, goodput with that on over goodput without, two
// clusters in this process, interleaved. tls: the shards serve TLS and check the tokens of
// --tls_dir (deploy/make_certs.sh), the client speaks TLS with the admin token
// (bench/tls_cost.sh).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/grpc_ceiling.h"
#include "bench/iperf3_ceiling.h"
#include "bench/raw.grpc.pb.h"
#include "bench/tcp_ceiling.h"
#include "client/ps/ps_client.h"
#include "common/malloc_mode.h"
#include "common/metrics.h"
#include "common/parse_errors.h"
#include "common/security.h"
#include "common/sharding.h"
#include "common/testing/http_get.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service/shard_services.h"
#include "server/ps/shard_metrics.h"

ABSL_FLAG(int, reps, 7, "Timed repetitions per figure (median reported), after 2 warm-ups.");
ABSL_FLAG(uint64_t, chunk_bytes, uint64_t{1} << 20, "Stream chunk size, PS and raw alike.");
ABSL_FLAG(std::string, json, "", "Also write the results as JSON to this file.");
ABSL_FLAG(std::vector<std::string>, sizes_kib,
          std::vector<std::string>({"64", "1024", "16384", "65536"}), "Tensor sizes in KiB.");
ABSL_FLAG(std::vector<std::string>, shards, std::vector<std::string>({"1", "2"}), "Shard counts.");
ABSL_FLAG(bool, metrics, false, "Shards count RPCs and serve /metrics, scraped every --scrape_ms.");
ABSL_FLAG(std::string, ab, "",
          "metrics | tls: instead of the ceilings, goodput with it over goodput without, "
          "interleaved.");
ABSL_FLAG(bool, ab_control, false,
          "With --ab: off on both sides (an A/A run: the measurement's noise).");
ABSL_FLAG(std::string, tls_dir, "",
          "With --ab=tls: deploy/make_certs.sh's output (ca.pem, node.pem, node.key, tokens).");
ABSL_FLAG(int, scrape_ms, 1000, "With --metrics: time between scrapes of each shard.");
ABSL_FLAG(std::string, iperf3, "iperf3",
          "iperf3 to measure loopback TCP with (one stream, 2 s) before each figure; empty: "
          "not measured.");
ABSL_FLAG(int, rounds, 3,
          "Whole sweeps; each figure is the median over rounds of the per-round medians.");

namespace pscluster::bench {
namespace {

using ps::DenseChunk;

// Scrapes every endpoint every `every` until destroyed.
class Scraper {
 public:
  Scraper(std::vector<int> ports, absl::Duration every)
      : thread_([this, ports = std::move(ports), every] {
          while (!stop_.WaitForNotificationWithTimeout(every)) {
            for (int port : ports) testing::HttpGet(port, "/metrics");
          }
        }) {}
  ~Scraper() {
    stop_.Notify();
    thread_.join();
  }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

// Declared in the order they must outlive each other: the servers (whose interceptors use
// the metrics) go first, then the metrics (whose collectors read the shards).
struct Cluster {
  std::vector<std::unique_ptr<ps::Shard>> shards;
  std::vector<std::unique_ptr<ps::ShardServices>> services;
  std::vector<std::unique_ptr<RawService>> raws;
  std::vector<std::unique_ptr<Metrics>> metrics;  // --metrics
  std::unique_ptr<Scraper> scraper;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::vector<std::string> ps_addresses, raw_addresses;
};

// What a cluster of the A/B runs has on: metrics, TLS with tokens (neither: the baseline).
struct Treatment {
  bool metrics = false;
  const Security* server_tls = nullptr;  // the shards' credentials; null: plaintext
  Security client_tls;                   // the client's
};

// {server, client} security from --tls_dir: the shards check both tokens, the client holds
// the admin token (it creates the table).
std::pair<Security, Security> TlsFromDir() {
  const std::string dir = absl::GetFlag(FLAGS_tls_dir);
  SecurityOptions server{dir + "/node.pem",      dir + "/node.key",   dir + "/ca.pem", false, "",
                         dir + "/cluster.token", dir + "/admin.token"};
  SecurityOptions client;
  client.tls_ca = dir + "/ca.pem";
  client.admin_token_file = dir + "/admin.token";
  absl::StatusOr<Security> s = Security::Load(server), c = Security::Load(client);
  if (!s.ok() || !c.ok()) {
    std::fprintf(stderr, "ps_throughput: --tls_dir=%s: %s %s (make it with deploy/make_certs.sh)\n",
                 dir.c_str(), s.status().ToString().c_str(), c.status().ToString().c_str());
    std::exit(2);
  }
  return {*std::move(s), *std::move(c)};
}

// `as_ps_server`: with the interceptors ps_server installs (the parse-error one, and with
// `metrics` the RPC counter); the raw ceiling has none. `tls`: ps_server's credentials.
std::unique_ptr<grpc::Server> Serve(const std::function<void(grpc::ServerBuilder*)>& add,
                                    std::string* address, bool as_ps_server,
                                    Metrics* metrics = nullptr, const Security* tls = nullptr) {
  grpc::ServerBuilder b;
  if (as_ps_server) NameUnparsableRequests(&b, metrics ? metrics->rpcs().Interceptor() : nullptr);
  int port = 0;
  b.AddListeningPort(
      "127.0.0.1:0",
      tls ? *tls->ServerCredentials(AdminMethods("pscluster.ps.ShardAdmin", {"CreateTable"}))
          : grpc::InsecureServerCredentials(),
      &port);
  b.SetMaxReceiveMessageSize(64 << 20);
  b.SetMaxSendMessageSize(64 << 20);
  add(&b);
  auto server = b.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

Cluster StartCluster(uint32_t num_shards, const Treatment& treatment = {}) {
  Cluster c;
  for (uint32_t s = 0; s < num_shards; ++s) {
    ps::ShardOptions so;
    so.shard_id = s;
    so.num_shards = num_shards;
    c.shards.push_back(std::make_unique<ps::Shard>(so));
    ps::ServiceOptions vo;
    vo.max_chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
    c.services.push_back(std::make_unique<ps::ShardServices>(c.shards.back().get(), nullptr, vo));
    c.raws.push_back(std::make_unique<RawService>(absl::GetFlag(FLAGS_chunk_bytes)));
    c.ps_addresses.emplace_back();
    c.raw_addresses.emplace_back();
    Metrics* metrics = nullptr;
    if (treatment.metrics) {
      auto served = Metrics::Serve("127.0.0.1", 0, "ps_server", absl::StrCat(s));
      if (!served.ok()) {
        std::fprintf(stderr, "ps_throughput: %s\n", served.status().ToString().c_str());
        std::exit(1);
      }
      c.metrics.push_back(*std::move(served));
      metrics = c.metrics.back().get();
      ps::AddShardMetrics(c.shards.back().get(), nullptr, metrics);
    }
    ps::ShardServices* services = c.services.back().get();
    c.servers.push_back(Serve([services](grpc::ServerBuilder* b) { services->RegisterWith(b); },
                              &c.ps_addresses.back(), true, metrics, treatment.server_tls));
    RawService* raw = c.raws.back().get();
    c.servers.push_back(Serve([raw](grpc::ServerBuilder* b) { b->RegisterService(raw); },
                              &c.raw_addresses.back(), false));
  }
  if (!c.metrics.empty()) {
    std::vector<int> ports;
    for (const auto& m : c.metrics) ports.push_back(m->port());
    c.scraper =
        std::make_unique<Scraper>(ports, absl::Milliseconds(absl::GetFlag(FLAGS_scrape_ms)));
  }
  return c;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Fn>
double Seconds(Fn fn) {
  absl::Time t0 = absl::Now();
  fn();
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

struct Result {
  uint32_t shards;
  uint64_t bytes;
  double push_gbps, raw_push_gbps, pull_gbps, raw_pull_gbps, tcp_push_gbps, tcp_pull_gbps,
      iperf3_gbps;
  double push_ratio = 0, pull_ratio = 0;                // to raw gRPC: medians of per-round ratios
  double push_tcp_ratio = 0, pull_tcp_ratio = 0;        // to raw TCP
  double push_iperf3_ratio = 0, pull_iperf3_ratio = 0;  // to iperf3
};

// A client of `cluster` with table 1 (`bytes` of float32, SGD, ASP) created.
std::unique_ptr<PsClient> ConnectWithTable(const Cluster& cluster, uint64_t bytes,
                                           const Security& security = Security()) {
  PsClientOptions o;
  o.shard_addresses = cluster.ps_addresses;
  o.security = security;
  o.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  auto client = *PsClient::Create(o);
  if (!client->RegisterWorker().ok()) std::abort();
  ps::TableSpec spec;
  spec.set_table_id(1);
  spec.set_size(bytes / sizeof(float));
  spec.mutable_optimizer()->set_learning_rate(1e-6f);  // SGD: the push really updates
  spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(ps::InitializerConfig::ZEROS);
  if (absl::Status s = client->CreateTable(spec); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::abort();
  }
  return client;
}

Result Measure(uint32_t num_shards, uint64_t bytes, int reps) {
  Treatment metrics;
  metrics.metrics = absl::GetFlag(FLAGS_metrics);
  Cluster cluster = StartCluster(num_shards, metrics);
  auto client = ConnectWithTable(cluster, bytes);
  RawClient raw(cluster.raw_addresses, absl::GetFlag(FLAGS_chunk_bytes));
  std::vector<std::unique_ptr<TcpServer>> tcp_servers;
  for (uint32_t s = 0; s < num_shards; ++s) tcp_servers.push_back(std::make_unique<TcpServer>());
  TcpClient tcp(tcp_servers);
  const size_t n = bytes / sizeof(float);
  std::vector<float> grad(n, 0.5f), out(n), raw_out(n), tcp_out(n);
  std::vector<double> push, raw_push, pull, raw_pull, tcp_push, tcp_pull;
  for (int i = 0; i < reps + 2; ++i) {  // interleaved: PS, raw gRPC, TCP, PS ...
    double a = Seconds([&] {
      if (!client->PushDense(1, i, grad).ok()) std::abort();
    });
    double b = Seconds([&] { raw.Push(grad); });
    double c = Seconds([&] {
      if (!client->PullDense(1, i, absl::MakeSpan(out)).ok()) std::abort();
    });
    double d = Seconds([&] { raw.Pull(&raw_out); });
    double e = Seconds([&] { tcp.Push(grad); });
    double f = Seconds([&] { tcp.Pull(&tcp_out); });
    if (i < 2) continue;  // warm-up
    push.push_back(a), raw_push.push_back(b), pull.push_back(c), raw_pull.push_back(d);
    tcp_push.push_back(e), tcp_pull.push_back(f);
  }
  // Correctness: every value took the same SGD steps, and the raw pull moved the bytes.
  for (float v : out) {
    if (v != out[0] || !(v < 0.0f)) {
      std::fprintf(stderr, "pulled values disagree: %g vs %g\n", v, out[0]);
      std::abort();
    }
  }
  if (raw_out.front() != 1.0f || raw_out.back() != 1.0f) std::abort();
  if (tcp_out.front() == 0.0f || tcp_out.back() == 0.0f) std::abort();
  auto gbps = [&](const std::vector<double>& t) { return bytes / Median(t) / 1e9; };
  Result r{num_shards,     bytes,          gbps(push),
           gbps(raw_push), gbps(pull),     gbps(raw_pull),
           gbps(tcp_push), gbps(tcp_pull), Iperf3Gbps(absl::GetFlag(FLAGS_iperf3))};
  for (auto& s : cluster.servers) s->Shutdown();
  return r;
}

// --ab: goodput with `treatment` (metrics: interceptor, collectors, a scrape a second; or
// TLS with tokens) over goodput without, both clusters in this process and their calls
// interleaved (in alternating order), so noise hits both alike. The cluster started second
// is slower here at 64 KiB (an A/A run, --ab_control, shows it), so `on_first` alternates
// which one starts first. {push ratio, pull ratio}.
std::pair<double, double> MeasureAbCost(uint32_t num_shards, uint64_t bytes, int reps,
                                        bool on_first, const Treatment& treatment) {
  const Treatment none;
  const Treatment& with = absl::GetFlag(FLAGS_ab_control) ? none : treatment;
  Cluster first = StartCluster(num_shards, on_first ? with : none);
  Cluster second = StartCluster(num_shards, on_first ? none : with);
  Cluster& on = on_first ? first : second;
  Cluster& off = on_first ? second : first;
  auto plain = ConnectWithTable(off, bytes), counted = ConnectWithTable(on, bytes, with.client_tls);
  std::vector<float> grad(bytes / sizeof(float), 0.5f), out(grad.size());
  std::vector<double> push_off, push_on, pull_off, pull_on;
  for (int i = 0; i < reps + 2; ++i) {
    auto push = [&](PsClient* c) {
      return Seconds([&] {
        if (!c->PushDense(1, i, grad).ok()) std::abort();
      });
    };
    auto pull = [&](PsClient* c) {
      return Seconds([&] {
        if (!c->PullDense(1, i, absl::MakeSpan(out)).ok()) std::abort();
      });
    };
    // {without, with} metrics, the one with metrics first on odd calls.
    auto both = [&](auto op) {
      if (i % 2 == 0) {
        const double off_s = op(plain.get());
        return std::pair(off_s, op(counted.get()));
      }
      const double on_s = op(counted.get());
      return std::pair(op(plain.get()), on_s);
    };
    const auto [push_off_s, push_on_s] = both(push);
    const auto [pull_off_s, pull_on_s] = both(pull);
    if (i < 2) continue;  // warm-up
    push_off.push_back(push_off_s), push_on.push_back(push_on_s);
    pull_off.push_back(pull_off_s), pull_on.push_back(pull_on_s);
  }
  for (auto& s : first.servers) s->Shutdown();
  for (auto& s : second.servers) s->Shutdown();
  return {Median(push_off) / Median(push_on), Median(pull_off) / Median(pull_on)};
}

// --ab: one line per size, on/off goodput of push and pull.
int RunAb(const std::string& ab) {
  if (ab != "metrics" && ab != "tls") {
    std::fprintf(stderr, "ps_throughput: --ab=%s: give metrics or tls\n", ab.c_str());
    return 2;
  }
  Treatment treatment;
  std::pair<Security, Security> tls;
  if (ab == "metrics") treatment.metrics = true;
  if (ab == "tls") {
    tls = TlsFromDir();
    treatment.server_tls = &tls.first;
    treatment.client_tls = tls.second;
  }
  std::printf("%-7s %-9s %12s %12s\n", "shards", "tensor", "push on/off", "pull on/off");
  for (const std::string& shards_flag : absl::GetFlag(FLAGS_shards)) {
    for (const std::string& kib_flag : absl::GetFlag(FLAGS_sizes_kib)) {
      const uint32_t shards = std::stoul(shards_flag);
      const uint64_t kib = std::stoull(kib_flag);
      std::vector<double> push, pull;
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        auto [a, b] =
            MeasureAbCost(shards, kib << 10, absl::GetFlag(FLAGS_reps) * (kib <= 1024 ? 5 : 1),
                          round % 2, treatment);
        push.push_back(a), pull.push_back(b);
      }
      std::printf("%-7u %6lu KiB %12.3f %12.3f\n", shards, static_cast<unsigned long>(kib),
                  Median(push), Median(pull));
      std::fflush(stdout);
    }
  }
  return 0;
}

// One size's figures: medians over --rounds of Measure, with the ratios' medians.
Result MeasureSize(uint32_t shards, uint64_t kib) {
  int reps = absl::GetFlag(FLAGS_reps) * (kib <= 1024 ? 5 : 1);
  std::vector<Result> rounds;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    rounds.push_back(Measure(shards, kib << 10, reps));
  }
  auto m = [&](auto field) {
    std::vector<double> v;
    for (const Result& r : rounds) v.push_back(field(r));
    return Median(v);
  };
  Result r{shards,
           kib << 10,
           m([](const Result& r) { return r.push_gbps; }),
           m([](const Result& r) { return r.raw_push_gbps; }),
           m([](const Result& r) { return r.pull_gbps; }),
           m([](const Result& r) { return r.raw_pull_gbps; }),
           m([](const Result& r) { return r.tcp_push_gbps; }),
           m([](const Result& r) { return r.tcp_pull_gbps; }),
           m([](const Result& r) { return r.iperf3_gbps; })};
  r.push_ratio = m([](const Result& r) { return r.push_gbps / r.raw_push_gbps; });
  r.pull_ratio = m([](const Result& r) { return r.pull_gbps / r.raw_pull_gbps; });
  r.push_tcp_ratio = m([](const Result& r) { return r.push_gbps / r.tcp_push_gbps; });
  r.pull_tcp_ratio = m([](const Result& r) { return r.pull_gbps / r.tcp_pull_gbps; });
  if (r.iperf3_gbps > 0) {
    r.push_iperf3_ratio = m([](const Result& r) { return r.push_gbps / r.iperf3_gbps; });
    r.pull_iperf3_ratio = m([](const Result& r) { return r.pull_gbps / r.iperf3_gbps; });
  }
  return r;
}

void WriteJson(const std::string& path, const std::vector<Result>& results) {
  std::ofstream f(path);
  f << "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    f << absl::StrCat(
        "  {\"shards\": ", r.shards, ", \"bytes\": ", r.bytes, ", \"push_gbps\": ", r.push_gbps,
        ", \"raw_push_gbps\": ", r.raw_push_gbps, ", \"push_ratio\": ", r.push_ratio,
        ", \"pull_gbps\": ", r.pull_gbps, ", \"raw_pull_gbps\": ", r.raw_pull_gbps,
        ", \"pull_ratio\": ", r.pull_ratio, ", \"tcp_push_gbps\": ", r.tcp_push_gbps,
        ", \"tcp_pull_gbps\": ", r.tcp_pull_gbps, ", \"iperf3_gbps\": ", r.iperf3_gbps,
        ", \"push_tcp_ratio\": ", r.push_tcp_ratio, ", \"pull_tcp_ratio\": ", r.pull_tcp_ratio,
        ", \"push_iperf3_ratio\": ", r.push_iperf3_ratio,
        ", \"pull_iperf3_ratio\": ", r.pull_iperf3_ratio, "}",
        i + 1 < results.size() ? ",\n" : "\n");
  }
  f << "]\n";
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The shards run in this process: ps_server's malloc settings (without them every large
  // message here, the ceilings' too, landed in fresh pages; ps_server does not do that).
  pscluster::ShardMallocMode();
  using pscluster::bench::Result;
  const std::string ab = absl::GetFlag(FLAGS_ab);
  if (!ab.empty()) return pscluster::bench::RunAb(ab);
  std::vector<Result> results;
  std::printf("goodput GB/s; ratios are medians of per-round ratios (PS over the ceiling)\n");
  std::printf("%-6s %-9s | %7s %7s %7s %7s | %7s %7s %7s | %6s %6s %6s | %6s %6s %6s\n", "shards",
              "tensor", "iperf3", "push", "grpc", "tcp", "pull", "grpc", "tcp", "/grpc", "/tcp",
              "/iperf", "/grpc", "/tcp", "/iperf");
  for (const std::string& shards_flag : absl::GetFlag(FLAGS_shards)) {
    for (const std::string& kib_flag : absl::GetFlag(FLAGS_sizes_kib)) {
      const uint32_t shards = std::stoul(shards_flag);
      const uint64_t kib = std::stoull(kib_flag);
      const Result r = pscluster::bench::MeasureSize(shards, kib);
      std::printf(
          "%-6u %5lu KiB | %7.3f %7.3f %7.3f %7.3f | %7.3f %7.3f %7.3f | %6.2f %6.2f %6.2f | "
          "%6.2f %6.2f %6.2f\n",
          shards, static_cast<unsigned long>(kib), r.iperf3_gbps, r.push_gbps, r.raw_push_gbps,
          r.tcp_push_gbps, r.pull_gbps, r.raw_pull_gbps, r.tcp_pull_gbps, r.push_ratio,
          r.push_tcp_ratio, r.push_iperf3_ratio, r.pull_ratio, r.pull_tcp_ratio,
          r.pull_iperf3_ratio);
      std::fflush(stdout);
      results.push_back(r);
    }
  }
  const std::string path = absl::GetFlag(FLAGS_json);
  if (!path.empty()) pscluster::bench::WriteJson(path, results);
  return 0;
}
