// A sparse table's side of the disk tier (disk_tier.h): rows moved to disk when the shard's
// RAM budget is passed and brought back when a push updates them, pulls that read them
// where they are, and the eviction sweep over the rows on disk. A row is in RAM or on disk,
// never both, so the table's state is the same whichever tier holds a row: moving rows
// changes nothing a pull, a snapshot or a fingerprint sees.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {
namespace {
// Rows moved to disk per write: a failed write leaves the earlier ones moved, which is
// harmless, and the batch's buffer stays small.
constexpr size_t kDemoteChunk = 8192;
// Rows sampled to find the step below which the coldest rows are.
constexpr size_t kColdSample = 65536;
}  // namespace

void SparseTable::ChargeRamLocked() {
  if (cold_ == nullptr) return;
  const int64_t now = static_cast<int64_t>(rows_.size() * row_bytes_);
  cold_->tier().ChargeRam(now - charged_);
  charged_ = now;
}

absl::Status SparseTable::PromoteLocked(const Grads& grads) {
  if (cold_ == nullptr) return absl::OkStatus();
  std::vector<uint64_t> missing;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!rows_.Contains(grads.key(i))) missing.push_back(grads.key(i));
  }
  ram_hits_ += grads.size() - missing.size();
  if (missing.empty() || cold_->size() == 0) return absl::OkStatus();
  // In key order, RocksDB's order: its look-ups and the deletes' inserts into its memtable
  // then go from one key to the next instead of searching afresh.
  std::sort(missing.begin(), missing.end());
  std::vector<uint64_t> promoted;
  ColdRows::Batch gone(*cold_);
  absl::Status s = cold_->Get(missing, [&](size_t j, const ColdRows::Row& row) {
    const RowStore::Row r = rows_.Insert(missing[j], [&](float* data) {
      std::memcpy(data, row.floats, rows_.width() * sizeof(float));
    });
    *r.updates = row.updates;
    *r.step = row.step;
    if (r.version != nullptr) *r.version = row.version;
    promoted.push_back(missing[j]);
    gone.Delete(missing[j]);
  });
  if (s.ok()) s = cold_->Commit(gone);
  if (!s.ok()) {  // the rows stay on disk only: the newest first keeps RAM's order as it was
    for (auto it = promoted.rbegin(); it != promoted.rend(); ++it) rows_.Erase(*it);
    return Reject(s);
  }
  disk_reads_ += promoted.size();
  rows_from_disk_ += promoted.size();
  ChargeRamLocked();
  return absl::OkStatus();
}

absl::Status SparseTable::MakeRoomLocked(uint64_t new_rows, const Grads* current) {
  if (cold_ == nullptr) return absl::OkStatus();
  ChargeRamLocked();
  DiskTier& tier = cold_->tier();
  const int64_t budget = static_cast<int64_t>(tier.options().memory_bytes);
  const int64_t incoming = static_cast<int64_t>((staged_new_rows_ + new_rows) * row_bytes_);
  const int64_t over = tier.ram_bytes() + incoming - budget;
  if (over <= 0) return absl::OkStatus();
  // Beyond what is needed, a sixteenth of the budget: not every push moves rows.
  const uint64_t n = (over + budget / 16 + row_bytes_ - 1) / row_bytes_;
  const absl::Status s = DemoteLocked(n, current);
  if (s.ok() || tier.ram_bytes() + incoming <= budget) return absl::OkStatus();
  return Reject(s);
}

absl::Status SparseTable::DemoteLocked(uint64_t n, const Grads* current) {
  std::vector<uint64_t> keys = ColdestLocked(n, current);
  std::sort(keys.begin(), keys.end());  // RocksDB's order (see PromoteLocked)
  for (size_t at = 0; at < keys.size(); at += kDemoteChunk) {
    const size_t end = std::min(keys.size(), at + kDemoteChunk);
    ColdRows::Batch batch(*cold_);
    for (size_t i = at; i < end; ++i) {
      const RowStore::Row r = rows_.Find(keys[i]);
      batch.Put(keys[i], ColdRows::Row{*r.updates, *r.step, r.version ? *r.version : 0,
                                       reinterpret_cast<const char*>(r.data)});
    }
    RETURN_IF_ERROR(cold_->Commit(batch));
    for (size_t i = at; i < end; ++i) rows_.Erase(keys[i]);
    rows_to_disk_ += end - at;
    ChargeRamLocked();
  }
  return absl::OkStatus();
}

std::vector<uint64_t> SparseTable::ColdestLocked(uint64_t n, const Grads* current) const {
  // The step below which about n rows are, from a sample (every stride-th row), then the
  // rows below it and at it, oldest first: no sort of every row.
  std::vector<int64_t> sample;
  const size_t stride = std::max<size_t>(1, rows_.size() / kColdSample);
  size_t i = 0;
  rows_.ForEach([&](uint64_t key, const RowStore::Row& row) {
    if (i++ % stride == 0 && !SparedLocked(key, current)) sample.push_back(*row.step);
  });
  if (sample.empty()) return {};
  std::sort(sample.begin(), sample.end());
  const int64_t threshold = sample[std::min<uint64_t>(
      sample.size() - 1, n * sample.size() / std::max<size_t>(1, rows_.size()))];
  std::vector<uint64_t> below, at;
  rows_.ForEach([&](uint64_t key, const RowStore::Row& row) {
    if (*row.step > threshold || SparedLocked(key, current)) return;
    (*row.step < threshold ? below : at).push_back(key);
  });
  if (below.size() > n) below.resize(n);
  at.resize(std::min<uint64_t>(at.size(), n - below.size()));
  below.insert(below.end(), at.begin(), at.end());
  return below;
}

bool SparseTable::SparedLocked(uint64_t key, const Grads* current) const {
  if (current != nullptr && current->Find(key) != nullptr) return true;
  for (const auto& [step, pushes] : pending_) {
    for (const auto& [worker, grads] : pushes) {
      if (grads.Find(key) != nullptr) return true;
    }
  }
  for (const auto& [step, pushes] : parts_) {
    for (const auto& [worker, parts] : pushes) {
      if (parts.grads.Find(key) != nullptr) return true;
    }
  }
  return false;
}

absl::Status SparseTable::ReadColdLocked(absl::Span<const uint64_t> keys,
                                         const std::vector<size_t>& missing,
                                         absl::Span<float> out) const {
  std::vector<uint64_t> ids(missing.size());
  for (size_t j = 0; j < missing.size(); ++j) ids[j] = keys[missing[j]];
  std::vector<bool> found(missing.size());
  uint64_t read = 0;
  if (!ids.empty() && cold_->size() > 0) {
    RETURN_IF_ERROR(cold_->Get(ids, [&](size_t j, const ColdRows::Row& row) {
      std::memcpy(out.data() + missing[j] * dim_, row.floats, dim_ * sizeof(float));
      found[j] = true;
      ++read;
    }));
  }
  for (size_t j = 0; j < missing.size(); ++j) {
    if (found[j]) continue;  // else never pushed: the initial row, computed, not stored
    core::InitSparseRow(spec_.initializer(), ids[j],
                        absl::MakeSpan(out.data() + missing[j] * dim_, dim_));
  }
  disk_reads_ += read;
  return absl::OkStatus();
}

void SparseTable::SweepColdLocked(int64_t upto) {
  if (cold_ == nullptr || cold_->size() == 0) return;
  std::vector<uint64_t> idle;
  ColdRows::Batch batch(*cold_);
  absl::Status s = cold_->ForEach([&](uint64_t key, const ColdRows::Row& row) {
    if (row.step > upto) return;
    idle.push_back(key);
    batch.Delete(key);
  });
  if (s.ok()) s = cold_->Commit(batch);
  if (!s.ok()) {
    LogWarning("table %u: the idle rows on disk stay until a later sweep: %s", id(),
               s.ToString().c_str());
    return;
  }
  for (uint64_t key : idle) {
    if (rows_.tracks_versions()) RememberRemovedLocked(key);
  }
  lifecycle_.Evicted(idle.size());
}

void SparseTable::CaptureColdLocked(std::optional<uint64_t> since, TableImage* image) const {
  if (cold_ == nullptr || cold_->size() == 0) return;
  const size_t row_len = rows_.width();
  absl::Status s = cold_->ForEach([&](uint64_t key, const ColdRows::Row& row) {
    if (since && row.version <= *since) return;
    image->keys.push_back(key);
    image->row_updates.push_back(row.updates);
    if (lifecycle_.tracks_steps()) image->row_steps.push_back(row.step);
    const size_t at = image->row_data.size();
    image->row_data.resize(at + row_len);
    std::memcpy(image->row_data.data() + at, row.floats, row_len * sizeof(float));
  });
  if (!s.ok()) image->error = s;
}

void SparseTable::FillStatsLocked(TableStats* stats) const {
  lifecycle_.FillStats(stats);
  if (cold_ == nullptr) return;
  stats->set_memory_bytes(rows_.size() * rows_.width() * sizeof(float) + lifecycle_.bytes());
  stats->set_rows_on_disk(cold_->size());
  stats->set_disk_bytes(cold_->bytes());
  stats->set_ram_hits(ram_hits_);
  stats->set_disk_reads(disk_reads_);
  stats->set_rows_to_disk(rows_to_disk_);
  stats->set_rows_from_disk(rows_from_disk_);
}

}  // namespace pscluster::ps
