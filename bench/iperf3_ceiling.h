// The ceilings' loopback bandwidth as iperf3 measures it: what the kernel moves, with no
// request/answer turn at all.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pscluster::bench {

// Loopback TCP as `iperf3` measures it (one stream, 2 s), in GB/s; 0 when it cannot run
// (empty: not asked for).
inline double Iperf3Gbps(const std::string& iperf3) {
  if (iperf3.empty()) return 0;
  const std::string port = absl::StrCat(20000 + getpid() % 20000);
  std::thread server([&] {  // one test, then it exits; bounded if the client never comes
    std::system(
        absl::StrCat("timeout 30 ", iperf3, " -s -1 -p ", port, " >/dev/null 2>&1").c_str());
  });
  double gbps = 0;
  for (int attempt = 0; attempt < 50 && gbps == 0; ++attempt) {  // until the server listens
    FILE* p = ::popen(
        absl::StrCat(iperf3, " -c 127.0.0.1 -p ", port, " -t 2 -J 2>/dev/null").c_str(), "r");
    std::string json;
    char buf[4096];
    for (size_t k; p != nullptr && (k = std::fread(buf, 1, sizeof(buf), p)) > 0;) {
      json.append(buf, k);
    }
    if (p != nullptr) ::pclose(p);
    const size_t at = json.find("\"sum_received\"");
    const size_t bps = at == std::string::npos ? at : json.find("\"bits_per_second\":", at);
    if (bps != std::string::npos) {
      gbps = std::strtod(json.c_str() + bps + 18, nullptr) / 8e9;
    } else {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  server.join();
  if (gbps == 0) {
    std::fprintf(stderr,
                 "ps_throughput: %s did not run (Debian: apt-get install iperf3); no iperf3 "
                 "figure\n",
                 iperf3.c_str());
  }
  return gbps;
}

}  // namespace pscluster::bench
