// The .psnap file format of file_snapshot_store.h, record by record: writing a new file
// (durably, made visible by a rename) and reading a complete one back with every record's
// checksum checked. The store decides which files exist and what they mean.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/snapshot.pb.h"

namespace pscluster::ps::psnap {

inline constexpr char kMagic[8] = {'P', 'S', 'N', 'A', 'P', '\0', 'v', '2'};
inline constexpr char kEndMagic[8] = {'P', 'S', 'N', 'A', 'P', 'E', 'N', 'D'};
inline constexpr uint64_t kFooterBytes = 16;
inline constexpr uint64_t kRecordOverhead = 4 + 8 + 4;
// No record is larger than a dense block with its slots, or a manifest.
inline constexpr uint64_t kMaxRecordBytes = uint64_t{64} << 20;
enum RecordKind : uint32_t { kHeader = 1, kBlock = 2, kManifest = 3 };

// The errno of a failed write, as a status naming the file: a full disk is
// RESOURCE_EXHAUSTED saying what to do.
absl::Status WriteError(int err, absl::string_view what, const std::string& path);

// fsync of a directory, so that a rename or unlink in it is durable.
absl::Status SyncDir(const std::string& dir);

// "<step:020>.psnap" -> step.
bool ParseSnapshotName(const std::string& name, int64_t* step);

// A file being written; removed unless Commit() renamed it into place.
class NewFile {
 public:
  explicit NewFile(std::string path) : path_(std::move(path)) {}
  ~NewFile();
  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;

  absl::Status Open();
  absl::Status Append(const void* data, size_t n);
  // kind, length, payload, CRC-32C of the payload.
  absl::Status AppendRecord(RecordKind kind, const std::string& payload);
  // fsync, close, rename to `target`, fsync the target's directory.
  absl::Status Commit(const std::string& target);
  uint64_t offset() const { return offset_; }

 private:
  const std::string path_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  bool committed_ = false;
};

// A complete snapshot file, read record by record; every error names the file.
class SnapshotFile {
 public:
  explicit SnapshotFile(std::string path) : path_(std::move(path)) {}
  ~SnapshotFile();
  SnapshotFile(const SnapshotFile&) = delete;
  SnapshotFile& operator=(const SnapshotFile&) = delete;

  absl::Status DataLoss(absl::string_view what) const;

  // Opens the file and reads and checks its manifest.
  absl::Status Open();
  // The record at `at`, which must be of `kind`; `next` is the offset after it.
  absl::Status ReadRecord(uint64_t at, RecordKind kind, std::string* payload, uint64_t* next);
  // The kind of the record at `at` (the caller checks bounds).
  absl::StatusOr<uint32_t> KindAt(uint64_t at);

  const SnapshotManifest& manifest() const { return manifest_; }
  uint64_t manifest_at() const { return manifest_at_; }
  const std::string& path() const { return path_; }

 private:
  absl::Status ReadAt(uint64_t at, void* out, size_t n);

  const std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t manifest_at_ = 0;
  SnapshotManifest manifest_;
};

}  // namespace pscluster::ps::psnap
