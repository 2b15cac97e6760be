// Snapshot stores in memory, for tests (leveldb's memenv idea): a MemorySnapshotStorage
// is a whole checkpoint root whose shard stores are maps from step to the captured table
// images. A snapshot is visible once Write returns OK; FailWrites(true) makes every Write
// fail (a full disk) without changing what is visible. The storage must outlive the
// stores it opens. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/ps/snapshot/snapshot_store.h"

namespace pscluster::ps {

class MemorySnapshotStorage final : public SnapshotStorage {
 public:
  absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(const std::string& dir,
                                                      bool read_only) override;
  std::vector<std::string> ShardDirs(const std::string& root) const override;

  // Every later Write fails with RESOURCE_EXHAUSTED (true) or succeeds again (false).
  void FailWrites(bool fail);
  // Every later Delete fails with UNAVAILABLE (true: a read-only disk) or succeeds again.
  void FailDeletes(bool fail);

  struct Snapshot {
    SnapshotManifest manifest;
    std::vector<TableImage> images;
  };
  struct Dir {
    absl::Mutex mu;
    std::map<int64_t, Snapshot> snapshots ABSL_GUARDED_BY(mu);
  };

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Dir>> dirs_ ABSL_GUARDED_BY(mu_);
  bool fail_writes_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_deletes_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pscluster::ps
