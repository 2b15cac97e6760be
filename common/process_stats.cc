#include "common/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

// The boot time (unix seconds): the stat file counts a process's start from it.
absl::StatusOr<int64_t> BootTime() {
  std::ifstream stat("/proc/stat");
  std::string key;
  int64_t value = 0;
  while (stat >> key) {
    if (key == "btime" && stat >> value) return value;
    stat.ignore(1 << 20, '\n');
  }
  return absl::InternalError("/proc/stat has no btime line");
}

int64_t OpenFds() {
  std::error_code error;
  int64_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end;
       it.increment(error)) {
    ++n;
  }
  return n;
}

}  // namespace

std::string StatFieldsAfterCommand(const std::string& line) {
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return "";
  return line.substr(close + 2);
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  std::ifstream file("/proc/self/stat");
  std::string line;
  if (!std::getline(file, line)) return absl::InternalError("cannot read /proc/self/stat");
  std::istringstream fields(StatFieldsAfterCommand(line));
  std::vector<std::string> f;
  for (std::string word; fields >> word;) f.push_back(word);
  // Fields 14, 15 (utime, stime), 22 (starttime), 23 (vsize), 24 (rss), counted from 1;
  // f[0] is field 3.
  if (f.size() < 22) return absl::InternalError(absl::StrCat("/proc/self/stat: '", line, "'"));
  double utime = 0, stime = 0, start = 0;
  uint64_t vsize = 0, rss = 0;
  if (!absl::SimpleAtod(f[11], &utime) || !absl::SimpleAtod(f[12], &stime) ||
      !absl::SimpleAtod(f[19], &start) || !absl::SimpleAtoi(f[20], &vsize) ||
      !absl::SimpleAtoi(f[21], &rss)) {
    return absl::InternalError(absl::StrCat("/proc/self/stat: '", line, "'"));
  }
  absl::StatusOr<int64_t> boot = BootTime();
  if (!boot.ok()) return boot.status();
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  ProcessStats s;
  s.cpu_seconds = (utime + stime) / ticks;
  s.virtual_bytes = vsize;
  s.resident_bytes = rss * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  s.start_time_seconds = static_cast<double>(*boot) + start / ticks;
  s.open_fds = OpenFds();
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) s.max_fds = static_cast<int64_t>(limit.rlim_cur);
  return s;
}

}  // namespace pscluster
