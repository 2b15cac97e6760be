#include "server/ps/snapshot_store.h"

#include <algorithm>

#include "common/status_macros.h"

namespace pscluster::ps {

absl::StatusOr<std::vector<int64_t>> SnapshotStore::ApplyRetention(int keep_last,
                                                                   bool lower_is_better) {
  auto list = List();
  if (!list.ok()) return list.status();
  const SnapshotManifest* best = nullptr;
  for (const auto& m : *list) {
    if (!m.has_metric()) continue;
    if (!best || (lower_is_better ? m.metric() <= best->metric() : m.metric() >= best->metric())) {
      best = &m;
    }
  }
  std::vector<int64_t> deleted;
  for (size_t i = 0; i + keep_last < list->size(); ++i) {
    const SnapshotManifest& m = (*list)[i];
    if (best && m.step() == best->step()) continue;
    RETURN_IF_ERROR(Delete(m.step()));
    deleted.push_back(m.step());
  }
  return deleted;
}

absl::StatusOr<std::vector<int64_t>> SnapshotStore::RetainOnly(const std::vector<int64_t>& keep) {
  ASSIGN_OR_RETURN(const std::vector<SnapshotManifest> list, List());
  std::vector<int64_t> deleted;
  for (const SnapshotManifest& m : list) {
    if (std::find(keep.begin(), keep.end(), m.step()) != keep.end()) continue;
    RETURN_IF_ERROR(Delete(m.step()));
    deleted.push_back(m.step());
  }
  return deleted;
}

}  // namespace pscluster::ps
