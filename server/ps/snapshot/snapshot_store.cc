#include "server/ps/snapshot/snapshot_store.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::ps {

absl::Status EmitBlocks(const TableImage& image,
                        const std::function<absl::Status(const std::string& block)>& emit) {
  const TableSnapshotHeader& h = image.header;
  std::string buf;
  if (h.spec().kind() == TableSpec::DENSE) {
    const uint64_t size = h.shard_end() - h.shard_begin();
    for (uint64_t at = 0; at < size; at += kDenseBlockValues) {
      const uint64_t n = std::min(kDenseBlockValues, size - at);
      buf.resize(n * sizeof(float) * image.arrays.size());
      char* out = buf.data();
      for (const auto& a : image.arrays) {
        std::memcpy(out, a.data() + at, n * sizeof(float));
        out += n * sizeof(float);
      }
      RETURN_IF_ERROR(emit(buf));
    }
    return absl::OkStatus();
  }
  if (h.changes_only()) {
    if (image.removed.size() != h.num_removed()) {
      return absl::InternalError(absl::StrCat("table ", h.spec().table_id(),
                                              ": an image of changes without its removed ids"));
    }
    for (uint64_t at = 0; at < h.num_removed(); at += kSparseBlockRows) {
      const uint64_t n = std::min(kSparseBlockRows, h.num_removed() - at);
      buf.assign(reinterpret_cast<const char*>(image.removed.data() + at), n * 8);
      RETURN_IF_ERROR(emit(buf));
    }
  }
  const uint64_t rows = image.keys.size();
  const uint64_t row_len = h.spec().dim() * (1 + h.num_slots());
  const uint64_t ints = h.row_steps() ? 3 : 2;  // key, update count[, step]
  if (h.row_steps() && image.row_steps.size() != rows) {
    return absl::InternalError(
        absl::StrCat("table ", h.spec().table_id(), ": a sparse image without its rows' steps"));
  }
  for (uint64_t at = 0; at < rows; at += kSparseBlockRows) {
    const uint64_t n = std::min(kSparseBlockRows, rows - at);
    buf.resize(n * (ints * 8 + row_len * sizeof(float)));
    char* out = buf.data();
    std::memcpy(out, image.keys.data() + at, n * 8);
    std::memcpy(out + n * 8, image.row_updates.data() + at, n * 8);
    if (ints == 3) std::memcpy(out + n * 16, image.row_steps.data() + at, n * 8);
    std::memcpy(out + n * ints * 8, image.row_data.data() + at * row_len,
                n * row_len * sizeof(float));
    RETURN_IF_ERROR(emit(buf));
  }
  return absl::OkStatus();
}

absl::Status SnapshotStore::Visitor::SparseRemoved(const TableSnapshotHeader& header,
                                                   const uint64_t*, size_t) {
  return absl::DataLossError(absl::StrCat(
      "table ", header.spec().table_id(),
      ": an incremental snapshot's removed rows, which only a chain's reader applies"));
}

namespace {

absl::Status VisitRemoved(const TableSnapshotHeader& h, const char* data, size_t size, uint64_t* at,
                          SnapshotStore::Visitor* visitor, absl::string_view where) {
  const uint64_t n = std::min(kSparseBlockRows, h.num_removed() - *at);
  if (size != n * 8) {
    return absl::DataLossError(absl::StrCat(where, ": block of removed ids of the wrong size"));
  }
  std::vector<uint64_t> keys(n);
  std::memcpy(keys.data(), data, size);
  RETURN_IF_ERROR(visitor->SparseRemoved(h, keys.data(), n));
  *at += n;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckBlocksWhole(const TableSnapshotHeader& h, uint64_t at, absl::string_view where) {
  if (h.spec().kind() == TableSpec::DENSE && at != h.shard_end() - h.shard_begin()) {
    return absl::DataLossError(absl::StrCat(where, ": dense blocks missing"));
  }
  if (h.spec().kind() == TableSpec::SPARSE && at != h.num_removed()) {
    return absl::DataLossError(absl::StrCat(where, ": blocks of removed ids missing"));
  }
  return absl::OkStatus();
}

absl::Status VisitBlock(const TableSnapshotHeader& h, const char* data, size_t size, uint64_t* at,
                        SnapshotStore::Visitor* visitor, absl::string_view where) {
  uint64_t* const dense_at = at;
  const uint64_t arrays = 1 + h.num_slots();
  if (h.spec().kind() == TableSpec::SPARSE && *at < h.num_removed()) {
    return VisitRemoved(h, data, size, at, visitor, where);
  }
  if (h.spec().kind() == TableSpec::DENSE) {
    const uint64_t slice = h.shard_end() - h.shard_begin();
    const uint64_t n = std::min(kDenseBlockValues, slice - std::min(slice, *dense_at));
    if (n == 0 || size != n * arrays * sizeof(float)) {
      return absl::DataLossError(absl::StrCat(where, ": dense block of the wrong size"));
    }
    // Copy: the stored bytes need not be aligned for floats.
    std::vector<float> block(size / sizeof(float));
    std::memcpy(block.data(), data, size);
    RETURN_IF_ERROR(visitor->DenseBlock(h, h.shard_begin() + *dense_at, n, block.data()));
    *dense_at += n;
    return absl::OkStatus();
  }
  const uint64_t row_len = h.spec().dim() * arrays;
  const uint64_t ints = h.row_steps() ? 3 : 2;  // key, update count[, step]
  const uint64_t row_bytes = ints * 8 + row_len * sizeof(float);
  if (size % row_bytes != 0) {
    return absl::DataLossError(absl::StrCat(where, ": sparse block of the wrong size"));
  }
  const uint64_t n = size / row_bytes;
  std::vector<float> row(row_len);
  for (uint64_t r = 0; r < n; ++r) {
    uint64_t key;
    int64_t updates, step = 0;
    std::memcpy(&key, data + r * 8, 8);
    std::memcpy(&updates, data + n * 8 + r * 8, 8);
    if (ints == 3) std::memcpy(&step, data + n * 16 + r * 8, 8);
    std::memcpy(row.data(), data + n * ints * 8 + r * row_len * sizeof(float),
                row_len * sizeof(float));
    RETURN_IF_ERROR(visitor->SparseRow(h, key, updates, step, row.data()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> SnapshotStore::ApplyRetention(int keep_last,
                                                                   bool lower_is_better) {
  auto list = List();
  if (!list.ok()) return list.status();
  list->erase(std::remove_if(list->begin(), list->end(),
                             [](const SnapshotManifest& m) {
                               return m.format_version() == kRocksDbSnapshotFormatVersion;
                             }),
              list->end());
  const SnapshotManifest* best = nullptr;
  for (const auto& m : *list) {
    if (!m.has_metric()) continue;
    if (!best || (lower_is_better ? m.metric() <= best->metric() : m.metric() >= best->metric())) {
      best = &m;
    }
  }
  std::vector<int64_t> keep;
  for (size_t i = 0; i < list->size(); ++i) {
    const SnapshotManifest& m = (*list)[i];
    if (i + keep_last >= list->size() || (best && m.step() == best->step()))
      keep.push_back(m.step());
  }
  return DeleteAllBut(*list, keep);
}

absl::StatusOr<std::vector<int64_t>> SnapshotStore::RetainOnly(const std::vector<int64_t>& keep) {
  ASSIGN_OR_RETURN(const std::vector<SnapshotManifest> list, List());
  return DeleteAllBut(list, keep);
}

absl::StatusOr<std::vector<int64_t>> SnapshotStore::DeleteAllBut(
    const std::vector<SnapshotManifest>& list, std::vector<int64_t> keep) {
  std::map<int64_t, const SnapshotManifest*> by_step;
  for (const SnapshotManifest& m : list) by_step[m.step()] = &m;
  std::set<int64_t> kept;
  for (int64_t step : keep) {  // and every snapshot it builds on
    for (auto it = by_step.find(step); it != by_step.end() && kept.insert(step).second;
         it = by_step.find(step)) {
      if (!it->second->has_base()) break;
      step = it->second->base_step();
    }
  }
  std::vector<int64_t> deleted;
  for (const SnapshotManifest& m : list) {
    if (kept.count(m.step()) > 0) continue;
    if (m.format_version() == kRocksDbSnapshotFormatVersion) continue;  // read-only
    RETURN_IF_ERROR(Delete(m.step()));
    deleted.push_back(m.step());
  }
  return deleted;
}

}  // namespace pscluster::ps
