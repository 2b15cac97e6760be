// DenseStateBuilder, and the DenseTable methods that export and import a whole state.
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/ps/table/dense_table.h"

namespace pscluster::ps {

DenseStateBuilder::DenseStateBuilder(uint32_t table_id, Range range, int num_slots)
    : table_id_(table_id) {
  state_.range = range;
  state_.values.resize(range.size());
  state_.slots.assign(num_slots, std::vector<float>(range.size()));
}

absl::Status DenseStateBuilder::Add(uint64_t begin, absl::Span<const float> values,
                                    uint64_t num_slots, absl::Span<const float> slots) {
  const Range range = state_.range;
  const uint64_t n = values.size();
  if (num_slots != state_.slots.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table_id_, ": chunk at ", begin, " carries ", num_slots,
                     " optimizer slots; the table's optimizer keeps ", state_.slots.size()));
  }
  if (slots.size() != num_slots * n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_id_, ": chunk at ", begin, " carries ", slots.size(), " slot values for ",
        n, " values and ", num_slots, " slots; expected ", num_slots * n));
  }
  if (begin < range.begin || begin > range.end || n > range.end - begin) {
    return absl::InvalidArgumentError(absl::StrCat("table ", table_id_, ": chunk [", begin, ", ",
                                                   begin + n, ") lies outside this shard's range [",
                                                   range.begin, ", ", range.end, ")"));
  }
  if (n == 0) return absl::OkStatus();
  auto next = runs_.lower_bound(begin);  // first run starting at or after begin
  if ((next != runs_.end() && next->first < begin + n) ||
      (next != runs_.begin() && std::prev(next)->second > begin)) {
    const auto& other = (next != runs_.end() && next->first < begin + n) ? *next : *std::prev(next);
    return absl::InvalidArgumentError(absl::StrCat("table ", table_id_, ": chunk [", begin, ", ",
                                                   begin + n, ") overlaps the earlier chunk [",
                                                   other.first, ", ", other.second, ")"));
  }
  runs_[begin] = begin + n;
  const uint64_t at = begin - range.begin;
  std::memcpy(state_.values.data() + at, values.data(), n * sizeof(float));
  for (uint64_t k = 0; k < num_slots; ++k) {
    std::memcpy(state_.slots[k].data() + at, slots.data() + k * n, n * sizeof(float));
  }
  return absl::OkStatus();
}

absl::StatusOr<DenseState> DenseStateBuilder::Finish(int64_t updates) {
  uint64_t expect = state_.range.begin;
  for (const auto& [begin, end] : runs_) {
    if (begin != expect) break;
    expect = end;
  }
  if (expect != state_.range.end) {
    auto next = runs_.upper_bound(expect);
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table_id_, ": the chunks leave values [", expect, ", ",
        next == runs_.end() ? state_.range.end : next->first, ") of this shard's range [",
        state_.range.begin, ", ", state_.range.end, ") missing"));
  }
  state_.updates = updates;
  return std::move(state_);
}

DenseStateBuilder DenseTable::StateBuilder() const {
  return DenseStateBuilder(id(), range_, num_slots());
}

absl::StatusOr<DenseState> DenseTable::ExportState(int64_t step, absl::Time deadline) {
  if (step < 0) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat("table ", id(), ": step must be >= 0, got ", step)));
  }
  DenseState state;  // allocated before the lock: the pause is only the copy
  state.range = range_;
  state.values.resize(range_.size());
  state.slots.assign(num_slots(), std::vector<float>(range_.size()));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AwaitStateLocked(step, deadline));
  state.updates = updates_;
  std::copy(values_.begin(), values_.end(), state.values.begin());
  for (size_t k = 0; k < slots_.size(); ++k) {
    std::copy(slots_[k].begin(), slots_[k].end(), state.slots[k].begin());
  }
  return state;
}

namespace {

// INVALID_ARGUMENT naming `what` and the global index of its first NaN/Inf, if any.
absl::Status CheckFinite(uint32_t table, absl::string_view what, uint64_t first_index,
                         absl::Span<const float> values) {
  size_t bad = core::FirstNonFinite(values);
  if (bad == values.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("table ", table, ": imported ", what,
                                                 " holds a non-finite value (", values[bad],
                                                 ") at index ", first_index + bad));
}

}  // namespace

absl::Status DenseTable::ImportState(int64_t step, DenseState state) {
  auto invalid = [this](auto... parts) {
    return Reject(absl::InvalidArgumentError(absl::StrCat("table ", id(), ": ", parts...)));
  };
  if (step < 0) return invalid("step must be >= 0, got ", step);
  if (state.updates < 0) return invalid("updates must be >= 0, got ", state.updates);
  if (!(state.range == range_) || state.values.size() != range_.size()) {
    return invalid("imported state covers [", state.range.begin, ", ", state.range.end, ") with ",
                   state.values.size(), " values; this shard holds [", range_.begin, ", ",
                   range_.end, ")");
  }
  if (state.slots.size() != slots_.size()) {
    return invalid("imported state has ", state.slots.size(),
                   " optimizer slots; the table's optimizer keeps ", slots_.size());
  }
  for (size_t k = 0; k < state.slots.size(); ++k) {
    if (state.slots[k].size() != range_.size()) {
      return invalid("imported optimizer slot ", k, " holds ", state.slots[k].size(),
                     " values, not ", range_.size());
    }
  }
  if (absl::Status s = CheckFinite(id(), "values", range_.begin, state.values); !s.ok()) {
    return Reject(s);
  }
  for (size_t k = 0; k < state.slots.size(); ++k) {
    absl::Status s =
        CheckFinite(id(), absl::StrCat("optimizer slot ", k), range_.begin, state.slots[k]);
    if (!s.ok()) return Reject(s);
  }
  absl::MutexLock lock(&mu_);
  if (cow_) CopyBlocksLocked(0, range_.size());
  values_.swap(state.values);
  slots_.swap(state.slots);
  updates_ = state.updates;
  pending_.clear();
  spare_.clear();
  ResetClocksLocked(step);
  return absl::OkStatus();
}  // the replaced state is freed here, after the lock is released

}  // namespace pscluster::ps
