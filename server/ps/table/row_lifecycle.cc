#include "server/ps/table/row_lifecycle.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pscluster::ps {
namespace {

constexpr uint32_t kDefaultCounters = uint32_t{1} << 20;
constexpr uint32_t kMaxCounters = uint32_t{1} << 22;
// Far beyond any run's steps, and small enough that step - evict_after_steps cannot wrap.
constexpr uint64_t kMaxEvictAfter = uint64_t{1} << 40;

}  // namespace

absl::Status ValidateRowPolicy(const TableSpec& spec) {
  const SparseRowPolicy& p = spec.rows();
  const bool any =
      p.admit_after_pushes() != 0 || p.admission_counters() != 0 || p.evict_after_steps() != 0;
  if (any && spec.kind() != TableSpec::SPARSE) {
    return absl::InvalidArgumentError(
        "spec.rows (admission and eviction) applies to SPARSE tables only");
  }
  if (p.admit_after_pushes() > AdmissionSketch::kMaxCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.rows.admit_after_pushes must be <= ", AdmissionSketch::kMaxCount,
                     ", got ", p.admit_after_pushes()));
  }
  if (p.admission_counters() > kMaxCounters) {
    return absl::InvalidArgumentError(absl::StrCat("spec.rows.admission_counters must be <= ",
                                                   kMaxCounters, ", got ", p.admission_counters()));
  }
  if (p.evict_after_steps() > kMaxEvictAfter) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.rows.evict_after_steps must be <= ", kMaxEvictAfter, ", got ",
                     p.evict_after_steps()));
  }
  return absl::OkStatus();
}

namespace {

// The sketch's counters per hash; 0: no sketch (every id admitted at once).
uint32_t SketchCounters(const SparseRowPolicy& policy) {
  if (policy.admit_after_pushes() <= 1) return 0;
  return policy.admission_counters() == 0 ? kDefaultCounters : policy.admission_counters();
}

}  // namespace

uint64_t AdmissionSketchBytes(const SparseRowPolicy& policy) {
  return uint64_t{AdmissionSketch::kHashes} * SketchCounters(policy);
}

RowLifecycle::RowLifecycle(const SparseRowPolicy& policy)
    : admit_after_(policy.admit_after_pushes()),
      evict_after_(policy.evict_after_steps()),
      sweep_every_(std::max<int64_t>(1, static_cast<int64_t>(evict_after_ / 8))) {
  if (const uint32_t counters = SketchCounters(policy); counters > 0) {
    sketch_ = std::make_unique<AdmissionSketch>(counters);
  }
}

bool RowLifecycle::Admit(uint64_t key, uint32_t pushes) {
  const bool admitted = sketch_ == nullptr || sketch_->Add(key, pushes) >= admit_after_;
  ++(admitted ? admitted_ : not_admitted_);
  return admitted;
}

std::optional<int64_t> RowLifecycle::SweepAt(int64_t step) {
  if (evict_after_ == 0 || step % sweep_every_ != 0 || step <= last_sweep_) return std::nullopt;
  last_sweep_ = step;
  return step - static_cast<int64_t>(evict_after_);
}

void RowLifecycle::FillStats(TableStats* stats) const {
  stats->set_rows_admitted(admitted_);
  stats->set_rows_not_admitted(not_admitted_);
  stats->set_rows_evicted(evicted_);
}

void RowLifecycle::Capture(TableSnapshotHeader* header) const {
  header->set_row_steps(tracks_steps());
  if (sketch_) header->set_admission_counts(sketch_->counts());
}

absl::Status RowLifecycle::Restore(const TableSnapshotHeader& header) {
  if (sketch_ == nullptr || header.admission_counts().empty()) return absl::OkStatus();
  return sketch_->Merge(header.admission_counts());
}

}  // namespace pscluster::ps
