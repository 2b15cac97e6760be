#include "server/ps/file_snapshot_store.h"

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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "server/ps/rocksdb_snapshot_store.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'P', 'S', 'N', 'A', 'P', '\0', 'v', '2'};
constexpr char kEndMagic[8] = {'P', 'S', 'N', 'A', 'P', 'E', 'N', 'D'};
constexpr uint64_t kFooterBytes = 16;
constexpr uint64_t kRecordOverhead = 4 + 8 + 4;
// No record is larger than a dense block with its slots, or a manifest.
constexpr uint64_t kMaxRecordBytes = uint64_t{64} << 20;
enum RecordKind : uint32_t { kHeader = 1, kBlock = 2, kManifest = 3 };

// The errno of a failed write, as a status naming the file: a full disk is
// RESOURCE_EXHAUSTED saying what to do.
absl::Status WriteError(int err, absl::string_view what, const std::string& path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg + " (free disk space)");
  return absl::UnavailableError(msg);
}

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return WriteError(errno, "opening directory", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : WriteError(err, "fsync of directory", dir);
}

// A file being written; removed unless Commit() renamed it into place.
class NewFile {
 public:
  explicit NewFile(std::string path) : path_(std::move(path)) {}
  ~NewFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  absl::Status Open() {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd_ >= 0 ? absl::OkStatus() : WriteError(errno, "creating", path_);
  }
  absl::Status Append(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return WriteError(errno, "writing", path_);
      p += w;
      n -= static_cast<size_t>(w);
      offset_ += static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }
  // kind, length, payload, CRC-32C of the payload.
  absl::Status AppendRecord(RecordKind kind, const std::string& payload) {
    char head[12];
    const uint32_t k = kind;
    const uint64_t len = payload.size();
    std::memcpy(head, &k, 4);
    std::memcpy(head + 4, &len, 8);
    const uint32_t crc = crc32c::Value(payload.data(), payload.size());
    RETURN_IF_ERROR(Append(head, sizeof(head)));
    RETURN_IF_ERROR(Append(payload.data(), payload.size()));
    return Append(&crc, 4);
  }
  // fsync, close, rename to `target`, fsync the target's directory.
  absl::Status Commit(const std::string& target) {
    if (::fsync(fd_) != 0) return WriteError(errno, "fsync of", path_);
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return WriteError(errno, "closing", path_);
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      return WriteError(errno, "renaming into place", target);
    }
    committed_ = true;
    return SyncDir(fs::path(target).parent_path().string());
  }
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
  ~SnapshotFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status DataLoss(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("snapshot file ", path_, ": ", what));
  }

  // Opens the file and reads and checks its manifest.
  absl::Status Open() {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path_, " does not exist"));
      return absl::UnavailableError(absl::StrCat("opening ", path_, ": ", std::strerror(errno)));
    }
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      return absl::UnavailableError(absl::StrCat("stat of ", path_, ": ", std::strerror(errno)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    char magic[8], footer[kFooterBytes];
    if (size_ < sizeof(magic) + kFooterBytes) return DataLoss("shorter than a snapshot can be");
    RETURN_IF_ERROR(ReadAt(0, magic, sizeof(magic)));
    if (std::memcmp(magic, kMagic, sizeof(magic)) != 0) return DataLoss("bad magic at the start");
    RETURN_IF_ERROR(ReadAt(size_ - kFooterBytes, footer, kFooterBytes));
    if (std::memcmp(footer + 8, kEndMagic, 8) != 0) return DataLoss("bad footer (truncated?)");
    std::memcpy(&manifest_at_, footer, 8);
    std::string payload;
    uint64_t next = 0;
    RETURN_IF_ERROR(ReadRecord(manifest_at_, kManifest, &payload, &next));
    if (next != size_ - kFooterBytes) return DataLoss("the manifest is not the last record");
    if (!manifest_.ParseFromString(payload)) return DataLoss("the manifest does not parse");
    if (manifest_.format_version() != kFileSnapshotFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          path_, " has format version ", manifest_.format_version(),
          "; this ps_server reads version ", kFileSnapshotFormatVersion));
    }
    return absl::OkStatus();
  }

  // The record at `at`, which must be of `kind`; `next` is the offset after it.
  absl::Status ReadRecord(uint64_t at, RecordKind kind, std::string* payload, uint64_t* next) {
    char head[12];
    if (at > size_ || size_ - at < kRecordOverhead) {
      return DataLoss(absl::StrCat("record at offset ", at, " runs past the end"));
    }
    RETURN_IF_ERROR(ReadAt(at, head, sizeof(head)));
    uint32_t k;
    uint64_t len;
    std::memcpy(&k, head, 4);
    std::memcpy(&len, head + 4, 8);
    if (k != kind) {
      return DataLoss(absl::StrCat("record at offset ", at, " is of kind ", k, ", expected ",
                                   static_cast<uint32_t>(kind)));
    }
    if (len > kMaxRecordBytes || len > size_ - at - kRecordOverhead) {
      return DataLoss(absl::StrCat("record at offset ", at, " claims ", len, " bytes"));
    }
    payload->resize(len);
    uint32_t crc;
    RETURN_IF_ERROR(ReadAt(at + 12, payload->data(), len));
    RETURN_IF_ERROR(ReadAt(at + 12 + len, &crc, 4));
    if (crc != crc32c::Value(payload->data(), len)) {
      return DataLoss(absl::StrCat("record at offset ", at, " fails its checksum"));
    }
    *next = at + kRecordOverhead + len;
    return absl::OkStatus();
  }
  // The kind of the record at `at` (the caller checks bounds).
  absl::StatusOr<uint32_t> KindAt(uint64_t at) {
    uint32_t k;
    RETURN_IF_ERROR(ReadAt(at, &k, 4));
    return k;
  }

  const SnapshotManifest& manifest() const { return manifest_; }
  uint64_t manifest_at() const { return manifest_at_; }
  const std::string& path() const { return path_; }

 private:
  absl::Status ReadAt(uint64_t at, void* out, size_t n) {
    char* p = static_cast<char*>(out);
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(at));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        return absl::UnavailableError(absl::StrCat("reading ", path_, ": ", std::strerror(errno)));
      }
      if (r == 0) return DataLoss(absl::StrCat("unexpected end of file at offset ", at));
      p += r;
      at += static_cast<uint64_t>(r);
      n -= static_cast<size_t>(r);
    }
    return absl::OkStatus();
  }

  const std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t manifest_at_ = 0;
  SnapshotManifest manifest_;
};

// "<step:020>.psnap" -> step.
bool ParseSnapshotName(const std::string& name, int64_t* step) {
  const std::string suffix = ".psnap";
  if (name.size() != 20 + suffix.size() || name.substr(20) != suffix) return false;
  return absl::SimpleAtoi(name.substr(0, 20), step) && *step >= 0;
}

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
      std::fprintf(stderr, "snapshot store %s: removing partial snapshot file %s\n", dir.c_str(),
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
  if (read_only_) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot store ", dir_, " is open read-only; not writing step ", step));
  }
  RETURN_IF_ERROR(CheckSpace(step, images));

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
    damaged->push_back(absl::StrCat("the older RocksDB snapshot store in ", dir_, ": ",
                                    old.status().message()));
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
      if (name.rfind('.', 0) != 0) damaged->push_back(entry.path().string() + ": not a snapshot name");
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
  std::sort(damaged->begin(), damaged->end());
  return absl::OkStatus();
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

absl::Status FileSnapshotStore::Read(int64_t step, Visitor* visitor) const {
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
    uint64_t dense_at = 0;
    for (at = next; at < f.manifest_at();) {
      ASSIGN_OR_RETURN(uint32_t kind, f.KindAt(at));
      if (kind != kBlock) break;
      RETURN_IF_ERROR(f.ReadRecord(at, kBlock, &payload, &next));
      crc = crc32c::Extend(crc, payload.data(), payload.size());
      RETURN_IF_ERROR(VisitBlock(h, payload.data(), payload.size(), &dense_at, visitor, where));
      at = next;
    }
    if (h.spec().kind() == TableSpec::DENSE && dense_at != h.shard_end() - h.shard_begin()) {
      return absl::DataLossError(absl::StrCat(where, ": dense blocks missing"));
    }
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
