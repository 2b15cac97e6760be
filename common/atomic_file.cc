#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAndSync(const std::string& path, absl::string_view contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", path);
  for (size_t done = 0; done < contents.size();) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = Errno("write", path);
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = Errno("fsync", path);
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return Errno("close", path);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  if (absl::Status s = WriteAndSync(tmp, contents); !s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("rename over", path);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("open directory", dir);
  const int synced = ::fsync(dfd);
  ::close(dfd);
  if (synced != 0) return Errno("fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace pscluster
