#include "server/ps/table/table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace pscluster::ps {
namespace {

uint64_t NextIncarnation() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

}  // namespace

Table::Table(TableSpec spec, std::unique_ptr<core::Optimizer> optimizer)
    : spec_(std::move(spec)),
      optimizer_(std::move(optimizer)),
      incarnation_(NextIncarnation()),
      clock_(spec_.table_id(), spec_.consistency()) {}

void Table::AddWorker(int32_t worker_id) {
  absl::MutexLock lock(&mu_);
  clock_.AddWorker(worker_id);
}

void Table::RemoveWorker(int32_t worker_id) {
  absl::MutexLock lock(&mu_);
  clock_.RemoveWorker(worker_id);
  DropWorkerLocked(worker_id);
  DrainBspLocked();
}

absl::Status Table::CheckPushLocked(int32_t worker, int64_t step) {
  if (absl::Status s = clock_.CheckPush(worker, step); !s.ok()) return Reject(s);
  return absl::OkStatus();
}

void Table::RecordPushLocked(int32_t worker, int64_t step) {
  pushes_++;
  clock_.RecordPush(worker, step);
  DrainBspLocked();
}

Table::~Table() {
  absl::MutexLock lock(&mu_);
  parked_.WakeAll(absl::UnavailableError(
      absl::StrCat("table ", id(),
                   " was replaced (a restore, or a replica installing state) while the "
                   "pull waited; pull again")));
}

void Table::DrainBspLocked() {
  while (clock_.NextStepReady()) {
    ApplyBspStepLocked(clock_.applied_steps());
    clock_.StepApplied();
  }
  WakeParkedLocked();
}

void Table::WakeParkedLocked() {
  if (clock_.shut_down()) {
    parked_.WakeAll(shutdown_why_);
    return;
  }
  parked_.WakeReady([this](int64_t step)
                        ABSL_NO_THREAD_SAFETY_ANALYSIS { return clock_.Pullable(step); });
}

absl::Status Table::HoldStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  return clock_.Hold(step);
}

void Table::ReleaseStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (clock_.Release(step)) DrainBspLocked();
}

absl::StatusOr<std::unique_ptr<TableImage>> Table::Capture(int64_t step, absl::Time deadline,
                                                           absl::Duration* pause,
                                                           CaptureSince since) {
  auto image = std::make_unique<TableImage>();
  image->incarnation = incarnation_;
  image->since = since;
  PrepareImage(image.get());
  absl::MutexLock lock(&mu_);
  if (bsp()) {
    if (!clock_.Held(step)) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", id(), ": Capture(", step, ") without HoldStep(", step, ")"));
    }
    auto reached = [this, step]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return clock_.applied_steps() >= step || clock_.shut_down();
    };
    bool ok = mu_.AwaitWithDeadline(absl::Condition(&reached), deadline) && !clock_.shut_down();
    clock_.Release(step);
    if (clock_.shut_down()) return shutdown_why_;
    if (!ok) {
      DrainBspLocked();
      return absl::DeadlineExceededError(absl::StrCat("table ", id(), ": snapshot of step ", step,
                                                      " waited for ",
                                                      clock_.DescribeLaggards(step)));
    }
  }
  absl::Time start = absl::Now();
  TableSnapshotHeader& h = image->header;
  *h.mutable_spec() = spec_;
  h.set_num_slots(optimizer_->num_slots());
  clock_.Fill(&h);
  BeginCaptureLocked(image.get());
  *pause = absl::Now() - start;
  if (bsp()) DrainBspLocked();  // steps that waited for the capture apply now
  if (!image->error.ok()) return image->error;
  return image;
}

absl::StatusOr<std::unique_ptr<TableImage>> Table::CaptureNow() {
  auto image = std::make_unique<TableImage>();
  PrepareImage(image.get());
  absl::MutexLock lock(&mu_);
  if (bsp()) {
    for (const auto& [worker, clock] : clock_.clocks()) {
      if (clock > clock_.applied_steps()) {
        return absl::UnavailableError(absl::StrCat("table ", id(), ": BSP step ",
                                                   clock_.applied_steps(), " is pushed in part"));
      }
    }
  }
  if (PushInPartsLocked()) {
    return absl::UnavailableError(
        absl::StrCat("table ", id(), ": a push in parts has some of its parts only"));
  }
  TableSnapshotHeader& h = image->header;
  *h.mutable_spec() = spec_;
  h.set_num_slots(optimizer_->num_slots());
  clock_.Fill(&h);
  CaptureLocked(image.get());
  if (!image->error.ok()) return image->error;
  return image;
}

uint32_t Table::Fingerprint() const {
  TableImage image;
  PrepareImage(&image);
  {
    absl::ReaderMutexLock lock(&mu_);
    *image.header.mutable_spec() = spec_;
    image.header.set_num_slots(optimizer_->num_slots());
    clock_.Fill(&image.header);
    CaptureLocked(&image);
  }
  return FingerprintOf(image);
}

uint32_t Table::FingerprintOf(const TableImage& image) {
  std::string header;
  google::protobuf::io::StringOutputStream stream(&header);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  image.header.SerializeToCodedStream(&coded);
  coded.Trim();
  uint32_t crc = crc32c::Value(header.data(), header.size());
  auto extend = [&crc](const auto& v) {
    crc = crc32c::Extend(crc, reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
  };
  for (const StagingArray& a : image.arrays) extend(a);
  // Rows in key order: a sparse table's hash map iterates in an order of its own process
  // (absl seeds its hash per process), and replicas holding the same rows must agree.
  const size_t rows = image.keys.size();
  const size_t row_len = rows == 0 ? 0 : image.row_data.size() / rows;
  std::vector<size_t> order(rows);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return image.keys[a] < image.keys[b]; });
  for (size_t i : order) {
    extend(absl::MakeConstSpan(&image.keys[i], 1));
    extend(absl::MakeConstSpan(&image.row_updates[i], 1));
    extend(absl::MakeConstSpan(image.row_data.data() + i * row_len, row_len));
    if (!image.row_steps.empty()) extend(absl::MakeConstSpan(&image.row_steps[i], 1));
  }
  return crc;
}

void Table::RestoreClocks(const TableSnapshotHeader& header) {
  absl::MutexLock lock(&mu_);
  clock_.Restore(header);
  WakeParkedLocked();
}

uint64_t TableImage::bytes() const {
  uint64_t n = header.ByteSizeLong() + keys.size() * 16 + row_steps.size() * 8 +
               row_data.size() * sizeof(float) + removed.size() * 8;
  for (const auto& a : arrays) n += a.size() * sizeof(float);
  return n;
}

std::string Table::WaitedForLocked(int64_t step, absl::string_view what) const {
  return absl::StrCat("table ", id(), ": ", what, " at step ", step, " waited for ",
                      ConsistencyConfig::Mode_Name(spec_.consistency().mode()),
                      " on: ", clock_.DescribeLaggards(step));
}

absl::Status Table::AwaitPullableLocked(int64_t step, absl::Time deadline, absl::string_view what,
                                        const std::function<bool()>& cancelled) {
  auto ready = [this, step]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return clock_.Pullable(step); };
  for (;;) {
    const absl::Time until =
        cancelled ? std::min(deadline, absl::Now() + kCancelCheckEvery) : deadline;
    if (mu_.AwaitWithDeadline(absl::Condition(&ready), until)) break;
    if (until >= deadline) {
      return Reject(absl::DeadlineExceededError(WaitedForLocked(step, what)));
    }
    if (cancelled()) {
      return absl::CancelledError(
          absl::StrCat(WaitedForLocked(step, what), "; the caller cancelled the call"));
    }
  }
  if (clock_.shut_down()) return shutdown_why_;
  return absl::OkStatus();
}

void Table::CountWaitLocked(absl::Time since) {
  if (since == absl::InfinitePast()) return;
  pulls_waited_++;
  pull_wait_nanos_ += absl::ToInt64Nanoseconds(absl::Now() - since);
}

void Table::CountPullLocked(int64_t step) {
  const uint64_t staleness = clock_.Staleness(step);
  staleness_sum_ += staleness;
  if (staleness > staleness_max_) staleness_max_ = staleness;
  pulls_++;
}

absl::Status Table::AwaitPullable(int64_t step, absl::Time deadline,
                                  const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  // counted, and timed, only if it has to wait
  const absl::Time start = clock_.Pullable(step) ? absl::InfinitePast() : absl::Now();
  absl::Status ready = AwaitPullableLocked(step, deadline, "pull", cancelled);
  CountWaitLocked(start);
  RETURN_IF_ERROR(ready);
  CountPullLocked(step);
  return absl::OkStatus();
}

absl::StatusOr<bool> Table::PullableOrPark(int64_t step, absl::Time deadline,
                                           std::weak_ptr<Waiter> waiter, absl::Time parked_since) {
  absl::MutexLock lock(&mu_);
  if (clock_.shut_down()) return shutdown_why_;
  if (clock_.Pullable(step)) {
    CountWaitLocked(parked_since);
    CountPullLocked(step);
    return true;
  }
  if (absl::Now() >= deadline) {
    CountWaitLocked(parked_since);
    return Reject(absl::DeadlineExceededError(WaitedForLocked(step, "pull")));
  }
  parked_.Park(step, std::move(waiter));
  return false;
}

absl::Status Table::AwaitStateLocked(int64_t step, absl::Time deadline) {
  RETURN_IF_ERROR(AwaitPullableLocked(step, deadline, "export"));
  if (bsp() && clock_.applied_steps() > step) {
    return Reject(absl::FailedPreconditionError(absl::StrCat(
        "table ", id(), ": cannot export step ", step,
        ", the table has already applied it (BSP applied_steps=", clock_.applied_steps(),
        "); export step ", clock_.applied_steps(), " or stop the workers before it")));
  }
  return absl::OkStatus();
}

absl::Status Table::ShuttingDown() {
  return absl::UnavailableError("parameter server is shutting down");
}

void Table::Shutdown(absl::Status why) {
  absl::MutexLock lock(&mu_);
  shutdown_why_ = std::move(why);
  clock_.Shutdown();
  WakeParkedLocked();
}

TableInfo Table::Info() const {
  absl::ReaderMutexLock lock(&mu_);
  TableInfo info;
  *info.mutable_spec() = spec_;
  info.set_applied_steps(clock_.applied_steps());
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
  s.set_rows_pushed(rows_pushed_);
  s.set_rows_pulled(rows_pulled_);
  s.set_memory_bytes(MemoryBytes(s.info()));
  s.set_pulls_waited(pulls_waited_);
  s.set_pull_wait_seconds(static_cast<double>(pull_wait_nanos_) * 1e-9);
  s.set_staleness_sum(staleness_sum_);
  s.set_staleness_max(staleness_max_);
  absl::ReaderMutexLock lock(&mu_);
  s.set_pulls_parked(parked_.size());
  FillStatsLocked(&s);
  return s;
}

std::map<int32_t, int64_t> Table::Clocks() const {
  absl::ReaderMutexLock lock(&mu_);
  return clock_.clocks();
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

absl::Status Table::Overflow(uint64_t index) const {
  return Reject(absl::InvalidArgumentError(absl::StrCat(
      "table ", id(), ": the gradient at index ", index,
      " is finite but its update would make the parameter or its optimizer state non-finite "
      "(too large for learning rate ",
      spec_.optimizer().learning_rate(),
      "); fix the gradient, lower the learning rate or create the table with skip_nonfinite")));
}

float Table::LargeGradientThreshold() const {
  // Below it, no optimizer can overflow from parameters of ordinary magnitude (< 2^100):
  // |lr * g| < 2^16 and g^2 < 2^32. Larger gradients get the exact check.
  return 65536.0f / std::max(1.0f, spec_.optimizer().learning_rate());
}

}  // namespace pscluster::ps
