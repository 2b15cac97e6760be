// What psctl top reads besides the coordinator: keys from a terminal and the quit signals,
// waited for together between redraws.
#pragma once

#include <termios.h>

#include "absl/time/time.h"

namespace pscluster::psctl {

// Stdin in non-canonical no-echo mode (each key arrives at once, unechoed) while this lives,
// if stdin is a terminal; restored on destruction. Not thread-safe.
class KeyboardMode {
 public:
  KeyboardMode();
  ~KeyboardMode();
  KeyboardMode(const KeyboardMode&) = delete;
  KeyboardMode& operator=(const KeyboardMode&) = delete;

  bool tty() const { return tty_; }

 private:
  termios saved_{};
  bool tty_ = false;
};

// SIGINT and SIGTERM blocked and readable on fd() (signalfd), so that poll() sees them beside
// the keys: no handler, no global. Construct it before any gRPC thread exists (threads inherit
// the mask). They stay blocked after destruction, on the way out: a second Ctrl-C then cannot
// turn top's exit 0 into death by signal. Not thread-safe.
class QuitSignals {
 public:
  QuitSignals();
  ~QuitSignals();
  QuitSignals(const QuitSignals&) = delete;
  QuitSignals& operator=(const QuitSignals&) = delete;

  int fd() const { return fd_; }  // -1: could not be set up

 private:
  int fd_ = -1;
};

// Waits up to `interval` (the wait between redraws) for a key or a quit signal; true when
// top should quit: 'q', Ctrl-C or SIGTERM, or the terminal gone.
bool AwaitQuit(const KeyboardMode& keyboard, int signal_fd, absl::Duration interval);

}  // namespace pscluster::psctl
