// A process's resident memory from /proc/PID/status, for the benchmarks that run real
// ps_server processes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace pscluster::bench {

struct Rss {
  uint64_t rss_kib = 0;  // VmRSS: resident now
  uint64_t hwm_kib = 0;  // VmHWM: the kernel's high-water mark of it
};

inline Rss ReadRss(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  Rss r;
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) r.rss_kib = std::stoull(line.substr(6));
    if (line.rfind("VmHWM:", 0) == 0) r.hwm_kib = std::stoull(line.substr(6));
  }
  return r;
}

}  // namespace pscluster::bench
