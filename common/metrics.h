// Prometheus metrics of one process (ps_server, ps_coordinator, ps_worker), served over HTTP
// at /metrics by prometheus-cpp's pull exposer.
//
// Two kinds of metric: those a hot path updates (RPC counts and latencies: prometheus-cpp's
// atomic counters and histograms, kept in the registry), and those read from state the
// process keeps anyway (table sizes, clocks, members) by collectors that run only when
// Prometheus scrapes, so they cost nothing between scrapes.
//
// Names follow Prometheus' conventions: pscluster_ prefix, base units (seconds, bytes),
// _total counters, and labels of bounded cardinality (method, code, table, member; never a
// step or a key).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace pscluster {

using MetricLabels = std::map<std::string, std::string>;

// Metric families built at scrape time by a collector: each call adds one sample to the
// family `name`, created by its first sample (with that sample's help and type).
class MetricFamilies {
 public:
  void Counter(const std::string& name, const std::string& help, const MetricLabels& labels,
               double value);
  void Gauge(const std::string& name, const std::string& help, const MetricLabels& labels,
             double value);
  // A summary without quantiles: how many observations and their sum.
  void Summary(const std::string& name, const std::string& help, const MetricLabels& labels,
               uint64_t count, double sum);
  std::vector<prometheus::MetricFamily> Take() { return std::move(families_); }

 private:
  prometheus::ClientMetric& Add(const std::string& name, const std::string& help,
                                prometheus::MetricType type, const MetricLabels& labels);
  std::vector<prometheus::MetricFamily> families_;
};

// RPCs a server handled, by service, method and status code, with a latency histogram
// (pscluster_rpc_server_handled_total, pscluster_rpc_server_handling_seconds).
class RpcMetrics {
 public:
  explicit RpcMetrics(prometheus::Registry* registry);
  // An interceptor factory for grpc::ServerBuilder (parse_errors.h's NameUnparsableRequests
  // takes it), recording every RPC when its status is sent.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Interceptor();
  // `method` as gRPC names it: "/package.Service/Method".
  void Record(const std::string& method, grpc::StatusCode code, double seconds);

 private:
  struct Method {
    prometheus::Histogram* latency;
    MetricLabels labels;
    prometheus::Counter* codes[17] = {};  // by grpc::StatusCode, added when first seen
  };
  Method* Find(const std::string& method);

  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>& latency_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Method>> methods_ ABSL_GUARDED_BY(mu_);
};

class Metrics {
 public:
  // Serves /metrics on host:port (port 0: one the kernel picks). `process` (ps_server,
  // ps_worker, ps_coordinator) and `id` go into pscluster_info{process, role, id, version},
  // role in the coordinator's words (shard, worker, coordinator), so one vocabulary joins
  // every family's role label; id: the shard id or worker rank, "" for the coordinator.
  // UNAVAILABLE when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Serve(const std::string& host, int port,
                                                        const std::string& process,
                                                        const std::string& id);
  ~Metrics();

  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }
  RpcMetrics& rpcs() { return *rpcs_; }

  // Runs `collect` at every scrape (from the exposer's threads: it must be thread-safe and
  // must outlive this object's serving, i.e. be removed by destroying this object first).
  void AddCollector(std::function<void(MetricFamilies*)> collect);

 private:
  class Collectors;
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Collectors> collectors_;
  std::unique_ptr<RpcMetrics> rpcs_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // last: stops serving first
  int port_ = 0;
};

// This build's version (the repository's VERSION file).
const char* PsclusterVersion();

}  // namespace pscluster
