#include "server/ps/table/consistency_clock.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pscluster::ps {

void ConsistencyClock::AddWorker(int32_t worker) {
  if (clocks_.count(worker)) return;
  const int64_t start = !bsp() && !clocks_.empty() ? SlowestClock() : applied_steps_;
  clocks_[worker] = start;
}

void ConsistencyClock::RemoveWorker(int32_t worker) {
  clocks_.erase(worker);
  RaiseWatermark();
}

void ConsistencyClock::RaiseWatermark() {
  if (!bsp() && !clocks_.empty()) applied_steps_ = std::max(applied_steps_, SlowestClock());
}

int64_t ConsistencyClock::SlowestClock() const {
  int64_t slowest = clocks_.begin()->second;
  for (const auto& [w, clock] : clocks_) slowest = std::min(slowest, clock);
  return slowest;
}

absl::Status ConsistencyClock::CheckPush(int32_t worker, int64_t step) const {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step));
  if (!bsp()) {
    auto it = clocks_.find(worker);
    const int64_t clock = it == clocks_.end() ? 0 : it->second;
    if (step - clock > kMaxAsyncStepsAhead) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", table_id_, ": step ", step, " is more than ", kMaxAsyncStepsAhead,
          " steps ahead of worker ", worker, "'s clock ", clock,
          " (the steps it pushed): push the step after its last; to resume a run at a later "
          "step, restore its checkpoint, whose clocks come with it"));
    }
    return absl::OkStatus();
  }
  if (step < applied_steps_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", table_id_, ": step ", step, " is already applied (BSP applied_steps=",
        applied_steps_, "); pull the current parameters and push step ", applied_steps_));
  }
  if (step >= applied_steps_ + kMaxBspStepsAhead) {
    // ABORTED, not FAILED_PRECONDITION: a worker that waits for its pulls gets here only from
    // a shard that restarted from an earlier checkpoint while the workers went on (before
    // the coordinator saw it); what such a worker does is roll back, not stop.
    return absl::AbortedError(
        absl::StrCat("table ", table_id_, ": step ", step, " is ", step - applied_steps_,
                     " steps ahead of the oldest unapplied BSP step ", applied_steps_, "; at most ",
                     kMaxBspStepsAhead - 1, " may be",
                     " (were the shards restored to an earlier checkpoint? then resume from "
                     "step ",
                     applied_steps_, ")"));
  }
  auto it = pushed_.find(step);
  if (it != pushed_.end() && it->second.count(worker)) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", table_id_, ": worker ", worker, " already pushed step ", step));
  }
  return absl::OkStatus();
}

void ConsistencyClock::RecordPush(int32_t worker, int64_t step) {
  int64_t& clock = clocks_[worker];
  clock = std::max(clock, step + 1);
  if (bsp()) {
    pushed_[step].insert(worker);
  } else {
    RaiseWatermark();
  }
}

bool ConsistencyClock::NextStepReady() const {
  if (!bsp() || capture_at_.count(applied_steps_)) return false;
  auto it = pushed_.find(applied_steps_);
  if (it == pushed_.end()) return false;
  for (const auto& [w, unused] : clocks_) {
    if (!it->second.count(w)) return false;
  }
  return true;
}

void ConsistencyClock::StepApplied() {
  pushed_.erase(applied_steps_);
  ++applied_steps_;
}

bool ConsistencyClock::Pullable(int64_t step) const {
  if (shutdown_) return true;
  switch (config_.mode()) {
    case ConsistencyConfig::BSP:
      return applied_steps_ >= step;
    case ConsistencyConfig::SSP:
      for (const auto& [w, clock] : clocks_) {
        if (clock < step - config_.staleness()) return false;
      }
      return true;
    default:
      return true;
  }
}

int64_t ConsistencyClock::Staleness(int64_t step) const {
  if (bsp() || clocks_.empty()) return 0;
  return std::max<int64_t>(0, step - SlowestClock());
}

std::string ConsistencyClock::DescribeLaggards(int64_t step) const {
  const int64_t need = bsp() ? step : step - config_.staleness();
  std::string out;
  bool skipped = false;  // some worker pushed a later step but not an earlier unapplied one
  for (const auto& [w, clock] : clocks_) {
    if (!bsp()) {
      if (clock < need)
        absl::StrAppend(&out, out.empty() ? "" : ", ", "worker ", w, " (clock ", clock, ")");
      continue;
    }
    // BSP: the unapplied steps before `step` this worker has not pushed (no push goes
    // kMaxBspStepsAhead past the applied steps, so the scan is short whatever `step` is).
    // first: the oldest such step; last: the newest one below a step it did push (a skip).
    int64_t first = -1, last = -1;
    for (int64_t s = applied_steps_; s < std::min(step, applied_steps_ + kMaxBspStepsAhead); ++s) {
      auto it = pushed_.find(s);
      if (it == pushed_.end() || !it->second.count(w)) {
        if (first < 0) first = s;
      } else if (first >= 0) {
        last = s - 1;
      }
    }
    if (first < 0) continue;
    const bool later = last >= 0;
    absl::StrAppend(&out, out.empty() ? "" : ", ", "worker ", w, " (clock ", clock,
                    later ? absl::StrCat(", no push of step ", first,
                                         first == last ? "" : absl::StrCat("-", last),
                                         " here but of a later one")
                          : "",
                    ")");
    skipped = skipped || later;
  }
  if (!bsp()) return out;
  absl::StrAppend(&out, out.empty() ? "" : "; ", "BSP applied_steps=", applied_steps_);
  if (Held(applied_steps_)) {
    absl::StrAppend(&out, "; step ", applied_steps_, " is held for a snapshot being captured");
  }
  if (skipped) {
    absl::StrAppend(&out,
                    "; a worker that skipped steps here pushed them before this shard lost "
                    "them (restarted from an older snapshot?): roll every shard back to one "
                    "checkpoint (psctl restore, or the client's restore) and resume from it");
  }
  return out;
}

absl::Status ConsistencyClock::Hold(int64_t step) {
  if (!bsp()) return absl::OkStatus();
  if (applied_steps_ > step) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", table_id_, " has already applied step ", step,
                     " (applied_steps=", applied_steps_, "); snapshot a step >= ", applied_steps_));
  }
  capture_at_.insert(step);
  return absl::OkStatus();
}

bool ConsistencyClock::Release(int64_t step) {
  auto it = capture_at_.find(step);
  if (it == capture_at_.end()) return false;
  capture_at_.erase(it);
  return true;
}

void ConsistencyClock::Reset(int64_t step) {
  for (auto& [w, clock] : clocks_) clock = step;
  applied_steps_ = step;
  pushed_.clear();
}

void ConsistencyClock::Restore(const TableSnapshotHeader& header) {
  applied_steps_ = header.applied_steps();
  for (const WorkerClock& c : header.clocks()) clocks_[c.worker_id()] = c.clock();
}

void ConsistencyClock::Fill(TableSnapshotHeader* header) const {
  header->set_applied_steps(applied_steps_);
  for (const auto& [w, clock] : clocks_) {
    WorkerClock* c = header->add_clocks();
    c->set_worker_id(w);
    c->set_clock(clock);
  }
}

}  // namespace pscluster::ps
