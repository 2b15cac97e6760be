#include "server/ps/snapshot/rocksdb_snapshot_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "rocksdb/db.h"

namespace pscluster::ps {
namespace {

// The one adapter from rocksdb::Status.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg + " (free disk space)");
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsIOError()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

std::string StepPrefix(int64_t step) { return absl::StrFormat("snap/%020d/", step); }
std::string ManifestKey(int64_t step) { return absl::StrFormat("manifest/%020d", step); }
std::string TablePrefix(int64_t step, uint32_t table) {
  return StepPrefix(step) + absl::StrFormat("t/%010u/", table);
}

bool StartsWith(const rocksdb::Slice& s, const std::string& prefix) {
  return s.size() >= prefix.size() && std::memcmp(s.data(), prefix.data(), prefix.size()) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SnapshotStore>> RocksDbSnapshotStore::OpenReadOnly(
    const std::string& dir) {
  rocksdb::DB* db = nullptr;
  rocksdb::Options options;
  options.max_open_files = 256;
  // A damaged write-ahead log is an error naming it, not records silently dropped.
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kAbsoluteConsistency;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir, &db);
  if (!s.ok()) return FromRocks(s, absl::StrCat("opening the older snapshot database ", dir));
  return std::unique_ptr<SnapshotStore>(new RocksDbSnapshotStore(dir, db));
}

RocksDbSnapshotStore::RocksDbSnapshotStore(std::string dir, rocksdb::DB* db)
    : dir_(std::move(dir)), db_(db) {}

RocksDbSnapshotStore::~RocksDbSnapshotStore() = default;

absl::StatusOr<SnapshotManifest> RocksDbSnapshotStore::Write(
    int64_t, const std::vector<std::unique_ptr<TableImage>>&, const WriteOptions&) {
  return absl::FailedPreconditionError(
      absl::StrCat("the RocksDB snapshot layout in ", dir_, " is read only"));
}

absl::Status RocksDbSnapshotStore::Delete(int64_t step) {
  return absl::FailedPreconditionError(absl::StrCat("snapshot of step ", step,
                                                    " is in the read-only RocksDB layout in ", dir_,
                                                    "; remove it by hand when no longer needed"));
}

absl::StatusOr<std::vector<SnapshotManifest>> RocksDbSnapshotStore::List() const {
  std::vector<SnapshotManifest> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("manifest/"); it->Valid() && StartsWith(it->key(), "manifest/"); it->Next()) {
    SnapshotManifest m;
    if (!m.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(
          absl::StrCat("unreadable manifest ", it->key().ToString(), " in ", dir_));
    }
    out.push_back(std::move(m));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "listing snapshots");
  return out;
}

absl::Status RocksDbSnapshotStore::Read(int64_t step, Visitor* visitor) const {
  std::string raw;
  rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), ManifestKey(step), &raw);
  if (rs.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("no complete snapshot of step ", step, " in ", dir_));
  }
  if (!rs.ok()) return FromRocks(rs, "reading a manifest");
  SnapshotManifest manifest;
  if (!manifest.ParseFromString(raw)) return absl::DataLossError("unreadable manifest in " + dir_);
  if (manifest.format_version() != kRocksDbSnapshotFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot ", step, " in ", dir_, " has format version ", manifest.format_version(),
        "; the RocksDB layout is version ", kRocksDbSnapshotFormatVersion));
  }
  auto corrupt = [&](uint32_t table, absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("snapshot ", step, " in ", dir_, ", table ", table, ": ", what));
  };
  for (const TableChecksum& expected : manifest.tables()) {
    const uint32_t id = expected.table_id();
    const std::string prefix = TablePrefix(step, id);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    it->Seek(prefix + "h");
    TableSnapshotHeader h;
    if (!it->Valid() || it->key() != prefix + "h" ||
        !h.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return corrupt(id, "header missing or unreadable");
    }
    uint32_t crc = crc32c::Value(it->value().data(), it->value().size());
    RETURN_IF_ERROR(visitor->Header(h));
    const bool dense = h.spec().kind() == TableSpec::DENSE;
    const std::string where = absl::StrCat("snapshot ", step, " in ", dir_, ", table ", id);
    uint64_t at = 0;  // dense: values read so far
    for (it->Next(); it->Valid() && StartsWith(it->key(), prefix); it->Next()) {
      const rocksdb::Slice v = it->value();
      crc = crc32c::Extend(crc, v.data(), v.size());
      RETURN_IF_ERROR(VisitBlock(h, v.data(), v.size(), &at, visitor, where));
    }
    if (!it->status().ok()) return FromRocks(it->status(), "reading a snapshot");
    if (dense && at != h.shard_end() - h.shard_begin()) return corrupt(id, "dense blocks missing");
    if (crc != expected.crc32c()) {
      return corrupt(id, absl::StrFormat("checksum mismatch (manifest %08x, data %08x)",
                                         expected.crc32c(), crc));
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster::ps
