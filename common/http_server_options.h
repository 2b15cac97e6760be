// The civetweb options of every HTTP endpoint (the metrics, the status page). civetweb
// serves each connection on a thread of its own, from reading the request head to the
// answer, so a connection that sends half a request and then nothing holds a thread until
// the request timeout (30 s by default): two dozen such connections (slowloris) stopped
// every scrape. Hence: a request head must arrive within 2 s (a scraper's and a browser's
// come at once); a kept-alive connection idles 2 s at most; 64 threads (an idle one costs
// its stack's address space, not memory) and 64 accepted connections queued for one.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pscluster {

inline std::vector<std::string> HttpServerOptions(const std::string& host, int port) {
  return {"listening_ports",       absl::StrCat(host, ":", port),
          "num_threads",           "64",
          "connection_queue",      "64",
          "request_timeout_ms",    "2000",
          "keep_alive_timeout_ms", "2000"};
}

}  // namespace pscluster
