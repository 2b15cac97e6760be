// One line format for every process's log, gRPC's own lines included:
//   2026-12-07T02:52:16.123Z I ps_worker/1 worker 1: epoch 3 test accuracy 0.8512
// (UTC time to the millisecond, the level I/W/E, the process's role and id, the message).
// Information goes to stdout and warnings and errors to stderr, each line flushed as it is
// written, so a launcher that interleaves them keeps their order per stream.
//
//   InitLogging("ps_worker", "1");            // once, first thing in main
//   LogInfo("worker %d: epoch %d done", rank, epoch);   // absl::StrFormat's checked format
//
// Before InitLogging (tests, the Python module) lines carry the program's name as role.
// Built on spdlog (Debian's libspdlog-dev): its sinks are thread-safe and it formats the
// time and level; only the message is formatted here.
#pragma once

#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace spdlog::sinks {
class sink;
}

namespace pscluster {

enum class LogLevel { kInfo, kWarning, kError };

// Sets every later line's role and id, and routes gRPC core's log lines (gpr_log) here,
// with their gRPC severity (DEBUG and INFO as info). Thread-safe; may be called again.
void InitLogging(absl::string_view role, absl::string_view id);

// As InitLogging, writing to these sinks instead of stdout and stderr (tests).
void InitLoggingTo(absl::string_view role, absl::string_view id,
                   std::shared_ptr<spdlog::sinks::sink> out,
                   std::shared_ptr<spdlog::sinks::sink> err);

// One line (a trailing newline in `message` is dropped: the format ends the line).
void Log(LogLevel level, absl::string_view message);

template <typename... Args>
void LogInfo(const absl::FormatSpec<Args...>& format, const Args&... args) {
  Log(LogLevel::kInfo, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogWarning(const absl::FormatSpec<Args...>& format, const Args&... args) {
  Log(LogLevel::kWarning, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  Log(LogLevel::kError, absl::StrFormat(format, args...));
}

}  // namespace pscluster
