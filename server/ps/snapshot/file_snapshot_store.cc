#include "server/ps/snapshot/file_snapshot_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/ps/snapshot/rocksdb_snapshot_store.h"
#include "server/ps/snapshot/snapshot_file.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;
using psnap::kBlock;
using psnap::kEndMagic;
using psnap::kFooterBytes;
using psnap::kHeader;
using psnap::kMagic;
using psnap::kManifest;
using psnap::NewFile;
using psnap::ParseSnapshotName;
using psnap::SnapshotFile;
using psnap::SyncDir;
using psnap::WriteError;

}  // namespace

absl::StatusOr<std::unique_ptr<SnapshotStore>> SnapshotStore::Open(const std::string& dir,
                                                                   bool read_only) {
  return FileSnapshotStore::Open(dir, read_only);
}

std::string FileSnapshotStore::SnapshotPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / "snapshots" / absl::StrFormat("%020d.psnap", step)).string();
}

absl::StatusOr<std::unique_ptr<SnapshotStore>> FileSnapshotStore::Open(const std::string& dir,
                                                                       bool read_only) {
  std::error_code ec;
  if (read_only) {
    if (!fs::is_directory(dir, ec)) {
      return absl::NotFoundError(absl::StrCat("no snapshot directory ", dir));
    }
  } else {
    fs::create_directories(fs::path(dir) / "staging", ec);
    if (!ec) fs::create_directories(fs::path(dir) / "snapshots", ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create snapshot directory ", dir, ": ", ec.message()));
    }
    // Whatever is in staging was never renamed into place: always a partial write.
    for (const auto& f : fs::directory_iterator(fs::path(dir) / "staging", ec)) {
      LogWarning("snapshot store %s: removing partial snapshot file %s", dir.c_str(),
                 f.path().filename().c_str());
      fs::remove(f.path(), ec);
    }
  }
  std::unique_ptr<SnapshotStore> legacy;
  std::string legacy_error;  // a damaged older store is named, and does not block this one
  if (fs::exists(fs::path(dir) / "CURRENT", ec)) {
    auto opened = RocksDbSnapshotStore::OpenReadOnly(dir);
    if (opened.ok()) {
      legacy = *std::move(opened);
    } else {
      legacy_error = std::string(opened.status().message());
    }
  }
  return std::unique_ptr<SnapshotStore>(
      new FileSnapshotStore(dir, read_only, std::move(legacy), std::move(legacy_error)));
}

FileSnapshotStore::FileSnapshotStore(std::string dir, bool read_only,
                                     std::unique_ptr<SnapshotStore> legacy,
                                     std::string legacy_error)
    : dir_(std::move(dir)),
      read_only_(read_only),
      legacy_(std::move(legacy)),
      legacy_error_(std::move(legacy_error)) {}

absl::StatusOr<std::vector<SnapshotManifest>> FileSnapshotStore::LegacyList() const {
  if (legacy_ == nullptr) return std::vector<SnapshotManifest>();
  return legacy_->List();
}

FileSnapshotStore::~FileSnapshotStore() = default;

absl::Status FileSnapshotStore::CheckWritable(
    int64_t step, const std::vector<std::unique_ptr<TableImage>>& images) const {
  if (read_only_) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot store ", dir_, " is open read-only; not writing step ", step));
  }
  const std::string target = SnapshotPath(dir_, step);
  // A complete snapshot of the step is never written again (Snapshotter), so a file there
  // is a damaged one: the operator's, not to be replaced.
  if (std::error_code ec; fs::exists(target, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a damaged snapshot file of step ", step, " is in the way (left in place): ", target,
        "; move it away to snapshot this step again"));
  }
  return CheckSpace(step, images);
}

// Refuses up front when the disk clearly cannot hold the snapshot. The disk may still fill
// during the write; that fails the write cleanly too.
absl::Status FileSnapshotStore::CheckSpace(
    int64_t step, const std::vector<std::unique_ptr<TableImage>>& images) const {
  uint64_t needed = 0;
  for (const auto& i : images) needed += i->bytes();
  needed += needed / 64 + (uint64_t{1} << 20);
  std::error_code ec;
  const fs::space_info space = fs::space(dir_, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot stat ", dir_, ": ", ec.message()));
  if (space.available < needed) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "snapshot of step %d needs about %.1f MB in %s but %.1f MB are available; free disk "
        "space or keep fewer snapshots (--snapshot_keep_last)",
        step, needed / 1e6, dir_, space.available / 1e6));
  }
  return absl::OkStatus();
}

absl::StatusOr<SnapshotManifest> FileSnapshotStore::Write(
    int64_t step, const std::vector<std::unique_ptr<TableImage>>& images,
    const WriteOptions& options) {
  SnapshotManifest manifest;
  manifest.set_format_version(kFileSnapshotFormatVersion);
  manifest.set_step(step);
  manifest.set_shard_id(options.shard_id);
  manifest.set_num_shards(options.num_shards);
  manifest.set_has_metric(options.has_metric);
  manifest.set_metric(options.metric);
  manifest.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
  if (options.base_step) {
    manifest.set_has_base(true);
    manifest.set_base_step(*options.base_step);
  }
  RETURN_IF_ERROR(CheckWritable(step, images));

  const std::string target = SnapshotPath(dir_, step);
  NewFile file((fs::path(dir_) / "staging" / absl::StrCat(step, ".tmp")).string());
  RETURN_IF_ERROR(file.Open());
  RETURN_IF_ERROR(file.Append(kMagic, sizeof(kMagic)));
  std::vector<const TableImage*> sorted;
  for (const auto& i : images) sorted.push_back(i.get());
  std::sort(sorted.begin(), sorted.end(), [](const TableImage* a, const TableImage* b) {
    return a->header.spec().table_id() < b->header.spec().table_id();
  });
  uint64_t total = 0;
  for (const TableImage* image : sorted) {
    const std::string header = image->header.SerializeAsString();
    uint32_t crc = crc32c::Value(header.data(), header.size());
    uint64_t bytes = header.size();
    RETURN_IF_ERROR(file.AppendRecord(kHeader, header));
    RETURN_IF_ERROR(EmitBlocks(*image, [&](const std::string& block) {
      crc = crc32c::Extend(crc, block.data(), block.size());
      bytes += block.size();
      if (options.bytes_written) *options.bytes_written += block.size();
      if (options.test_delay_per_block > absl::ZeroDuration()) {
        std::this_thread::sleep_for(absl::ToChronoMicroseconds(options.test_delay_per_block));
      }
      return file.AppendRecord(kBlock, block);
    }));
    TableChecksum* c = manifest.add_tables();
    c->set_table_id(image->header.spec().table_id());
    c->set_crc32c(crc);
    c->set_bytes(bytes);
    total += bytes;
  }
  manifest.set_bytes(total);
  const uint64_t manifest_at = file.offset();
  RETURN_IF_ERROR(file.AppendRecord(kManifest, manifest.SerializeAsString()));
  char footer[kFooterBytes];
  std::memcpy(footer, &manifest_at, 8);
  std::memcpy(footer + 8, kEndMagic, 8);
  RETURN_IF_ERROR(file.Append(footer, sizeof(footer)));
  RETURN_IF_ERROR(file.Commit(target));
  return manifest;
}

absl::Status FileSnapshotStore::Scan(std::map<int64_t, SnapshotManifest>* complete,
                                     std::vector<std::string>* damaged) const {
  if (!legacy_error_.empty()) damaged->push_back(legacy_error_);
  if (auto old = LegacyList(); old.ok()) {
    for (SnapshotManifest& m : *old) (*complete)[m.step()] = std::move(m);
  } else {
    damaged->push_back(
        absl::StrCat("the older RocksDB snapshot store in ", dir_, ": ", old.status().message()));
  }
  std::error_code ec;
  fs::directory_iterator it(fs::path(dir_) / "snapshots", ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::UnavailableError(absl::StrCat("listing ", dir_, "/snapshots: ", ec.message()));
  }
  for (const auto& entry : ec ? fs::directory_iterator() : it) {
    int64_t step;
    const std::string name = entry.path().filename().string();
    if (!ParseSnapshotName(name, &step)) {
      if (name.rfind('.', 0) != 0)
        damaged->push_back(entry.path().string() + ": not a snapshot name");
      continue;
    }
    SnapshotFile f(entry.path().string());
    absl::Status s = f.Open();
    if (s.ok() && f.manifest().step() != step) {
      s = f.DataLoss(absl::StrCat("its manifest is of step ", f.manifest().step()));
    }
    if (s.ok()) {
      (*complete)[step] = f.manifest();
    } else {
      damaged->push_back(std::string(s.message()));
    }
  }
  ExcludeUnreadable(complete, damaged);
  std::sort(damaged->begin(), damaged->end());
  return absl::OkStatus();
}

FileSnapshotStore::FileId FileSnapshotStore::IdOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino),
          static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

void FileSnapshotStore::ExcludeUnreadable(std::map<int64_t, SnapshotManifest>* complete,
                                          std::vector<std::string>* damaged) const {
  absl::MutexLock lock(&mu_);
  for (auto it = unreadable_.begin(); it != unreadable_.end();) {
    if (IdOf(SnapshotPath(dir_, it->first)) != it->second.file) {
      it = unreadable_.erase(it);  // replaced or moved away: what is there now gets listed
      continue;
    }
    if (complete->erase(it->first) > 0) damaged->push_back(it->second.why);
    ++it;
  }
}

absl::StatusOr<std::vector<SnapshotManifest>> FileSnapshotStore::List() const {
  std::map<int64_t, SnapshotManifest> complete;
  std::vector<std::string> damaged;  // Damaged() names them
  RETURN_IF_ERROR(Scan(&complete, &damaged));
  std::vector<SnapshotManifest> out;
  for (auto& [step, m] : complete) out.push_back(std::move(m));
  return out;
}

std::vector<std::string> FileSnapshotStore::Damaged() const {
  std::map<int64_t, SnapshotManifest> complete;
  std::vector<std::string> damaged;
  Scan(&complete, &damaged).IgnoreError();  // an unreadable directory: List() says so
  return damaged;
}

absl::Status FileSnapshotStore::Delete(int64_t step) {
  const std::string path = SnapshotPath(dir_, step);
  if (read_only_) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot store ", dir_, " is open read-only; not deleting step ", step));
  }
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) {
      auto old = LegacyList();
      if (old.ok() && std::any_of(old->begin(), old->end(),
                                  [&](const SnapshotManifest& m) { return m.step() == step; })) {
        return legacy_->Delete(step);  // FAILED_PRECONDITION: the older layout is read only
      }
      return absl::OkStatus();
    }
    return WriteError(errno, "deleting", path);
  }
  return SyncDir(fs::path(path).parent_path().string());
}

namespace {

// Forwards to a visitor, noting whether it failed: a visitor's own DATA_LOSS (say, specs
// that disagree between shards) says nothing about the file.
class WatchedVisitor final : public SnapshotStore::Visitor {
 public:
  explicit WatchedVisitor(SnapshotStore::Visitor* inner) : inner_(inner) {}
  bool failed() const { return failed_; }
  absl::Status Header(const TableSnapshotHeader& h) override { return Note(inner_->Header(h)); }
  absl::Status DenseBlock(const TableSnapshotHeader& h, uint64_t begin, uint64_t n,
                          const float* data) override {
    return Note(inner_->DenseBlock(h, begin, n, data));
  }
  absl::Status SparseRow(const TableSnapshotHeader& h, uint64_t key, int64_t updates, int64_t step,
                         const float* data) override {
    return Note(inner_->SparseRow(h, key, updates, step, data));
  }
  absl::Status SparseRemoved(const TableSnapshotHeader& h, const uint64_t* keys,
                             size_t n) override {
    return Note(inner_->SparseRemoved(h, keys, n));
  }

 private:
  absl::Status Note(absl::Status s) {
    failed_ = failed_ || !s.ok();
    return s;
  }
  SnapshotStore::Visitor* const inner_;
  bool failed_ = false;
};

}  // namespace

absl::Status FileSnapshotStore::Read(int64_t step, Visitor* visitor) const {
  WatchedVisitor watched(visitor);
  absl::Status s = ReadWhole(step, &watched);
  if (absl::IsDataLoss(s) && !watched.failed()) {
    absl::MutexLock lock(&mu_);
    unreadable_[step] = {std::string(s.message()), IdOf(SnapshotPath(dir_, step))};
  }
  return s;
}

absl::Status FileSnapshotStore::ReadWhole(int64_t step, Visitor* visitor) const {
  SnapshotFile f(SnapshotPath(dir_, step));
  absl::Status opened = f.Open();
  if (absl::IsNotFound(opened)) {
    if (legacy_ != nullptr) return legacy_->Read(step, visitor);
    return absl::NotFoundError(absl::StrCat("no complete snapshot of step ", step, " in ", dir_));
  }
  RETURN_IF_ERROR(opened);
  const SnapshotManifest& manifest = f.manifest();
  if (manifest.step() != step) {
    return f.DataLoss(absl::StrCat("its manifest is of step ", manifest.step()));
  }
  uint64_t at = sizeof(kMagic);
  std::string payload;
  for (const TableChecksum& expected : manifest.tables()) {
    const std::string where =
        absl::StrCat("snapshot file ", f.path(), " (step ", step, "), table ", expected.table_id());
    uint64_t next = 0;
    RETURN_IF_ERROR(f.ReadRecord(at, kHeader, &payload, &next));
    TableSnapshotHeader h;
    if (!h.ParseFromString(payload) || h.spec().table_id() != expected.table_id()) {
      return absl::DataLossError(absl::StrCat(where, ": header unreadable or of another table"));
    }
    uint32_t crc = crc32c::Value(payload.data(), payload.size());
    RETURN_IF_ERROR(visitor->Header(h));
    uint64_t dense_at = 0;  // dense values, or removed ids, visited
    for (at = next; at < f.manifest_at();) {
      ASSIGN_OR_RETURN(uint32_t kind, f.KindAt(at));
      if (kind != kBlock) break;
      RETURN_IF_ERROR(f.ReadRecord(at, kBlock, &payload, &next));
      crc = crc32c::Extend(crc, payload.data(), payload.size());
      RETURN_IF_ERROR(VisitBlock(h, payload.data(), payload.size(), &dense_at, visitor, where));
      at = next;
    }
    RETURN_IF_ERROR(CheckBlocksWhole(h, dense_at, where));
    if (crc != expected.crc32c()) {
      return absl::DataLossError(absl::StrFormat("%s: checksum mismatch (manifest %08x, data %08x)",
                                                 where, expected.crc32c(), crc));
    }
  }
  if (at != f.manifest_at()) {
    return f.DataLoss(absl::StrCat("records after the last table at offset ", at));
  }
  return absl::OkStatus();
}

namespace {

class LocalSnapshotStorage final : public SnapshotStorage {
 public:
  absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(const std::string& dir,
                                                      bool read_only) override {
    return FileSnapshotStore::Open(dir, read_only);
  }
  std::vector<std::string> ShardDirs(const std::string& root) const override {
    std::vector<std::string> dirs;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (entry.is_directory() && entry.path().filename().string().rfind("shard-", 0) == 0) {
        dirs.push_back(entry.path().string());
      }
    }
    return dirs;
  }
  bool Same(const std::string& a, const std::string& b) const override {
    std::error_code ec;
    return fs::equivalent(a, b, ec);
  }
};

}  // namespace

std::unique_ptr<SnapshotStorage> MakeLocalSnapshotStorage() {
  return std::make_unique<LocalSnapshotStorage>();
}

}  // namespace pscluster::ps
