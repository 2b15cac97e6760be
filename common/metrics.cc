#include "common/metrics.h"

#include <chrono>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/http_server_options.h"
#include "common/process_stats.h"
#include "common/version.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"

namespace pscluster {
namespace {

using grpc::experimental::InterceptionHookPoints;

// Services have a few dozen methods; anything past this many distinct names (which a
// registered service never reaches) is counted under one "other" so labels stay bounded.
constexpr size_t kMaxMethods = 64;

// "/pscluster.ps.ShardData/PullDense" -> {grpc_service, grpc_method}.
MetricLabels MethodLabels(const std::string& method) {
  const size_t slash = method.rfind('/');
  if (method.empty() || method[0] != '/' || slash == 0 || slash == std::string::npos) {
    return {{"grpc_service", "other"}, {"grpc_method", "other"}};
  }
  return {{"grpc_service", method.substr(1, slash - 1)}, {"grpc_method", method.substr(slash + 1)}};
}

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(RpcMetrics* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics), info_(info), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_;
      metrics_->Record(info_->method(), methods->GetSendStatus().error_code(), took.count());
    }
    methods->Proceed();
  }

 private:
  RpcMetrics* const metrics_;
  grpc::experimental::ServerRpcInfo* const info_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(RpcMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(metrics_, info);
  }

 private:
  RpcMetrics* const metrics_;
};

}  // namespace

prometheus::ClientMetric& MetricFamilies::Add(const std::string& name, const std::string& help,
                                              prometheus::MetricType type,
                                              const MetricLabels& labels) {
  prometheus::MetricFamily* family = nullptr;
  for (auto& f : families_) {
    if (f.name == name) family = &f;
  }
  if (family == nullptr) {
    families_.push_back({name, help, type, {}});
    family = &families_.back();
  }
  prometheus::ClientMetric& metric = family->metric.emplace_back();
  for (const auto& [k, v] : labels) metric.label.push_back({k, v});
  return metric;
}

void MetricFamilies::Counter(const std::string& name, const std::string& help,
                             const MetricLabels& labels, double value) {
  Add(name, help, prometheus::MetricType::Counter, labels).counter.value = value;
}

void MetricFamilies::Gauge(const std::string& name, const std::string& help,
                           const MetricLabels& labels, double value) {
  Add(name, help, prometheus::MetricType::Gauge, labels).gauge.value = value;
}

void MetricFamilies::Summary(const std::string& name, const std::string& help,
                             const MetricLabels& labels, uint64_t count, double sum) {
  auto& summary = Add(name, help, prometheus::MetricType::Summary, labels).summary;
  summary.sample_count = count;
  summary.sample_sum = sum;
}

RpcMetrics::RpcMetrics(prometheus::Registry* registry)
    : handled_(prometheus::BuildCounter()
                   .Name("pscluster_rpc_server_handled_total")
                   .Help("RPCs completed by this server, by service, method and gRPC status code.")
                   .Register(*registry)),
      latency_(prometheus::BuildHistogram()
                   .Name("pscluster_rpc_server_handling_seconds")
                   .Help("Time from an RPC's arrival to its status being sent.")
                   .Register(*registry)) {}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcMetrics::Interceptor() {
  return std::make_unique<RpcInterceptorFactory>(this);
}

RpcMetrics::Method* RpcMetrics::Find(const std::string& method) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (auto it = methods_.find(method); it != methods_.end()) return it->second.get();
  }
  absl::MutexLock lock(&mu_);
  const std::string key = methods_.size() < kMaxMethods ? method : "other";
  std::unique_ptr<Method>& m = methods_[key];
  if (m == nullptr) {
    m = std::make_unique<Method>();
    m->labels = MethodLabels(key);
    // 100 us .. ~100 s: a cheap unary call to a long BSP wait or a snapshot restore.
    m->latency = &latency_.Add(m->labels, prometheus::Histogram::BucketBoundaries{
                                              1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
                                              0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 100});
  }
  return m.get();
}

void RpcMetrics::Record(const std::string& method, grpc::StatusCode code, double seconds) {
  Method* m = Find(method);
  m->latency->Observe(seconds);
  const int i = static_cast<int>(code) >= 0 && static_cast<int>(code) < 17 ? code : 2;
  prometheus::Counter* counter;
  {
    absl::ReaderMutexLock lock(&mu_);
    counter = m->codes[i];
  }
  if (counter == nullptr) {
    absl::MutexLock lock(&mu_);
    if (m->codes[i] == nullptr) {
      MetricLabels labels = m->labels;
      // gRPC's codes are absl's, number for number.
      labels["grpc_code"] = absl::StatusCodeToString(static_cast<absl::StatusCode>(i));
      m->codes[i] = &handled_.Add(labels);
    }
    counter = m->codes[i];
  }
  counter->Increment();
}

namespace {

// The standard process_* metrics (Prometheus' client libraries' names and meanings), so
// dashboards and alerts made for any exporter work here. None when /proc cannot be read.
void AddProcessMetrics(MetricFamilies* f) {
  absl::StatusOr<ProcessStats> s = ReadProcessStats();
  if (!s.ok()) return;
  f->Counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", {},
             s->cpu_seconds);
  f->Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", {},
           static_cast<double>(s->virtual_bytes));
  f->Gauge("process_resident_memory_bytes", "Resident memory size in bytes.", {},
           static_cast<double>(s->resident_bytes));
  f->Gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
           {}, s->start_time_seconds);
  f->Gauge("process_open_fds", "Number of open file descriptors.", {},
           static_cast<double>(s->open_fds));
  f->Gauge("process_max_fds", "Maximum number of open file descriptors.", {},
           static_cast<double>(s->max_fds));
}

}  // namespace

// Every collector, run at each scrape.
class Metrics::Collectors final : public prometheus::Collectable {
 public:
  void Add(std::function<void(MetricFamilies*)> collect) {
    absl::MutexLock lock(&mu_);
    collect_.push_back(std::move(collect));
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    MetricFamilies families;
    absl::MutexLock lock(&mu_);
    for (const auto& collect : collect_) collect(&families);
    return families.Take();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::function<void(MetricFamilies*)>> collect_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Serve(const std::string& host, int port,
                                                        const std::string& process,
                                                        const std::string& id) {
  std::unique_ptr<Metrics> m(new Metrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->collectors_ = std::make_shared<Collectors>();
  m->rpcs_ = std::make_unique<RpcMetrics>(m->registry_.get());
  const std::string role = process == "ps_server"        ? "shard"
                           : process == "ps_worker"      ? "worker"
                           : process == "ps_coordinator" ? "coordinator"
                                                         : process;
  const MetricLabels info = {
      {"process", process}, {"role", role}, {"id", id}, {"version", PsclusterVersion()}};
  m->AddCollector([info](MetricFamilies* f) {
    f->Gauge("pscluster_info", "Always 1: this process's program, role, id and version.", info, 1);
    AddProcessMetrics(f);
  });
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(HttpServerOptions(host, port));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", host, ":", port, ": ",
                                               e.what(), " (port in use? try another)"));
  }
  m->exposer_->RegisterCollectable(m->registry_);
  m->exposer_->RegisterCollectable(m->collectors_);
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  m->port_ = ports.empty() ? port : ports.front();
  return m;
}

Metrics::~Metrics() = default;

void Metrics::AddCollector(std::function<void(MetricFamilies*)> collect) {
  collectors_->Add(std::move(collect));
}

const char* PsclusterVersion() { return PSCLUSTER_VERSION; }

}  // namespace pscluster
