#include "server/ps/table.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pscluster::ps {
Table::Table(TableSpec spec, std::unique_ptr<core::Optimizer> optimizer)
    : spec_(std::move(spec)), optimizer_(std::move(optimizer)) {}

void Table::AddWorker(int32_t worker_id) {
  absl::MutexLock lock(&mu_);
  if (clocks_.count(worker_id)) return;
  // A late joiner starts at the current step, so it does not hold the others back.
  int64_t start = applied_steps_;
  if (!bsp() && !clocks_.empty()) {
    start = std::min_element(clocks_.begin(), clocks_.end(), [](auto& a, auto& b) {
              return a.second < b.second;
            })->second;
  }
  clocks_[worker_id] = start;
}

absl::Status Table::CheckPushLocked(int32_t worker, int64_t step) {
  if (step < 0) {
    return Reject(absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step)));
  }
  if (!bsp()) return absl::OkStatus();
  if (step < applied_steps_) {
    return Reject(absl::FailedPreconditionError(absl::StrCat(
        "table ", id(), ": step ", step, " is already applied (BSP applied_steps=", applied_steps_,
        "); pull the current parameters and push step ", applied_steps_)));
  }
  if (step >= applied_steps_ + kMaxBspStepsAhead) {
    return Reject(absl::FailedPreconditionError(
        absl::StrCat("table ", id(), ": step ", step, " is more than ", kMaxBspStepsAhead,
                     " steps ahead of the oldest unapplied BSP step ", applied_steps_)));
  }
  auto it = bsp_pushed_.find(step);
  if (it != bsp_pushed_.end() && it->second.count(worker)) {
    return Reject(absl::FailedPreconditionError(
        absl::StrCat("table ", id(), ": worker ", worker, " already pushed step ", step)));
  }
  return absl::OkStatus();
}

void Table::RecordPushLocked(int32_t worker, int64_t step) {
  pushes_++;
  int64_t& clock = clocks_[worker];
  clock = std::max(clock, step + 1);
  if (!bsp()) return;
  bsp_pushed_[step].insert(worker);
  DrainBspLocked();
}

void Table::DrainBspLocked() {
  while (!capture_at_.count(applied_steps_)) {
    auto it = bsp_pushed_.find(applied_steps_);
    if (it == bsp_pushed_.end()) return;
    for (const auto& [w, unused] : clocks_) {
      if (!it->second.count(w)) return;
    }
    ApplyBspStepLocked(applied_steps_);
    bsp_pushed_.erase(it);
    ++applied_steps_;
  }
}

absl::Status Table::HoldStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (!bsp()) return absl::OkStatus();
  if (applied_steps_ > step) {
    return absl::FailedPreconditionError(absl::StrCat("table ", id(), " has already applied step ",
                                                      step, " (applied_steps=", applied_steps_,
                                                      "); snapshot a step >= ", applied_steps_));
  }
  capture_at_.insert(step);
  return absl::OkStatus();
}

void Table::ReleaseStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  auto it = capture_at_.find(step);
  if (it == capture_at_.end()) return;
  capture_at_.erase(it);
  DrainBspLocked();
}

absl::StatusOr<std::unique_ptr<TableImage>> Table::Capture(int64_t step, absl::Time deadline,
                                                           absl::Duration* pause) {
  auto image = std::make_unique<TableImage>();
  PrepareImage(image.get());
  absl::MutexLock lock(&mu_);
  if (bsp()) {
    auto held = capture_at_.find(step);
    if (held == capture_at_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", id(), ": Capture(", step, ") without HoldStep(", step, ")"));
    }
    auto reached = [this, step]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return applied_steps_ >= step || shutdown_;
    };
    bool ok = mu_.AwaitWithDeadline(absl::Condition(&reached), deadline) && !shutdown_;
    capture_at_.erase(capture_at_.find(step));
    if (!ok) {
      DrainBspLocked();
      return absl::DeadlineExceededError(absl::StrCat("table ", id(), ": snapshot of step ", step,
                                                      " waited for ",
                                                      DescribeLaggardsLocked(step)));
    }
  }
  absl::Time start = absl::Now();
  TableSnapshotHeader& h = image->header;
  *h.mutable_spec() = spec_;
  h.set_applied_steps(applied_steps_);
  h.set_num_slots(optimizer_->num_slots());
  for (const auto& [w, clock] : clocks_) {
    WorkerClock* c = h.add_clocks();
    c->set_worker_id(w);
    c->set_clock(clock);
  }
  CaptureLocked(image.get());
  *pause = absl::Now() - start;
  if (bsp()) DrainBspLocked();  // steps that waited for the capture apply now
  return image;
}

void Table::RestoreClocks(const TableSnapshotHeader& header) {
  absl::MutexLock lock(&mu_);
  applied_steps_ = header.applied_steps();
  for (const WorkerClock& c : header.clocks()) clocks_[c.worker_id()] = c.clock();
}

uint64_t TableImage::bytes() const {
  uint64_t n = header.ByteSizeLong() + keys.size() * 16 + row_data.size() * sizeof(float);
  for (const auto& a : arrays) n += a.size() * sizeof(float);
  return n;
}

bool Table::PullableLocked(int64_t step) const {
  if (shutdown_) return true;
  switch (spec_.consistency().mode()) {
    case ConsistencyConfig::BSP:
      return applied_steps_ >= step;
    case ConsistencyConfig::SSP:
      for (const auto& [w, clock] : clocks_) {
        if (clock < step - spec_.consistency().staleness()) return false;
      }
      return true;
    default:
      return true;
  }
}

std::string Table::DescribeLaggardsLocked(int64_t step) const {
  int64_t need = bsp() ? step : step - spec_.consistency().staleness();
  std::string out;
  for (const auto& [w, clock] : clocks_) {
    if (clock < need)
      absl::StrAppend(&out, out.empty() ? "" : ", ", "worker ", w, " (clock ", clock, ")");
  }
  return absl::StrCat(out, bsp() ? absl::StrCat("; BSP applied_steps=", applied_steps_) : "");
}

absl::Status Table::AwaitPullableLocked(int64_t step, absl::Time deadline, absl::string_view what) {
  auto ready = [this, step]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return PullableLocked(step); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return Reject(absl::DeadlineExceededError(
        absl::StrCat("table ", id(), ": ", what, " at step ", step, " waited for ",
                     ConsistencyConfig::Mode_Name(spec_.consistency().mode()),
                     " on: ", DescribeLaggardsLocked(step))));
  }
  if (shutdown_) return absl::UnavailableError("parameter server is shutting down");
  return absl::OkStatus();
}

absl::Status Table::AwaitPullable(int64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AwaitPullableLocked(step, deadline, "pull"); !s.ok()) return s;
  pulls_++;
  return absl::OkStatus();
}

absl::Status Table::AwaitStateLocked(int64_t step, absl::Time deadline) {
  if (absl::Status s = AwaitPullableLocked(step, deadline, "export"); !s.ok()) return s;
  if (bsp() && applied_steps_ > step) {
    return Reject(absl::FailedPreconditionError(
        absl::StrCat("table ", id(), ": cannot export step ", step,
                     ", the table has already applied it (BSP applied_steps=", applied_steps_,
                     "); export step ", applied_steps_, " or stop the workers before it")));
  }
  return absl::OkStatus();
}

void Table::ResetClocksLocked(int64_t step) {
  for (auto& [w, clock] : clocks_) clock = step;
  applied_steps_ = step;
  bsp_pushed_.clear();
}

void Table::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

TableInfo Table::Info() const {
  absl::ReaderMutexLock lock(&mu_);
  TableInfo info;
  *info.mutable_spec() = spec_;
  info.set_applied_steps(applied_steps_);
  FillInfoLocked(&info);
  return info;
}

TableStats Table::Stats() const {
  TableStats s;
  *s.mutable_info() = Info();
  s.set_pushes(pushes_);
  s.set_pulls(pulls_);
  s.set_bytes_pushed(bytes_pushed_);
  s.set_bytes_pulled(bytes_pulled_);
  s.set_nonfinite_pushes_skipped(nonfinite_skipped_);
  s.set_rejected_requests(rejected_);
  return s;
}

std::map<int32_t, int64_t> Table::Clocks() const {
  absl::ReaderMutexLock lock(&mu_);
  return clocks_;
}

absl::Status Table::Reject(absl::Status status) const {
  rejected_++;
  return status;
}

absl::Status Table::NonFinite(float value, uint64_t index) const {
  return Reject(absl::InvalidArgumentError(
      absl::StrCat("table ", id(), ": gradient holds a non-finite value (", value, ") at index ",
                   index, "; fix the gradient or create the table with skip_nonfinite")));
}

}  // namespace pscluster::ps
