// The coordinator's status page (ps_coordinator --http_port): members with liveness and
// heartbeat age, the shard map, the mode and its switches, checkpoints, and per-worker
// curves of loss, test accuracy and samples/s drawn as inline SVG on the server: one
// self-contained HTML page that refreshes itself, with nothing fetched from elsewhere.
// Every string it prints is HTML-escaped.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"
#include "server/coordinator/cluster_state.h"
#include "server/coordinator/progress_history.h"

class CivetServer;

namespace pscluster::coord {

// &, <, >, " and ' as entities.
std::string HtmlEscape(const std::string& text);
// A figure as the page prints it (4 significant digits, whole numbers in full up to 1e12).
std::string HtmlNumber(double v);

// The page for `view` at `now`, refreshing every `refresh_seconds` (0: never).
std::string RenderStatusPage(const ClusterView& view, const std::map<int32_t, WorkerCurves>& curves,
                             absl::Time now, int refresh_seconds = 2);

// The page as it stands, written to `path` (atomically, no refresh): a finished run's copy
// that outlives the coordinator (ps_coordinator writes <data_dir>/status.html at the end).
absl::Status WriteStatusPage(const std::string& path, const ClusterView& view,
                             const std::map<int32_t, WorkerCurves>& curves, absl::Time now);

class StatusPageServer {
 public:
  // Serves the page at http://host:port/ (port 0: one the kernel picks); UNAVAILABLE when
  // it cannot listen. `cluster` and `history` must outlive the server.
  static absl::StatusOr<std::unique_ptr<StatusPageServer>> Start(const std::string& host, int port,
                                                                 const ClusterState* cluster,
                                                                 const ProgressHistory* history);
  ~StatusPageServer();
  int port() const { return port_; }

 private:
  class Handler;
  StatusPageServer() = default;

  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetServer> server_;  // stops before the handler goes
  int port_ = 0;
};

}  // namespace pscluster::coord
