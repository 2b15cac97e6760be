#include "tools/psctl/top_input.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>

namespace pscluster::psctl {

KeyboardMode::KeyboardMode() {
  tty_ = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0;
  if (!tty_) return;
  termios keys = saved_;
  keys.c_lflag &= ~(ICANON | ECHO);  // ISIG stays: Ctrl-C is still a SIGINT
  keys.c_cc[VMIN] = 1;
  keys.c_cc[VTIME] = 0;
  tcsetattr(STDIN_FILENO, TCSANOW, &keys);
}

KeyboardMode::~KeyboardMode() {
  if (tty_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
}

QuitSignals::QuitSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0) fd_ = signalfd(-1, &set, SFD_CLOEXEC);
}

QuitSignals::~QuitSignals() {
  if (fd_ >= 0) close(fd_);
}

bool AwaitQuit(const KeyboardMode& keyboard, int signal_fd, absl::Duration interval) {
  pollfd fds[2] = {{signal_fd, POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
  const double ms = std::ceil(absl::ToDoubleMilliseconds(interval));
  const int timeout_ms = static_cast<int>(std::clamp(ms, 1.0, static_cast<double>(INT_MAX)));
  if (poll(fds, keyboard.tty() ? 2 : 1, timeout_ms) <= 0) return false;  // time to redraw
  if (fds[0].revents != 0) return true;
  char keys[64];
  const ssize_t got = read(STDIN_FILENO, keys, sizeof keys);
  if (got < 0) return errno != EINTR && errno != EAGAIN;
  return got == 0 || std::memchr(keys, 'q', got) != nullptr ||
         std::memchr(keys, 'Q', got) != nullptr;  // any other key: redraw now
}

}  // namespace pscluster::psctl
