#include "server/ps/sparse_table.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"

namespace pscluster::ps {

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(const TableSpec& spec,
                                                                 uint32_t shard_id,
                                                                 uint32_t num_shards) {
  auto optimizer = core::MakeOptimizer(spec.optimizer());
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<SparseTable>(
      new SparseTable(spec, *std::move(optimizer), shard_id, num_shards));
}

SparseTable::SparseTable(const TableSpec& spec, std::unique_ptr<core::Optimizer> optimizer,
                         uint32_t shard_id, uint32_t num_shards)
    : Table(spec, std::move(optimizer)),
      shard_id_(shard_id),
      num_shards_(num_shards),
      dim_(spec.dim()) {}

absl::Status SparseTable::CheckKeys(absl::Span<const uint64_t> keys) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (spec_.key_space() != 0 && keys[i] >= spec_.key_space()) {
      return Reject(
          absl::OutOfRangeError(absl::StrCat("table ", id(), ": keys[", i, "]=", keys[i],
                                             " is outside key_space ", spec_.key_space())));
    }
    if (uint32_t owner = SparseShardOf(keys[i], num_shards_); owner != shard_id_) {
      return Reject(absl::InvalidArgumentError(
          absl::StrCat("table ", id(), ": keys[", i, "]=", keys[i], " belongs to shard ", owner,
                       ", not shard ", shard_id_, " (route keys with SparseShardOf)")));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseTable::Push(int32_t worker, int64_t step, absl::Span<const uint64_t> keys,
                               absl::Span<const float> grads, bool* skipped) {
  *skipped = false;
  if (grads.size() != keys.size() * dim_) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat("table ", id(), ": grads holds ", grads.size(), " values, expected keys (",
                     keys.size(), ") x dim (", dim_, ") = ", keys.size() * dim_)));
  }
  RETURN_IF_ERROR(CheckKeys(keys));
  const size_t bad = core::FirstNonFinite(grads);
  const bool finite = bad == grads.size();
  if (!finite && !spec_.skip_nonfinite()) return NonFinite(grads[bad], bad);
  Grads merged;  // duplicate keys summed in request order
  if (finite) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<float>& g = merged[keys[i]];
      if (g.empty()) g.assign(dim_, 0.0f);
      for (size_t j = 0; j < dim_; ++j) g[j] += grads[i * dim_ + j];
    }
  }

  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckPushLocked(worker, step));
  bytes_pushed_ += grads.size() * sizeof(float);
  if (!finite) {
    *skipped = true;
    nonfinite_skipped_++;
  } else if (bsp()) {
    pending_[step][worker] = std::move(merged);
  } else {
    for (const auto& [key, g] : merged) ApplyLocked(key, g);
  }
  RecordPushLocked(worker, step);
  return absl::OkStatus();
}

SparseTable::Row& SparseTable::RowLocked(uint64_t key) {
  auto [it, inserted] = rows_.try_emplace(key);
  if (inserted) {
    Row& row = it->second;
    row.data.resize(dim_ * (1 + optimizer_->num_slots()));
    core::InitSparseRow(spec_.initializer(), key, absl::MakeSpan(row.data.data(), dim_));
    for (int k = 0; k < optimizer_->num_slots(); ++k) {
      std::fill_n(row.data.begin() + dim_ * (1 + k), dim_, optimizer_->slot_initial_value(k));
    }
  }
  return it->second;
}

void SparseTable::ApplyLocked(uint64_t key, const std::vector<float>& grad) {
  Row& row = RowLocked(key);
  float* slots[8];
  for (int k = 0; k < optimizer_->num_slots(); ++k) slots[k] = row.data.data() + dim_ * (1 + k);
  optimizer_->Apply(row.data.data(), grad.data(), slots, dim_, ++row.updates);
}

void SparseTable::ApplyBspStepLocked(int64_t step) {
  auto it = pending_.find(step);
  if (it == pending_.end()) return;
  Grads sum;  // per key: the workers' rows added in worker-id order
  for (auto& [worker, grads] : it->second) {
    for (auto& [key, g] : grads) {
      auto [s, inserted] = sum.try_emplace(key, std::move(g));
      if (!inserted) {
        for (size_t j = 0; j < dim_; ++j) s->second[j] += g[j];
      }
    }
  }
  pending_.erase(it);
  for (const auto& [key, g] : sum) ApplyLocked(key, g);
}

absl::Status SparseTable::Read(absl::Span<const uint64_t> keys, absl::Span<float> out) {
  RETURN_IF_ERROR(CheckKeys(keys));
  absl::MutexLock lock(&mu_);  // exclusive: reading may create rows
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(out.data() + i * dim_, RowLocked(keys[i]).data.data(), dim_ * sizeof(float));
  }
  bytes_pulled_ += out.size() * sizeof(float);
  return absl::OkStatus();
}

void SparseTable::CaptureLocked(TableImage* image) const {
  const size_t row_len = dim_ * (1 + optimizer_->num_slots());
  image->header.set_num_rows(rows_.size());
  image->keys.reserve(rows_.size());
  image->row_updates.reserve(rows_.size());
  image->row_data.resize(rows_.size() * row_len);
  float* out = image->row_data.data();
  for (const auto& [key, row] : rows_) {
    image->keys.push_back(key);
    image->row_updates.push_back(row.updates);
    std::memcpy(out, row.data.data(), row_len * sizeof(float));
    out += row_len;
  }
}

void SparseTable::RestoreRow(uint64_t key, int64_t updates, const float* data) {
  if (SparseShardOf(key, num_shards_) != shard_id_) return;
  absl::MutexLock lock(&mu_);
  Row& row = rows_[key];
  row.updates = updates;
  row.data.assign(data, data + dim_ * (1 + optimizer_->num_slots()));
}

void SparseTable::FillInfoLocked(TableInfo* info) const { info->set_num_rows(rows_.size()); }

}  // namespace pscluster::ps
