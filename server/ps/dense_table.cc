#include "server/ps/dense_table.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/ps/initializer.h"

namespace pscluster::ps {

absl::StatusOr<std::unique_ptr<DenseTable>> DenseTable::Create(const TableSpec& spec,
                                                               Range range) {
  auto optimizer = MakeOptimizer(spec.optimizer());
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<DenseTable>(new DenseTable(spec, *std::move(optimizer), range));
}

DenseTable::DenseTable(const TableSpec& spec, std::unique_ptr<Optimizer> optimizer, Range range)
    : Table(spec, std::move(optimizer)), range_(range), values_(range.size()) {
  InitDense(spec.initializer(), range.begin, absl::MakeSpan(values_));
  for (int k = 0; k < optimizer_->num_slots(); ++k) {
    slots_.emplace_back(range.size(), optimizer_->slot_initial_value(k));
  }
}

absl::Status DenseTable::CheckRange(uint64_t begin, uint64_t length) const {
  if (begin < range_.begin || begin > range_.end || length > range_.end - begin) {
    return Reject(absl::OutOfRangeError(absl::StrCat(
        "table ", id(), ": values [", begin, ", ", begin + length, ") are outside this shard's range [",
        range_.begin, ", ", range_.end, ") of a tensor of ", spec_.size(), " values")));
  }
  return absl::OkStatus();
}

absl::Status DenseTable::Push(int32_t worker, int64_t step, uint64_t begin,
                              const std::vector<absl::Span<const float>>& chunks,
                              bool* skipped) {
  *skipped = false;
  uint64_t total = 0;
  bool finite = true;
  for (const auto& c : chunks) {
    for (size_t i = 0; i < c.size() && finite; ++i) {
      if (!std::isfinite(c[i])) {
        if (!spec_.skip_nonfinite()) return NonFinite(c[i], begin + total + i);
        finite = false;
      }
    }
    total += c.size();
  }
  if (absl::Status s = CheckRange(begin, total); !s.ok()) return s;

  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPushLocked(worker, step); !s.ok()) return s;
  bytes_pushed_ += total * sizeof(float);
  if (!finite) {
    *skipped = true;
    nonfinite_skipped_++;
  } else if (bsp()) {
    std::vector<float>& staged = pending_[step][worker];
    staged.assign(range_.size(), 0.0f);
    uint64_t at = begin - range_.begin;
    for (const auto& c : chunks) {
      std::memcpy(staged.data() + at, c.data(), c.size() * sizeof(float));
      at += c.size();
    }
  } else {
    ++updates_;
    uint64_t at = begin - range_.begin;
    for (const auto& c : chunks) {
      ApplyLocked(at, c);
      at += c.size();
    }
  }
  RecordPushLocked(worker, step);
  return absl::OkStatus();
}

void DenseTable::ApplyLocked(uint64_t local, absl::Span<const float> grad) {
  float* slots[8];
  for (size_t k = 0; k < slots_.size(); ++k) slots[k] = slots_[k].data() + local;
  optimizer_->Apply(values_.data() + local, grad.data(), slots, grad.size(), updates_);
}

void DenseTable::ApplyBspStepLocked(int64_t step) {
  auto it = pending_.find(step);
  if (it == pending_.end()) return;  // every push of this step was a skipped non-finite one
  std::vector<float> sum = std::move(it->second.begin()->second);
  for (auto w = std::next(it->second.begin()); w != it->second.end(); ++w) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += w->second[i];
  }
  pending_.erase(it);
  ++updates_;
  ApplyLocked(0, sum);
}

absl::Status DenseTable::Read(uint64_t begin, absl::Span<float> out) const {
  if (absl::Status s = CheckRange(begin, out.size()); !s.ok()) return s;
  absl::ReaderMutexLock lock(&mu_);
  std::memcpy(out.data(), values_.data() + (begin - range_.begin), out.size() * sizeof(float));
  bytes_pulled_ += out.size() * sizeof(float);
  return absl::OkStatus();
}

void DenseTable::FillInfoLocked(TableInfo* info) const {
  info->set_shard_begin(range_.begin);
  info->set_shard_end(range_.end);
}

}  // namespace pscluster::ps
