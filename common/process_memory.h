// The process's resident memory, from /proc/self/statm, and its peak, from
// /proc/self/status (0 where they cannot be read).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace pscluster {

inline uint64_t ResidentMemoryBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// The highest resident memory so far (VmHWM).
inline uint64_t PeakResidentMemoryBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  uint64_t kib = 0;
  while (status >> key) {
    if (key == "VmHWM:" && status >> kib) return kib * 1024;
    status.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace pscluster
