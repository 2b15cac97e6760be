// The status page's charts: inline SVG drawn on the server, one line per worker against
// step, both axes scaled to the data with round-numbered ticks, and vertical markers for
// the run's events (switches, checkpoints, the last rollback). A single point draws as a
// dot. Every label is HTML-escaped.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/coordinator.pb.h"
#include "server/coordinator/progress_history.h"

namespace pscluster::coord {

// A vertical marker at `step`: its kind ("switch", "checkpoint", "rollback": its CSS class)
// and a short label.
struct ChartEvent {
  int64_t step = 0;
  std::string kind;
  std::string label;
};

// The events of `view` worth a marker.
std::vector<ChartEvent> ChartEvents(const ClusterView& view);

// About `count` round-numbered ticks (1, 2 or 5 times a power of ten apart) within [lo, hi].
std::vector<double> Ticks(double lo, double hi, int count = 4);

// One chart titled `title` (HTML id `id`): a line per worker of `series` (rank -> points).
std::string LineChart(const std::string& id, const std::string& title,
                      const std::map<int32_t, const std::vector<ProgressPoint>*>& series,
                      const std::vector<ChartEvent>& events);

// Each live worker's mean step split into compute, communication and other time, as
// stacked bars on one scale: a straggler is the worker whose compute is longest, the
// others' communication (waiting for it) longer than its own.
std::string StepTimeChart(const ClusterView& view);

}  // namespace pscluster::coord
