#include "server/coordinator/status_charts.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/training_mode.h"
#include "server/coordinator/status_page.h"

namespace pscluster::coord {
namespace {

const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
constexpr double kW = 460, kH = 200, kLeft = 56, kRight = 10, kTop = 24, kBottom = 30;

// The ranges the chart spans: every worker's points, a little room above and below.
struct Span {
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  bool any = false;
};

Span SpanOf(const std::map<int32_t, const std::vector<ProgressPoint>*>& series) {
  Span r;
  for (const auto& [rank, points] : series) {
    for (const ProgressPoint& p : *points) {
      const double x = static_cast<double>(p.step);
      if (!r.any) r = {x, x, p.value, p.value, true};
      r.x0 = std::min(r.x0, x), r.x1 = std::max(r.x1, x);
      r.y0 = std::min(r.y0, p.value), r.y1 = std::max(r.y1, p.value);
    }
  }
  if (r.x1 == r.x0) r.x0 -= 1, r.x1 += 1;  // one step: centred
  // A flat line sits mid-chart; otherwise 5 % room, so no point lies on the frame.
  const double pad = r.y1 > r.y0 ? (r.y1 - r.y0) * 0.05 : (r.y0 != 0 ? std::abs(r.y0) * 0.05 : 0.5);
  r.y0 -= pad, r.y1 += pad;
  return r;
}

struct Frame {
  Span s;
  double X(double x) const { return kLeft + (x - s.x0) / (s.x1 - s.x0) * (kW - kLeft - kRight); }
  double Y(double y) const {
    return kH - kBottom - (y - s.y0) / (s.y1 - s.y0) * (kH - kTop - kBottom);
  }
};

// Grid lines and labels at round numbers on both axes.
std::string Axes(const Frame& f) {
  std::string svg;
  for (double y : Ticks(f.s.y0, f.s.y1)) {
    absl::StrAppendFormat(
        &svg,
        "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
        "<text class=\"ytick\" x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>",
        kLeft, f.Y(y), kW - kRight, f.Y(y), kLeft - 4, f.Y(y) + 4, HtmlNumber(y));
  }
  for (double x : Ticks(f.s.x0, f.s.x1)) {
    absl::StrAppendFormat(
        &svg,
        "<line class=\"grid\" x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\"/>"
        "<text class=\"xtick\" x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>",
        f.X(x), kTop, f.X(x), kH - kBottom, f.X(x), kH - kBottom + 14, HtmlNumber(x));
  }
  absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">step</text>",
                        kW - kRight, kH - 2);
  return svg;
}

std::string Markers(const Frame& f, const std::vector<ChartEvent>& events) {
  std::string svg;
  for (const ChartEvent& e : events) {
    const double x = static_cast<double>(e.step);
    if (x < f.s.x0 || x > f.s.x1) continue;
    absl::StrAppendFormat(
        &svg,
        "<line class=\"event %s\" x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\">"
        "<title>%s</title></line>",
        HtmlEscape(e.kind), f.X(x), kTop, f.X(x), kH - kBottom, HtmlEscape(e.label));
  }
  return svg;
}

std::string Lines(const Frame& f,
                  const std::map<int32_t, const std::vector<ProgressPoint>*>& series) {
  std::string svg;
  int legend = 0;
  for (const auto& [rank, points] : series) {
    if (points->empty()) continue;
    const char* colour = kColours[static_cast<size_t>(rank) % (sizeof kColours / sizeof *kColours)];
    std::string coords;
    for (const ProgressPoint& p : *points) {
      absl::StrAppendFormat(&coords, "%s%.1f,%.1f", coords.empty() ? "" : " ",
                            f.X(static_cast<double>(p.step)), f.Y(p.value));
    }
    absl::StrAppendFormat(&svg,
                          "<polyline class=\"curve\" data-worker=\"%d\" data-points=\"%d\" "
                          "fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>",
                          rank, points->size(), colour, coords);
    const ProgressPoint& last = points->back();  // the newest point, also a lone one, a dot
    absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>",
                          f.X(static_cast<double>(last.step)), f.Y(last.value), colour);
    absl::StrAppendFormat(&svg, "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">worker %d: %s</text>",
                          kW - kRight - 120, kTop + 14 + 14 * legend++, colour, rank,
                          HtmlNumber(last.value));
  }
  return svg;
}

}  // namespace

std::vector<double> Ticks(double lo, double hi, int count) {
  if (!(hi > lo) || count < 1) return {};
  const double raw = (hi - lo) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  const double step = magnitude * (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10);
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);  // no "-0" label
  }
  return ticks;
}

std::vector<ChartEvent> ChartEvents(const ClusterView& view) {
  std::vector<ChartEvent> events;
  for (const SwitchRecord& s : view.switches()) {
    events.push_back({s.at_step(), "switch",
                      absl::StrCat("switch ", ModeName(s.from_mode()), " -> ",
                                   ModeName(s.to_mode()), " at step ", s.at_step())});
  }
  for (const Checkpoint& c : view.checkpoints()) {
    events.push_back({c.step(), "checkpoint", absl::StrCat("checkpoint of step ", c.step())});
  }
  if (view.rollback().decided()) {
    events.push_back({view.rollback().step(), "rollback",
                      absl::StrCat("rollback to step ", view.rollback().step())});
  }
  return events;
}

std::string StepTimeChart(const ClusterView& view) {
  std::vector<const Member*> workers;
  double longest = 0;
  for (const Member& m : view.members()) {
    if (m.role() != WORKER || !m.has_step_time()) continue;
    workers.push_back(&m);
    const StepTime& t = m.step_time();
    longest = std::max(longest, t.compute_ms() + t.communication_ms() + t.other_ms());
  }
  constexpr double kRow = 22, kBarLeft = 70, kBarWidth = 300;
  const double height = kTop + kRow * static_cast<double>(std::max<size_t>(workers.size(), 1)) + 8;
  std::string svg = absl::StrFormat(
      "<svg id=\"step-time-chart\" class=\"chart\" width=\"%.0f\" height=\"%.0f\" "
      "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"step time\">"
      "<text x=\"%.0f\" y=\"16\" class=\"title\">step time, ms (<tspan class=\"compute\">"
      "compute</tspan>, <tspan class=\"communication\">communication</tspan>, <tspan "
      "class=\"other\">other</tspan>)</text>",
      kW, height, kLeft, kLeft);
  if (workers.empty() || longest <= 0) {
    return absl::StrCat(svg, "<text x=\"", kLeft, "\" y=\"", kTop + 14,
                        "\" class=\"empty\">no reports yet</text></svg>");
  }
  double y = kTop;
  for (const Member* m : workers) {
    const StepTime& t = m->step_time();
    absl::StrAppendFormat(&svg, "<text x=\"4\" y=\"%.0f\">worker %d</text>", y + 14, m->id());
    double x = kBarLeft;
    for (const auto& [part, ms] : {std::pair<const char*, double>{"compute", t.compute_ms()},
                                   {"communication", t.communication_ms()},
                                   {"other", t.other_ms()}}) {
      const double w = ms / longest * kBarWidth;
      absl::StrAppendFormat(&svg,
                            "<rect class=\"%s\" data-worker=\"%d\" x=\"%.1f\" y=\"%.0f\" "
                            "width=\"%.1f\" height=\"16\"><title>%s %s ms</title></rect>",
                            part, m->id(), x, y + 2, w, part, HtmlNumber(ms));
      x += w;
    }
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.0f\">%s</text>", x + 4, y + 14,
                          HtmlNumber(t.compute_ms() + t.communication_ms() + t.other_ms()));
    y += kRow;
  }
  return svg + "</svg>";
}

std::string LineChart(const std::string& id, const std::string& title,
                      const std::map<int32_t, const std::vector<ProgressPoint>*>& series,
                      const std::vector<ChartEvent>& events) {
  std::string svg = absl::StrFormat(
      "<svg id=\"%s\" class=\"chart\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
      "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"%s\">"
      "<text x=\"%.0f\" y=\"16\" class=\"title\">%s</text>"
      "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" class=\"frame\"/>",
      HtmlEscape(id), kW, kH, kW, kH, HtmlEscape(title), kLeft, HtmlEscape(title), kLeft, kTop,
      kW - kLeft - kRight, kH - kTop - kBottom);
  const Frame frame{SpanOf(series)};
  if (!frame.s.any) {
    return absl::StrCat(svg, "<text x=\"", kLeft + 10, "\" y=\"", kH / 2,
                        "\" class=\"empty\">no reports yet</text></svg>");
  }
  return absl::StrCat(svg, Axes(frame), Markers(frame, events), Lines(frame, series), "</svg>");
}

}  // namespace pscluster::coord
