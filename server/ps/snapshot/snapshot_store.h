// Where one shard's snapshots live, as an interface: files on disk
// (file_snapshot_store.h, what ps_server uses) or the in-memory one of the tests
// (memory_snapshot_store.h). A snapshot becomes visible (List, Read) only once complete;
// a failed Write leaves nothing visible.
//
// Implementations are thread-safe; Write() calls must not overlap.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/snapshot.pb.h"
#include "server/ps/table/table.h"

namespace pscluster::ps {

// Version 1: the RocksDB layout (read only); version 2: the files of file_snapshot_store.h.
inline constexpr uint32_t kRocksDbSnapshotFormatVersion = 1;
inline constexpr uint32_t kSnapshotFormatVersion = 2;
inline constexpr uint64_t kDenseBlockValues = uint64_t{1} << 18;
inline constexpr uint64_t kSparseBlockRows = 4096;

class SnapshotStore {
 public:
  // The file store in `dir` (file_snapshot_store.h). Read-write: creates `dir` if needed
  // and removes partial snapshots. Read-only: for reading another shard's snapshots
  // (during resharding), even while it runs.
  static absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(const std::string& dir,
                                                             bool read_only = false);
  virtual ~SnapshotStore() = default;

  virtual const std::string& dir() const = 0;

  struct WriteOptions {
    uint32_t shard_id = 0;
    uint32_t num_shards = 1;
    bool has_metric = false;
    double metric = 0;
    absl::Duration test_delay_per_block;             // tests only: widens the crash window
    std::atomic<uint64_t>* bytes_written = nullptr;  // progress, if set
    // An incremental snapshot: the step of the snapshot it builds on (SnapshotManifest).
    std::optional<int64_t> base_step;
  };
  virtual absl::StatusOr<SnapshotManifest> Write(
      int64_t step, const std::vector<std::unique_ptr<TableImage>>& images,
      const WriteOptions& options) = 0;

  // Complete snapshots, ascending step.
  virtual absl::StatusOr<std::vector<SnapshotManifest>> List() const = 0;

  // Makes snapshot `step` invisible, then deletes its data.
  virtual absl::Status Delete(int64_t step) = 0;

  // What is stored but does not verify (file names and why), as found by the last List():
  // never listed, never deleted.
  virtual std::vector<std::string> Damaged() const { return {}; }

  // Keeps the newest `keep_last` and the best by metric; deletes the rest (List, Delete).
  // Both keep the snapshots a kept incremental one builds on, and leave snapshots of the
  // read-only RocksDB layout alone.
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
    // SPARSE: a row's key, update count, last update's step (0 unless header.row_steps())
    // and dim * (1 + num_slots) floats.
    virtual absl::Status SparseRow(const TableSnapshotHeader& header, uint64_t key, int64_t updates,
                                   int64_t step, const float* data) = 0;
    // SPARSE with header.changes_only(): ids whose rows were removed since the base. Only a
    // reader of chains takes them (snapshot_chain.h); elsewhere they are DATA_LOSS.
    virtual absl::Status SparseRemoved(const TableSnapshotHeader& header, const uint64_t* keys,
                                       size_t n);
  };
  // Visits every table of complete snapshot `step`; DATA_LOSS when what is stored
  // disagrees with its checksums; NOT_FOUND for no complete snapshot of `step`.
  virtual absl::Status Read(int64_t step, Visitor* visitor) const = 0;

 private:
  // Deletes the snapshots of `list` neither in `keep` nor built on by one that is.
  absl::StatusOr<std::vector<int64_t>> DeleteAllBut(const std::vector<SnapshotManifest>& list,
                                                    std::vector<int64_t> keep);
};

// The block encoding every layout shares. DENSE: one block per kDenseBlockValues indices,
// the values then each optimizer slot; SPARSE: up to kSparseBlockRows rows as keys (u64),
// update counts (i64), with header.row_steps() each row's last update's step (i64), then
// the rows' floats; with header.changes_only(), blocks of up to kSparseBlockRows removed
// ids (u64) come first. VisitBlock's `at` counts dense values, or removed ids, so far.
absl::Status EmitBlocks(const TableImage& image,
                        const std::function<absl::Status(const std::string& block)>& emit);
// Decodes one block of the table `h` to `visitor`; `dense_at` counts the dense values seen
// so far. DATA_LOSS naming `where` for a block of the wrong size.
absl::Status VisitBlock(const TableSnapshotHeader& h, const char* data, size_t size, uint64_t* at,
                        SnapshotStore::Visitor* visitor, absl::string_view where);
// Whether the blocks visited into `at` were all the table's: DATA_LOSS naming `where` if not.
absl::Status CheckBlocksWhole(const TableSnapshotHeader& h, uint64_t at, absl::string_view where);

// The checkpoint root of a cluster: where every shard's store lives. Local disk (or a
// shared file system) for ps_server, memory for tests. Thread-safe.
class SnapshotStorage {
 public:
  virtual ~SnapshotStorage() = default;
  // Opens (read-write: creating) the store in `dir`.
  virtual absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(const std::string& dir,
                                                              bool read_only) = 0;
  // The shard store directories under `root` ("shard-*"), in any order.
  virtual std::vector<std::string> ShardDirs(const std::string& root) const = 0;
  // Whether two directory names denote the same store.
  virtual bool Same(const std::string& a, const std::string& b) const { return a == b; }
};

// The RocksDB stores on this machine's file system.
std::unique_ptr<SnapshotStorage> MakeLocalSnapshotStorage();

}  // namespace pscluster::ps
