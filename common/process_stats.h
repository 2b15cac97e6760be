// The process's CPU time, memory, start time and file descriptors, read from /proc as
// Prometheus' own client libraries read them for their standard process_* metrics.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pscluster {

struct ProcessStats {
  double cpu_seconds = 0;  // user + system
  uint64_t virtual_bytes = 0;
  uint64_t resident_bytes = 0;
  double start_time_seconds = 0;  // unix time
  int64_t open_fds = 0;
  int64_t max_fds = 0;  // the soft limit
};

// INTERNAL naming the file that could not be read or parsed.
absl::StatusOr<ProcessStats> ReadProcessStats();

// The fields of a /proc/<pid>/stat line after the command's closing parenthesis (the
// command may itself hold spaces and parentheses), from field 3 (the state) on; empty for
// a line without one. Exposed for tests.
std::string StatFieldsAfterCommand(const std::string& line);

}  // namespace pscluster
