#include "tests/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pscluster::testing {

absl::StatusOr<Subprocess> Subprocess::Start(std::vector<std::string> argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  return Subprocess(pid, fds[0], absl::StrJoin(argv, " "));
}

Subprocess::Subprocess(pid_t pid, int out_fd, std::string name)
    : pid_(pid), out_fd_(out_fd), name_(std::move(name)) {}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(o.pid_),
      out_fd_(o.out_fd_),
      name_(std::move(o.name_)),
      buffered_(std::move(o.buffered_)) {
  o.pid_ = -1;
  o.out_fd_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

absl::StatusOr<std::string> Subprocess::WaitForLine(const std::string& needle,
                                                    absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t eol;
    while ((eol = buffered_.find('\n')) != std::string::npos) {
      std::string line = buffered_.substr(0, eol);
      buffered_.erase(0, eol + 1);
      if (line.find(needle) != std::string::npos) return line;
    }
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{out_fd_, POLLIN, 0};
    if (ms <= 0 || poll(&p, 1, ms) == 0) {
      return absl::DeadlineExceededError(absl::StrCat("waited ", absl::FormatDuration(timeout),
                                                      " for a line with '", needle, "' from ",
                                                      name_));
    }
    char buf[4096];
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(name_, " closed stdout before printing '", needle, "'"));
    }
    buffered_.append(buf, n);
  }
}

absl::StatusOr<int> Subprocess::Poll(int flags, absl::Duration timeout, const char* what) {
  // Bounded wait: poll waitpid(WNOHANG) against a deadline.
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG | flags) == 0) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name_, " did not ", what, " within ", absl::FormatDuration(timeout)));
    }
    usleep(2000);
  }
  return status;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("process already stopped");
  absl::StatusOr<int> status = Poll(0, timeout, "exit");
  if (status.ok()) pid_ = -1;
  return status;
}

absl::Status Subprocess::Pause(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("process already stopped");
  if (kill(pid_, SIGSTOP) != 0) {
    return absl::InternalError(absl::StrCat("SIGSTOP to ", name_, ": ", std::strerror(errno)));
  }
  // waitpid reports the stop once the group stop is complete: every thread stopped.
  absl::StatusOr<int> status = Poll(WUNTRACED, timeout, "stop");
  if (!status.ok()) return status.status();
  if (WIFSTOPPED(*status)) return absl::OkStatus();
  pid_ = -1;
  return absl::FailedPreconditionError(absl::StrCat(name_, " exited instead of stopping"));
}

absl::StatusOr<int> Subprocess::Stop(int sig, absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("process already stopped");
  kill(pid_, sig);
  return Wait(timeout);
}

absl::StatusOr<std::string> ListeningAddress(const std::string& line) {
  size_t at = line.rfind("listening on ");
  if (at == std::string::npos) return absl::InvalidArgumentError("no 'listening on' in: " + line);
  std::string rest = line.substr(at + 13);
  return rest.substr(0, rest.find(' '));  // "host:port (TLS, ...)"
}

absl::StatusOr<std::string> OutputOf(std::vector<std::string> argv, absl::Duration timeout) {
  absl::StatusOr<Subprocess> p = Subprocess::Start(std::move(argv));
  if (!p.ok()) return p.status();
  std::string out;
  for (auto line = p->WaitForLine("", timeout); line.ok(); line = p->WaitForLine("", timeout)) {
    out += *line + "\n";
  }
  absl::StatusOr<int> status = p->Wait(timeout);
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(
        absl::StrCat(p->name(), " ended with wait status ", *status, "; it printed:\n", out));
  }
  return out;
}

}  // namespace pscluster::testing
