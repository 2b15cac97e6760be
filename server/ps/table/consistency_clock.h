// One table's consistency clock: each registered worker's clock (steps pushed), which BSP
// steps every worker has pushed, how many BSP steps are applied, and the steps a snapshot
// holds. It answers when a pull may read (BSP: step applied; SSP(s): no worker more than s
// behind; ASP: always), which push is acceptable, and which BSP step is ready to apply;
// the table applies the gradients themselves. Independent of storage and gRPC.
// Not thread-safe: the owning Table guards it with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "proto/ps.pb.h"
#include "proto/snapshot.pb.h"

namespace pscluster::ps {

// Under BSP a worker may push at most this many steps beyond the oldest unapplied step.
inline constexpr int64_t kMaxBspStepsAhead = 4;
// Under SSP/ASP a worker may push at most this many steps beyond its own clock (a step
// far ahead would move the table's clocks, and the checkpoints labelled by them, for good).
inline constexpr int64_t kMaxAsyncStepsAhead = 1024;

class ConsistencyClock {
 public:
  ConsistencyClock(uint32_t table_id, ConsistencyConfig config)
      : table_id_(table_id), config_(std::move(config)) {}

  bool bsp() const { return config_.mode() == ConsistencyConfig::BSP; }
  // The steps the table holds every worker's push of. BSP: the steps applied. SSP/ASP,
  // which apply each push as it arrives: the slowest worker's clock, kept when workers
  // leave (a watermark: it never goes back but by Reset or Restore). A checkpoint is taken
  // at it (the coordinator snapshots the furthest); under SSP/ASP the capture may also hold
  // later pushes of faster workers, which a run resumed there pushes again.
  int64_t applied_steps() const { return applied_steps_; }
  const std::map<int32_t, int64_t>& clocks() const { return clocks_; }

  // Adds a worker whose clock bounds consistency (idempotent). A late joiner starts at
  // the current step (BSP: applied steps; else the slowest clock), not holding others back.
  void AddWorker(int32_t worker);
  // Removes a worker for good: steps no longer wait for it; its pushes so far stay.
  void RemoveWorker(int32_t worker);

  // INVALID_ARGUMENT for a negative step; BSP: FAILED_PRECONDITION for a step already
  // applied, too far ahead (kMaxBspStepsAhead) or already pushed by this worker; SSP/ASP:
  // for a step more than kMaxAsyncStepsAhead beyond the worker's clock.
  absl::Status CheckPush(int32_t worker, int64_t step) const;
  // Advances the worker's clock past `step` (BSP: records the push).
  void RecordPush(int32_t worker, int64_t step);
  // BSP: true when the oldest unapplied step has every worker's push and no snapshot holds
  // it; the table then applies it and calls StepApplied.
  bool NextStepReady() const;
  void StepApplied();

  // Whether a pull at `step` may read (always after Shutdown).
  bool Pullable(int64_t step) const;
  // What a read at `step` lacks: step minus the slowest worker's clock (0 under BSP, where a
  // read sees every step before its own, and with no workers).
  int64_t Staleness(int64_t step) const;
  // The workers a read at `step` waits for, with their clocks (and BSP's applied steps).
  std::string DescribeLaggards(int64_t step) const;

  // Snapshot holds (BSP only; no-ops otherwise): Hold is FAILED_PRECONDITION when the step
  // is applied already; Release drops one hold and says whether there was one.
  absl::Status Hold(int64_t step);
  bool Release(int64_t step);
  bool Held(int64_t step) const { return capture_at_.count(step) > 0; }

  // State transfer: consistency restarts at `step` as if every worker had pushed exactly
  // the steps before it and (BSP) all were applied. Holds stay.
  void Reset(int64_t step);
  // Restore: clocks and applied steps from a snapshot header.
  void Restore(const TableSnapshotHeader& header);
  // Into a snapshot header: applied steps and every worker's clock.
  void Fill(TableSnapshotHeader* header) const;

  void Shutdown() { shutdown_ = true; }
  bool shut_down() const { return shutdown_; }

 private:
  // SSP/ASP: applied_steps_ up to the slowest worker's clock.
  void RaiseWatermark();
  // The smallest of clocks_ (which must not be empty).
  int64_t SlowestClock() const;

  const uint32_t table_id_;
  const ConsistencyConfig config_;
  std::map<int32_t, int64_t> clocks_;            // worker -> steps pushed
  std::map<int64_t, std::set<int32_t>> pushed_;  // BSP: step -> workers that pushed it
  int64_t applied_steps_ = 0;                    // see applied_steps()
  std::multiset<int64_t> capture_at_;            // BSP steps held for a capture
  bool shutdown_ = false;
};

}  // namespace pscluster::ps
