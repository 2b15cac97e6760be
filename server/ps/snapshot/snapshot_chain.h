// Incremental snapshots as chains. A shard started with --snapshot_full_every K > 1 writes
// a full snapshot, then up to K - 1 snapshots that each hold, for its sparse tables, only
// the rows changed since the one before (its base, in the same store) and the ids removed
// since; dense tables are whole in every link. Restoring a link reads its chain back to
// the full snapshot, every link's checksums checked, and applies it as one snapshot.
//
// The links are read newest first: the newest link's headers and dense blocks are the
// state, and an older link only adds the rows of keys no newer link has set or removed.
// So nothing is applied twice, and a table that a newer link holds whole (new since the
// base, or its changes forgotten) takes nothing from older ones.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/snapshot.pb.h"
#include "server/ps/snapshot/snapshot_store.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {

// The steps of the chain that ends at `step` among one store's complete snapshots
// (`manifests`, by step), the full snapshot first. NOT_FOUND naming the missing link and
// `dir` when a snapshot it builds on is not among them (deleted, or damaged).
absl::StatusOr<std::vector<int64_t>> ChainOf(int64_t step,
                                             const std::map<int64_t, SnapshotManifest>& manifests,
                                             absl::string_view dir);

// Reads the chain `steps` (ChainOf's) of `store` into `loader`, a ShardLoader of `shard`,
// as the one snapshot of its last step. Errors are the store's (DATA_LOSS naming the file).
absl::Status ReadChain(const SnapshotStore& store, const std::vector<int64_t>& steps, Shard* shard,
                       SnapshotStore::Visitor* loader);

// Where this process's next snapshot starts from: the last complete snapshot it wrote
// and, per table, which table object at which version of its changes. The next snapshot
// holds a table's changes since then if it is the same object and the chain is shorter
// than --snapshot_full_every; else the table whole. Not thread-safe (the Snapshotter's lock).
class ChainTip {
 public:
  explicit ChainTip(int full_every) : full_every_(full_every) {}

  // The step the next snapshot may build on, if any.
  std::optional<int64_t> step() const { return step_; }
  CaptureSince SinceFor(const Table& table) const;

  // What a snapshot captured of each table, for when it is complete.
  struct Captured {
    uint32_t table_id;
    uint64_t incarnation;
    uint64_t version;
  };
  static std::vector<Captured> Of(const std::vector<std::unique_ptr<TableImage>>& images);
  // Whether a snapshot of these images holds changes only (then it builds on step()).
  static bool ChangesOnly(const std::vector<std::unique_ptr<TableImage>>& images);
  // The snapshot of `step` (built on `base`, if set) is complete.
  void Completed(int64_t step, std::optional<int64_t> base, std::vector<Captured> tables);
  // The next snapshot is full (a restore replaced the tables, or the tip was deleted).
  void Reset() { step_.reset(); }

 private:
  int full_every_;
  std::optional<int64_t> step_;
  int links_ = 0;  // snapshots since the full one
  std::vector<Captured> tables_;
};

}  // namespace pscluster::ps
