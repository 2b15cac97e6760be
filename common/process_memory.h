// The process's resident memory, from /proc/self/statm (0 where it cannot be read).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>

namespace pscluster {

inline uint64_t ResidentMemoryBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace pscluster
