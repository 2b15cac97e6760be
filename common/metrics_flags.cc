#include "common/metrics_flags.h"

#include <cstdio>

#include "absl/flags/flag.h"
#include "common/logging.h"

ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics at http://--metrics_host:PORT/metrics (0: off; -1: a free "
          "port, printed at start).");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "Address the metrics endpoint listens on (0.0.0.0 for every interface).");

namespace pscluster {

absl::Status CheckListenPortFlag(const std::string& flag, int port) {
  if (port >= -1 && port <= 65535) return absl::OkStatus();
  return absl::InvalidArgumentError("--" + flag + " must be 0 (off), -1 (any) or a port");
}

absl::StatusOr<std::unique_ptr<Metrics>> ServeMetricsFromFlags(const std::string& process,
                                                               const std::string& id) {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port == 0) return nullptr;
  if (absl::Status s = CheckListenPortFlag("metrics_port", port); !s.ok()) return s;
  const std::string host = absl::GetFlag(FLAGS_metrics_host);
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Serve(host, port < 0 ? 0 : port, process, id);
  if (metrics.ok()) {
    LogInfo("metrics on http://%s:%d/metrics", host.c_str(), (*metrics)->port());
  }
  return metrics;
}

}  // namespace pscluster
