// A child process for multi-process tests: started with its stdout on a pipe, read line by
// line with bounded waits, stopped by signal. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pscluster::testing {

class Subprocess {
 public:
  // Starts argv[0] (a path) with the given arguments; stderr is inherited.
  static absl::StatusOr<Subprocess> Start(std::vector<std::string> argv);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  ~Subprocess();  // SIGKILLs and reaps a child still running

  // Reads stdout until a line containing `needle`; DEADLINE_EXCEEDED naming what it waited
  // for, or FAILED_PRECONDITION if the child closed stdout first.
  absl::StatusOr<std::string> WaitForLine(const std::string& needle, absl::Duration timeout);

  // Waits (bounded) for the process to exit by itself; returns the raw wait status.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Sends `sig` and waits (bounded) for exit; returns the raw wait status.
  absl::StatusOr<int> Stop(int sig, absl::Duration timeout);
  // SIGSTOP, and waits (bounded) until every thread has stopped. kill() returns before
  // that: the kernel wakes one thread to start the group stop, and on a loaded machine the
  // others can still run (answer a request) until it is scheduled. SIGCONT resumes it.
  absl::Status Pause(absl::Duration timeout);

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

 private:
  Subprocess(pid_t pid, int out_fd, std::string name);
  // Polls waitpid(WNOHANG | flags) until it reports the child (its raw status), or
  // DEADLINE_EXCEEDED saying it did not `what` within `timeout`.
  absl::StatusOr<int> Poll(int flags, absl::Duration timeout, const char* what);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string name_;
  std::string buffered_;
};

// Runs a short-lived command to its end: every line it printed, or the error (naming the
// command and its output) if it did not exit 0 within `timeout` per line and at the end.
absl::StatusOr<std::string> OutputOf(std::vector<std::string> argv,
                                     absl::Duration timeout = absl::Seconds(30));

// "host:port" parsed from a "... listening on host:port" line.
absl::StatusOr<std::string> ListeningAddress(const std::string& line);

}  // namespace pscluster::testing
