// One shard's snapshots as plain files, one per step, written by us: durable (fsync'd),
// checksummed record by record, and made visible by a rename. This is what ps_server
// writes. RocksDB is kept for reading the snapshots of the older layout (one RocksDB
// database per shard, rocksdb_snapshot_store.h): Debian's librocksdb is built with
// assertions, and any RocksDB write that meets a full disk (WAL append, SST flush, SST
// writer) aborts the process, even seconds later, so nothing here writes through RocksDB.
//
// Layout of the store directory:
//   staging/<step>.tmp        a snapshot being written (removed on open: always partial)
//   snapshots/<step:020>.psnap  complete snapshots
//   CURRENT, *.sst, ...       an older RocksDB store, if any: listed and read, never written
//
// A .psnap file: the magic "PSNAP\0v2", records, then a 16-byte footer: the manifest
// record's offset (u64, little-endian) and "PSNAPEND". A record is kind (u32), length
// (u64), payload, CRC-32C of the payload (u32). Kinds: 1 a table's TableSnapshotHeader,
// 2 a data block of the table whose header came last (the block encoding of
// snapshot_store.h), 3 the SnapshotManifest (last; its per-table CRCs run over the
// header's and blocks' payloads as in the RocksDB layout).
//
// The records are written and read by snapshot_file.h.
//
// A file that is in snapshots/ but does not verify is damaged: it is named (Damaged()),
// never listed as restorable, never deleted and never written over; what to do is the
// operator's choice. Listing verifies each file's footer and manifest; a file whose data
// fails its checksums is found by reading it whole (Read), which only a restore does, and
// is damaged from then on for as long as the store is open and the file stays the same.
//
// Thread-safe; Write() calls must not overlap.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/ps/snapshot/snapshot_store.h"

namespace pscluster::ps {

inline constexpr uint32_t kFileSnapshotFormatVersion = 2;

class FileSnapshotStore final : public SnapshotStore {
 public:
  // Read-write: creates `dir`, removes staging leftovers. Read-only: touches nothing, and
  // Write and Delete are FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(const std::string& dir,
                                                             bool read_only);
  ~FileSnapshotStore() override;
  FileSnapshotStore(const FileSnapshotStore&) = delete;
  FileSnapshotStore& operator=(const FileSnapshotStore&) = delete;

  const std::string& dir() const override { return dir_; }
  absl::StatusOr<SnapshotManifest> Write(int64_t step,
                                         const std::vector<std::unique_ptr<TableImage>>& images,
                                         const WriteOptions& options) override;
  absl::StatusOr<std::vector<SnapshotManifest>> List() const override;
  absl::Status Delete(int64_t step) override;
  absl::Status Read(int64_t step, Visitor* visitor) const override;
  std::vector<std::string> Damaged() const override;

  // The file of step `step`'s snapshot (tests corrupt it).
  static std::string SnapshotPath(const std::string& dir, int64_t step);

 private:
  FileSnapshotStore(std::string dir, bool read_only, std::unique_ptr<SnapshotStore> legacy,
                    std::string legacy_error);
  // The older store's snapshots (none without one).
  absl::StatusOr<std::vector<SnapshotManifest>> LegacyList() const;
  // One pass over the older store and snapshots/: the complete snapshots by step, and
  // what does not verify (file and why, sorted). UNAVAILABLE for an unreadable directory.
  absl::Status Scan(std::map<int64_t, SnapshotManifest>* complete,
                    std::vector<std::string>* damaged) const;
  // Before writing step `step`: FAILED_PRECONDITION when read-only or when a file of the
  // step is in the way (a damaged one); RESOURCE_EXHAUSTED for too little disk space.
  absl::Status CheckWritable(int64_t step,
                             const std::vector<std::unique_ptr<TableImage>>& images) const;
  absl::Status CheckSpace(int64_t step,
                          const std::vector<std::unique_ptr<TableImage>>& images) const;
  // Read, without remembering what it finds.
  absl::Status ReadWhole(int64_t step, Visitor* visitor) const;

  // A snapshot file as it is now: device, inode, size, modification time (ns); zeros when
  // there is none. Another one means the file was replaced or moved away.
  using FileId = std::array<int64_t, 4>;
  static FileId IdOf(const std::string& path);
  // Moves the steps Read found damaged from `complete` to `damaged`, forgetting those whose
  // file changed since.
  void ExcludeUnreadable(std::map<int64_t, SnapshotManifest>* complete,
                         std::vector<std::string>* damaged) const;

  const std::string dir_;
  const bool read_only_;
  const std::unique_ptr<SnapshotStore> legacy_;  // the older RocksDB store, read-only
  const std::string legacy_error_;               // why it could not be opened

  // Steps whose data Read found damaged (their manifests verify, so a scan alone would list
  // them): why, and the file it was.
  struct Unreadable {
    std::string why;
    FileId file;
  };
  mutable absl::Mutex mu_;
  mutable std::map<int64_t, Unreadable> unreadable_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster::ps
