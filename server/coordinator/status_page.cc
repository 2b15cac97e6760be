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

namespace pscluster::coord {
namespace {

const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

std::string Number(double v) {
  const double a = std::abs(v);
  return HtmlEscape(absl::StrFormat(a >= 1e4 && a < 1e12 ? "%.0f" : "%.4g", v));
}

std::string Ago(int64_t unix_ms, absl::Time now) {
  if (unix_ms <= 0) return "never";
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(now - absl::FromUnixMillis(unix_ms)));
}

std::string When(int64_t unix_ms) {
  if (unix_ms <= 0) return "";
  return HtmlEscape(absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                                     absl::UTCTimeZone()));
}

// The ranges a chart spans: every worker's points, at least [0, 1] in y when `unit`.
struct Span {
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  bool any = false;  // any point at all
};
template <typename Series>
Span SpanOf(const std::map<int32_t, WorkerCurves>& curves, bool unit, Series series) {
  Span r;
  for (const auto& [rank, c] : curves) {
    for (const ProgressPoint& p : series(c)) {
      if (!r.any) {
        r.x0 = r.x1 = static_cast<double>(p.step);
        r.y0 = r.y1 = p.value;
        r.any = true;
      }
      r.x0 = std::min(r.x0, static_cast<double>(p.step));
      r.x1 = std::max(r.x1, static_cast<double>(p.step));
      r.y0 = std::min(r.y0, p.value);
      r.y1 = std::max(r.y1, p.value);
    }
  }
  if (r.x1 == r.x0) r.x1 = r.x0 + 1;
  if (unit) {
    r.y0 = std::min(r.y0, 0.0);
    r.y1 = std::max(r.y1, 1.0);
  }
  if (r.y1 == r.y0) {
    r.y0 -= 0.5;
    r.y1 += 0.5;
  }
  return r;
}

// One chart: a polyline per worker of series(curves) against step, with the ranges printed.
// `unit`: the y axis spans at least [0, 1] (accuracy).
template <typename Series>
std::string Chart(const std::string& id, const std::string& title,
                  const std::map<int32_t, WorkerCurves>& curves, bool unit, Series series) {
  constexpr double kW = 460, kH = 180, kLeft = 56, kRight = 10, kTop = 24, kBottom = 28;
  const Span span = SpanOf(curves, unit, series);
  const double x0 = span.x0, x1 = span.x1, y0 = span.y0, y1 = span.y1;
  const bool any = span.any;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * (kW - kLeft - kRight); };
  auto py = [&](double y) { return kH - kBottom - (y - y0) / (y1 - y0) * (kH - kTop - kBottom); };
  std::string svg = absl::StrFormat(
      "<svg id=\"%s\" class=\"chart\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"%s\">"
      "<text x=\"%.0f\" y=\"16\" class=\"title\">%s</text>"
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" class=\"frame\"/>",
      id, kW, kH, kW, kH, HtmlEscape(title), kLeft, HtmlEscape(title), kLeft, kTop,
      kW - kLeft - kRight, kH - kTop - kBottom);
  if (!any) {
    absl::StrAppend(&svg, "<text x=\"", kLeft + 10, "\" y=\"", kH / 2,
                    "\" class=\"empty\">no reports yet</text></svg>");
    return svg;
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%s</text>"
                        "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%s</text>"
                        "<text x=\"%.0f\" y=\"%.0f\">step %s</text>"
                        "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%s</text>",
                        kLeft - 4, kTop + 10, Number(y1), kLeft - 4, kH - kBottom, Number(y0),
                        kLeft, kH - 8, Number(x0), kW - kRight, kH - 8, Number(x1));
  int legend = 0;
  for (const auto& [rank, c] : curves) {
    const std::vector<ProgressPoint>& points = series(c);
    if (points.empty()) continue;
    const char* colour =
        kColours[static_cast<size_t>(rank) % (sizeof(kColours) / sizeof(*kColours))];
    std::string coords;
    for (const ProgressPoint& p : points) {
      absl::StrAppendFormat(&coords, "%s%.1f,%.1f", coords.empty() ? "" : " ",
                            px(static_cast<double>(p.step)), py(p.value));
    }
    absl::StrAppendFormat(&svg,
                          "<polyline class=\"curve\" data-worker=\"%d\" data-points=\"%d\" "
                          "fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>"
                          "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">worker %d</text>",
                          rank, points.size(), colour, coords, kW - kRight - 70,
                          kTop + 14 + 14 * legend, colour, rank);
    ++legend;
  }
  return svg + "</svg>";
}

}  // namespace

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
      "svg text{font-size:11px}.chart{margin-right:1em}"
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
                    worker ? Number(m.loss()) : "", "</td><td>",
                    worker ? Number(m.samples_per_sec()) : "", "</td><td>",
                    worker && m.has_metric() ? Number(m.metric()) : "", "</td></tr>");
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
    absl::StrAppend(&h, "<tr><td>", c.step(), "</td><td>", c.has_metric() ? Number(c.metric()) : "",
                    "</td><td>yes</td><td>", When(c.unix_ms()), "</td></tr>");
  }
  absl::StrAppend(&h, "</table>");
  return h;
}

std::string CurvesSection(const std::map<int32_t, WorkerCurves>& curves) {
  std::string h;
  absl::StrAppend(
      &h, "<h2>Curves</h2><div id=\"curves\">",
      Chart("loss-chart", "training loss", curves, false,
            [](const WorkerCurves& c) -> const std::vector<ProgressPoint>& { return c.loss; }),
      Chart("metric-chart", "test accuracy", curves, true,
            [](const WorkerCurves& c) -> const std::vector<ProgressPoint>& { return c.metric; }),
      Chart("rate-chart", "samples/s", curves, false,
            [](const WorkerCurves& c) -> const std::vector<ProgressPoint>& {
              return c.samples_per_sec;
            }),
      "</div></body></html>\n");
  return h;
}

}  // namespace

std::string RenderStatusPage(const ClusterView& view, const std::map<int32_t, WorkerCurves>& curves,
                             absl::Time now, int refresh_seconds) {
  return absl::StrCat(Head(view, now, refresh_seconds), MembersTable(view, now), ShardsTable(view),
                      SwitchesTable(view), CheckpointsTable(view), CurvesSection(curves));
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
