// One shard's snapshots in one RocksDB database. A snapshot is written as one SST file,
// durably (fsync), ingested, and only then made visible by a manifest written with a
// synced put: a crash at any moment leaves earlier snapshots intact and the partial one
// invisible; Open() deletes such leftovers.
//
// Keys:  manifest/<step:020>                    SnapshotManifest (present iff complete)
//        snap/<step:020>/t/<table:010>/h        TableSnapshotHeader
//        snap/<step:020>/t/<table:010>/x/<blk:012>  data block: DENSE values then each
//            optimizer slot for kDenseBlockValues indices; SPARSE up to kSparseBlockRows
//            rows as keys (u64), update counts (i64), then row data (floats)
//
// Thread-safe (RocksDB is); Write() calls must not overlap.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/snapshot.pb.h"
#include "server/ps/table.h"

namespace rocksdb {
class DB;
}

namespace pscluster::ps {

inline constexpr uint32_t kSnapshotFormatVersion = 1;
inline constexpr uint64_t kDenseBlockValues = uint64_t{1} << 18;
inline constexpr uint64_t kSparseBlockRows = 4096;

class SnapshotStore {
 public:
  // Read-write: creates `dir` if needed and removes partial snapshots. Read-only: for
  // reading another shard's snapshots (during resharding), even while it runs.
  static absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(const std::string& dir,
                                                             bool read_only = false);
  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  const std::string& dir() const { return dir_; }

  struct WriteOptions {
    uint32_t shard_id = 0;
    uint32_t num_shards = 1;
    bool has_metric = false;
    double metric = 0;
    absl::Duration test_delay_per_block;             // tests only: widens the crash window
    std::atomic<uint64_t>* bytes_written = nullptr;  // progress, if set
  };
  absl::StatusOr<SnapshotManifest> Write(int64_t step,
                                         const std::vector<std::unique_ptr<TableImage>>& images,
                                         const WriteOptions& options);

  // Complete snapshots, ascending step.
  absl::StatusOr<std::vector<SnapshotManifest>> List() const;

  // Makes snapshot `step` invisible (manifest first), then deletes its data.
  absl::Status Delete(int64_t step);

  // Keeps the newest `keep_last` and the best by metric; deletes the rest.
  absl::StatusOr<std::vector<int64_t>> ApplyRetention(int keep_last, bool lower_is_better);
  // Deletes every complete snapshot whose step is not in `keep`; returns their steps.
  absl::StatusOr<std::vector<int64_t>> RetainOnly(const std::vector<int64_t>& keep);

  class Visitor {
   public:
    virtual ~Visitor() = default;
    virtual absl::Status Header(const TableSnapshotHeader& header) = 0;
    // DENSE: global indices [begin, begin + n): values, then each slot, n floats each.
    virtual absl::Status DenseBlock(const TableSnapshotHeader& header, uint64_t begin, uint64_t n,
                                    const float* data) = 0;
    virtual absl::Status SparseRow(const TableSnapshotHeader& header, uint64_t key, int64_t updates,
                                   const float* data) = 0;
  };
  // Visits every table of complete snapshot `step`; DATA_LOSS when a checksum or a
  // block's size disagrees with the manifest.
  absl::Status Read(int64_t step, Visitor* visitor) const;

 private:
  SnapshotStore(std::string dir, rocksdb::DB* db);
  absl::Status RemovePartial();

  const std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace pscluster::ps
