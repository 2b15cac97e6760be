#include "server/ps/snapshot/snapshot_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "server/ps/snapshot/file_snapshot_store.h"

namespace pscluster::ps::psnap {

namespace fs = std::filesystem;

absl::Status WriteError(int err, absl::string_view what, const std::string& path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT)
    return absl::ResourceExhaustedError(msg + " (free disk space)");
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

bool ParseSnapshotName(const std::string& name, int64_t* step) {
  const std::string suffix = ".psnap";
  if (name.size() != 20 + suffix.size() || name.substr(20) != suffix) return false;
  return absl::SimpleAtoi(name.substr(0, 20), step) && *step >= 0;
}

NewFile::~NewFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

absl::Status NewFile::Open() {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  return fd_ >= 0 ? absl::OkStatus() : WriteError(errno, "creating", path_);
}

absl::Status NewFile::Append(const void* data, size_t n) {
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

absl::Status NewFile::AppendRecord(RecordKind kind, const std::string& payload) {
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

absl::Status NewFile::Commit(const std::string& target) {
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

SnapshotFile::~SnapshotFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status SnapshotFile::DataLoss(absl::string_view what) const {
  return absl::DataLossError(absl::StrCat("snapshot file ", path_, ": ", what));
}

absl::Status SnapshotFile::Open() {
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
    return absl::FailedPreconditionError(
        absl::StrCat(path_, " has format version ", manifest_.format_version(),
                     "; this ps_server reads version ", kFileSnapshotFormatVersion));
  }
  return absl::OkStatus();
}

absl::Status SnapshotFile::ReadRecord(uint64_t at, RecordKind kind, std::string* payload,
                                      uint64_t* next) {
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

absl::StatusOr<uint32_t> SnapshotFile::KindAt(uint64_t at) {
  uint32_t k;
  RETURN_IF_ERROR(ReadAt(at, &k, 4));
  return k;
}

absl::Status SnapshotFile::ReadAt(uint64_t at, void* out, size_t n) {
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

}  // namespace pscluster::ps::psnap
