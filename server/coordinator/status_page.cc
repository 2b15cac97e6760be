#include "server/coordinator/status_page.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <vector>

#include "CivetServer.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/atomic_file.h"
#include "common/http_server_options.h"
#include "common/training_mode.h"
#include "server/coordinator/status_charts.h"

namespace pscluster::coord {
namespace {

std::string Ago(int64_t unix_ms, absl::Time now) {
  if (unix_ms <= 0) return "never";
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(now - absl::FromUnixMillis(unix_ms)));
}

std::string When(int64_t unix_ms) {
  if (unix_ms <= 0) return "";
  return HtmlEscape(absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                                     absl::UTCTimeZone()));
}

}  // namespace

std::string HtmlNumber(double v) {
  const double a = std::abs(v);
  return HtmlEscape(absl::StrFormat(a >= 1e4 && a < 1e12 ? "%.0f" : "%.4g", v));
}

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// The page's head and its summary line.
std::string Head(const ClusterView& view, absl::Time now, int refresh_seconds) {
  int alive = 0, finished = 0, dead = 0;  // a worker that finished and left is not dead
  for (const Member& m : view.members()) (m.alive() ? alive : m.finished() ? finished : dead)++;
  const std::string refresh =
      refresh_seconds > 0
          ? absl::StrCat("<meta http-equiv=\"refresh\" content=\"", refresh_seconds, "\">")
          : "";
  std::string h = absl::StrCat(
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">", refresh,
      "<title>pscluster: ", HtmlEscape(ModeName(view.mode())), ", step ", view.global_step(),
      "</title><style>"
      "body{font-family:sans-serif;margin:1.5em;color:#222}"
      "table{border-collapse:collapse;margin-bottom:1em}"
      "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
      "th{background:#eee}.dead{color:#fff;background:#c00;font-weight:bold}"
      ".alive{color:#060}.finished{color:#036}.frame{fill:none;stroke:#999}.title{font-weight:bold}"
      "svg text{font-size:11px}.chart{margin-right:1em}.grid{stroke:#eee}"
      ".xtick,.ytick{fill:#555}.event{stroke-width:1.5;stroke-dasharray:4 3}"
      "line.switch{stroke:#9467bd}line.checkpoint{stroke:#2ca02c}line.rollback{stroke:#d62728}"
      "span.switch{color:#9467bd}span.checkpoint{color:#2ca02c}span.rollback{color:#d62728}"
      "rect.compute{fill:#1f77b4}rect.communication{fill:#ff7f0e}rect.other{fill:#bbb}"
      "tspan.compute{fill:#1f77b4}tspan.communication{fill:#ff7f0e}tspan.other{fill:#888}"
      "</style></head><body>");
  absl::StrAppend(&h, "<h1>pscluster</h1><p id=\"summary\">mode <b id=\"mode\">",
                  HtmlEscape(ModeName(view.mode())), "</b> &middot; global step <b>",
                  view.global_step(), "</b> &middot; view ", view.version(), " &middot; ",
                  view.finished()   ? "<b id=\"finished\">run finished</b>"
                  : view.complete() ? "complete"
                                    : "<b>incomplete</b>",
                  " &middot; ", alive, " alive, ", finished, " finished, ", dead,
                  " dead &middot; refreshed ", When(absl::ToUnixMillis(now)), "</p>");
  return h;
}

std::string MembersTable(const ClusterView& view, absl::Time now) {
  std::string h;
  absl::StrAppend(&h,
                  "<h2>Members</h2><table id=\"members\"><tr><th>role</th><th>id</th>"
                  "<th>address</th><th>state</th><th>heartbeat age</th><th>incarnation</th>"
                  "<th>step</th><th>loss</th><th>samples/s</th><th>test metric</th></tr>");
  for (const Member& m : view.members()) {
    const bool worker = m.role() == WORKER;
    absl::StrAppend(&h, "<tr class=\"member\" data-role=\"", worker ? "worker" : "shard",
                    "\" data-id=\"", m.id(), "\"><td>", worker ? "worker" : "shard", "</td><td>",
                    m.id(), "</td><td>", HtmlEscape(m.address()), "</td><td class=\"",
                    m.alive()      ? "alive\">alive"
                    : m.finished() ? "finished\">finished"
                                   : "dead\">DEAD",
                    "</td><td>", Ago(m.last_heartbeat_ms(), now), "</td><td>", m.incarnation(),
                    "</td><td>", worker ? absl::StrCat(m.step()) : "", "</td><td>",
                    worker ? HtmlNumber(m.loss()) : "", "</td><td>",
                    worker ? HtmlNumber(m.samples_per_sec()) : "", "</td><td>",
                    worker && m.has_metric() ? HtmlNumber(m.metric()) : "", "</td></tr>");
  }
  absl::StrAppend(&h, "</table>");
  return h;
}

std::string ShardsTable(const ClusterView& view) {
  std::string h;
  absl::StrAppend(&h,
                  "<h2>Shard map</h2><table id=\"shards\"><tr><th>shard</th>"
                  "<th>address</th></tr>");
  for (int i = 0; i < view.shard_addresses_size(); ++i) {
    absl::StrAppend(
        &h, "<tr><td>", i, "</td><td>",
        view.shard_addresses(i).empty() ? "(not registered)" : HtmlEscape(view.shard_addresses(i)),
        "</td></tr>");
  }
  absl::StrAppend(&h, "</table>");
  return h;
}

std::string SwitchesTable(const ClusterView& view) {
  std::string h;
  absl::StrAppend(&h,
                  "<h2>Mode switches</h2><table id=\"switches\"><tr><th>id</th>"
                  "<th>at step</th><th>from</th><th>to</th><th>hand-over</th>"
                  "<th>state</th><th>time</th></tr><tr><td>0</td><td>0</td><td></td><td>",
                  HtmlEscape(ModeName(view.initial_mode())),
                  "</td><td></td><td>start</td><td></td></tr>");
  for (const SwitchRecord& s : view.switches()) {
    absl::StrAppend(&h, "<tr><td>", s.switch_id(), "</td><td>", s.at_step(), "</td><td>",
                    HtmlEscape(ModeName(s.from_mode())), "</td><td>",
                    HtmlEscape(ModeName(s.to_mode())), "</td><td>",
                    absl::StrFormat("%.3f s", s.handoff_seconds()), "</td><td>done</td><td>",
                    When(s.unix_ms()), "</td></tr>");
  }
  for (const SwitchRecord& s : view.pending_switches()) {
    absl::StrAppend(&h, "<tr><td>", s.switch_id(), "</td><td>", s.at_step(), "</td><td></td><td>",
                    HtmlEscape(ModeName(s.to_mode())), "</td><td></td><td>pending (",
                    s.acked_ranks_size(), " acked)</td><td>", When(s.unix_ms()), "</td></tr>");
  }
  absl::StrAppend(&h, "</table>");
  return h;
}

std::string CheckpointsTable(const ClusterView& view) {
  std::string h;
  absl::StrAppend(&h,
                  "<h2>Checkpoints</h2><table id=\"checkpoints\"><tr><th>step</th>"
                  "<th>metric</th><th>complete</th><th>time</th></tr>");
  if (view.checkpoints().empty()) absl::StrAppend(&h, "<tr><td colspan=\"4\">none yet</td></tr>");
  for (const Checkpoint& c : view.checkpoints()) {
    absl::StrAppend(&h, "<tr><td>", c.step(), "</td><td>",
                    c.has_metric() ? HtmlNumber(c.metric()) : "", "</td><td>yes</td><td>",
                    When(c.unix_ms()), "</td></tr>");
  }
  absl::StrAppend(&h, "</table>");
  return h;
}

// The charts, first: what an operator watches.
std::string CurvesSection(const ClusterView& view, const std::map<int32_t, WorkerCurves>& curves) {
  std::map<int32_t, const std::vector<ProgressPoint>*> loss, metric, rate;
  for (const auto& [rank, c] : curves) {
    loss[rank] = &c.loss;
    metric[rank] = &c.metric;
    rate[rank] = &c.samples_per_sec;
  }
  const std::vector<ChartEvent> events = ChartEvents(view);
  return absl::StrCat("<div id=\"curves\">", LineChart("loss-chart", "training loss", loss, events),
                      LineChart("metric-chart", "test accuracy", metric, events),
                      LineChart("rate-chart", "samples/s", rate, events), StepTimeChart(view),
                      "</div><p class=\"legend\">markers: <span class=\"switch\">switch</span> "
                      "<span class=\"checkpoint\">checkpoint</span> "
                      "<span class=\"rollback\">rollback</span> (hover for details)</p>");
}

}  // namespace

std::string RenderStatusPage(const ClusterView& view, const std::map<int32_t, WorkerCurves>& curves,
                             absl::Time now, int refresh_seconds) {
  return absl::StrCat(Head(view, now, refresh_seconds), CurvesSection(view, curves),
                      MembersTable(view, now), ShardsTable(view), SwitchesTable(view),
                      CheckpointsTable(view), "</body></html>\n");
}

class StatusPageServer::Handler final : public CivetHandler {
 public:
  Handler(const ClusterState* cluster, const ProgressHistory* history)
      : cluster_(cluster), history_(history) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    const mg_request_info* info = mg_get_request_info(conn);
    const std::string uri = info->local_uri != nullptr ? info->local_uri : "";
    if (uri != "/" && uri != "/index.html") {
      mg_send_http_error(conn, 404, "%s", "not found: the status page is at /");
      return true;
    }
    const std::string body = RenderStatusPage(cluster_->View(), history_->Curves(), absl::Now());
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
              "Content-Length: %zu\r\nCache-Control: no-store\r\n"
              "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n"
              "Connection: close\r\n\r\n",
              body.size());
    mg_write(conn, body.data(), body.size());
    return true;
  }

 private:
  const ClusterState* const cluster_;
  const ProgressHistory* const history_;
};

absl::Status WriteStatusPage(const std::string& path, const ClusterView& view,
                             const std::map<int32_t, WorkerCurves>& curves, absl::Time now) {
  return WriteFileAtomically(path, RenderStatusPage(view, curves, now, /*refresh_seconds=*/0));
}

absl::StatusOr<std::unique_ptr<StatusPageServer>> StatusPageServer::Start(
    const std::string& host, int port, const ClusterState* cluster,
    const ProgressHistory* history) {
  std::unique_ptr<StatusPageServer> s(new StatusPageServer());
  s->handler_ = std::make_unique<Handler>(cluster, history);
  try {
    s->server_ = std::make_unique<CivetServer>(HttpServerOptions(host, port));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve the status page on ", host, ":", port,
                                               ": ", e.what(), " (port in use?)"));
  }
  s->server_->addHandler("/", s->handler_.get());
  const std::vector<int> ports = s->server_->getListeningPorts();
  s->port_ = ports.empty() ? port : ports.front();
  return s;
}

StatusPageServer::~StatusPageServer() {
  if (server_ != nullptr) server_->close();
}

}  // namespace pscluster::coord
