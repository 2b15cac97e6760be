// Latency of one point-to-point exchange between two ranks (each sends n bytes to the other
// and receives the other's, as a pipeline stage does every micro-batch), through the Gloo
// communicator, against the same exchange over a plain loopback TCP connection (each side
// writes, then busy-polls its reads; TCP_NODELAY): the physical ceiling on this machine.
// Two ranks as threads; microseconds per exchange, medians of rounds.
//
//   bazel run -c opt //bench:p2p_latency -- [--iterations=2000] [--rounds=5]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "bench/median.h"
#include "worker/collective/communicator.h"

ABSL_FLAG(int, iterations, 2000, "Exchanges per figure (after 100 unmeasured).");
ABSL_FLAG(int, rounds, 5, "Rounds over every size; the figures are medians.");

using namespace pscluster;

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

// Microseconds per exchange of `bytes` each way, through the communicator.
double GlooExchange(size_t bytes, int iterations) {
  collective::MemoryRendezvous store;
  double us = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = collective::CreateGlooCommunicator(&store, collective::GlooOptions{r, 2});
      Check(c.ok(), "connecting");
      std::vector<float> out(bytes / sizeof(float), 1.0f), in(out.size());
      absl::Time start;
      for (int i = 0; i < iterations + 100; ++i) {
        if (i == 100) start = absl::Now();
        Check((*c)->SendRecv(out, 1 - r, i, absl::MakeSpan(in), 1 - r, i).ok(), "exchange");
      }
      if (r == 0) us = absl::ToDoubleMicroseconds(absl::Now() - start) / iterations;
    });
  }
  for (auto& t : threads) t.join();
  return us;
}

void WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    Check(w > 0, "write");
    p += w, n -= w;
  }
}

// Busy-polls (the communicator polls for up to 200 us before it sleeps).
void ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && errno == EAGAIN) continue;
    Check(r > 0, "read");
    p += r, n -= r;
  }
}

// The same over one loopback TCP connection.
double TcpExchange(size_t bytes, int iterations) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  Check(bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0, "bind");
  Check(listen(listener, 1) == 0 &&
            getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
        "listen");
  int fds[2];
  fds[0] = socket(AF_INET, SOCK_STREAM, 0);
  Check(connect(fds[0], reinterpret_cast<sockaddr*>(&addr), len) == 0, "connect");
  fds[1] = accept(listener, nullptr, nullptr);
  Check(fds[1] >= 0, "accept");
  close(listener);
  double us = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const int one = 1;
      setsockopt(fds[r], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::vector<char> out(bytes, 1), in(bytes);
      absl::Time start;
      for (int i = 0; i < iterations + 100; ++i) {
        if (i == 100) start = absl::Now();
        WriteAll(fds[r], out.data(), bytes);
        ReadAll(fds[r], in.data(), bytes);
      }
      if (r == 0) us = absl::ToDoubleMicroseconds(absl::Now() - start) / iterations;
    });
  }
  for (auto& t : threads) t.join();
  close(fds[0]);
  close(fds[1]);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int iterations = absl::GetFlag(FLAGS_iterations), rounds = absl::GetFlag(FLAGS_rounds);
  const std::vector<size_t> sizes = {4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10};
  std::vector<std::vector<double>> gloo(sizes.size()), tcp(sizes.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      gloo[i].push_back(GlooExchange(sizes[i], iterations));
      tcp[i].push_back(TcpExchange(sizes[i], iterations));
    }
    std::fprintf(stderr, "round %d of %d done\n", round + 1, rounds);
  }
  std::printf(
      "| bytes each way | Gloo communicator, us | loopback TCP, us | communicator / TCP |\n"
      "|---|---|---|---|\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double g = bench::Median(gloo[i]), t = bench::Median(tcp[i]);
    std::printf("| %zu KiB | %.1f | %.1f | %.2f |\n", sizes[i] >> 10, g, t, g / t);
  }
  return 0;
}
