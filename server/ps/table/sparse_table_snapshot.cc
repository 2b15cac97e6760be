// A sparse table's side of snapshots and state transfer: what Capture copies (every row,
// or the changes since a version), and the rows and counts a restore puts back.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {

void SparseTable::CaptureLocked(TableImage* image) const {
  image->version = changes_;
  if (image->since && rows_.tracks_versions() && *image->since >= removed_known_from_) {
    CaptureChangesLocked(*image->since, image);
    return;
  }
  const size_t row_len = dim_ * (1 + optimizer_->num_slots());
  image->row_data.resize(rows_.size() * row_len);
  const uint64_t on_disk = cold_ != nullptr ? cold_->size() : 0;
  image->keys.reserve(rows_.size() + on_disk);
  image->row_updates.reserve(rows_.size() + on_disk);
  image->row_data.reserve((rows_.size() + on_disk) * row_len);
  if (lifecycle_.tracks_steps()) image->row_steps.reserve(rows_.size() + on_disk);
  lifecycle_.Capture(&image->header);
  float* out = image->row_data.data();
  rows_.ForEach([&](uint64_t key, const RowStore::Row& row) {
    image->keys.push_back(key);
    image->row_updates.push_back(*row.updates);
    if (lifecycle_.tracks_steps()) image->row_steps.push_back(*row.step);
    std::memcpy(out, row.data, row_len * sizeof(float));
    out += row_len;
  });
  CaptureColdLocked(std::nullopt, image);
  image->header.set_num_rows(image->keys.size());
}

void SparseTable::CaptureChangesLocked(uint64_t since, TableImage* image) const {
  const size_t row_len = dim_ * (1 + optimizer_->num_slots());
  image->header.set_changes_only(true);
  lifecycle_.Capture(&image->header);
  for (auto it =
           std::upper_bound(removed_.begin(), removed_.end(), std::make_pair(since, UINT64_MAX));
       it != removed_.end(); ++it) {
    image->removed.push_back(it->second);
  }
  image->header.set_num_removed(image->removed.size());
  rows_.ForEach([&](uint64_t key, const RowStore::Row& row) {
    if (*row.version <= since) return;
    image->keys.push_back(key);
    image->row_updates.push_back(*row.updates);
    if (lifecycle_.tracks_steps()) image->row_steps.push_back(*row.step);
    image->row_data.insert(image->row_data.end(), row.data, row.data + row_len);
  });
  CaptureColdLocked(since, image);
  image->header.set_num_rows(image->keys.size());
}

bool SparseTable::HasRow(uint64_t key) const {
  absl::ReaderMutexLock lock(&mu_);
  return rows_.Contains(key) || (cold_ != nullptr && cold_->Contains(key));
}

absl::Status SparseTable::RestoreRow(uint64_t key, int64_t updates, const float* data,
                                     int64_t step) {
  if (SparseShardOf(key, num_shards_) != shard_id_) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return RestoreRowLocked(key, updates, data, step);
}

absl::Status SparseTable::RestoreRowLocked(uint64_t key, int64_t updates, const float* data,
                                           int64_t step) {
  if (cold_ != nullptr && !rows_.Contains(key) && cold_->Contains(key)) {
    ColdRows::Batch batch(*cold_);
    batch.Delete(key);  // with the put: the count of rows on disk stays
    batch.Put(key, ColdRows::Row{updates, step, 0, reinterpret_cast<const char*>(data)});
    return cold_->Commit(batch);
  }
  if (rows_.size() >= max_rows_ && !rows_.Contains(key)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", id(), ": the snapshot holds more than the ", max_rows_,
                     " rows this shard may keep (ps_server --max_table_bytes)"));
  }
  const RowStore::Row row = rows_.FindOrInsert(key, [](float*) {});
  *row.updates = updates;
  if (row.step != nullptr) *row.step = step;
  std::copy(data, data + rows_.width(), row.data);
  return MakeRoomLocked(0, nullptr);
}

absl::Status SparseTable::RestoreLifecycle(const TableSnapshotHeader& header) {
  absl::MutexLock lock(&mu_);
  return lifecycle_.Restore(header);
}

}  // namespace pscluster::ps
