// A table held by one shard: parameters, optimizer state next to them, and the consistency
// clock of every registered worker. DenseTable and SparseTable add the storage.
//
// Thread-safe: every public method may be called concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"
#include "server/ps/optimizer.h"

namespace pscluster::ps {

// Under BSP a worker may push at most this many steps beyond the oldest unapplied step.
inline constexpr int64_t kMaxBspStepsAhead = 4;

// Index of the first NaN/Inf in `values`, or values.size() when all are finite. Scans in
// vectorisable blocks (integer exponent test), so it runs near memory bandwidth.
size_t FirstNonFinite(absl::Span<const float> values);

// Maps the wire optimizer config (zeros meaning defaults) to validated options.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config);

class Table {
 public:
  virtual ~Table() = default;
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableSpec& spec() const { return spec_; }
  uint32_t id() const { return spec_.table_id(); }

  // Adds a worker to the set whose clocks bound consistency. Idempotent.
  void AddWorker(int32_t worker_id);

  // Blocks until `worker` may read at `step` under the table's consistency mode, or
  // returns DEADLINE_EXCEEDED naming the workers waited for (or UNAVAILABLE on shutdown).
  absl::Status AwaitPullable(int64_t step, absl::Time deadline);

  // Wakes every waiting pull with UNAVAILABLE; later waits fail at once.
  void Shutdown();

  TableInfo Info() const;
  TableStats Stats() const;
  std::map<int32_t, int64_t> Clocks() const;

 protected:
  Table(TableSpec spec, std::unique_ptr<Optimizer> optimizer);

  // Push bookkeeping, in this order under mu_: CheckPushLocked (stale, duplicate or
  // too-far-ahead steps) before touching state, then RecordPushLocked, which advances the
  // worker's clock and, under BSP, applies every step all workers have pushed.
  absl::Status CheckPushLocked(int32_t worker, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordPushLocked(int32_t worker, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool bsp() const { return spec_.consistency().mode() == ConsistencyConfig::BSP; }

  // BSP: sums the gradients pending for `step` in worker-id order, applies them, frees them.
  virtual void ApplyBspStepLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void FillInfoLocked(TableInfo* info) const ABSL_SHARED_LOCKS_REQUIRED(mu_) = 0;

  // Error helpers that also count the rejection.
  absl::Status Reject(absl::Status status) const;
  absl::Status NonFinite(float value, uint64_t index) const;

  mutable absl::Mutex mu_;
  const TableSpec spec_;
  const std::unique_ptr<Optimizer> optimizer_;

  mutable std::atomic<uint64_t> pushes_{0}, pulls_{0}, bytes_pushed_{0}, bytes_pulled_{0},
      nonfinite_skipped_{0}, rejected_{0};

 private:
  bool PullableLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::string DescribeLaggardsLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  std::map<int32_t, int64_t> clocks_ ABSL_GUARDED_BY(mu_);  // worker -> steps pushed
  std::map<int64_t, std::set<int32_t>> bsp_pushed_ ABSL_GUARDED_BY(mu_);
  int64_t applied_steps_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pscluster::ps
