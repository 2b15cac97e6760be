// What an operator sets on a shard's services (ps_server's flags fill it in).
#pragma once

#include <cstdint>

#include "absl/time/time.h"

namespace pscluster::ps {

struct ServiceOptions {
  // Largest DenseChunk.data / sparse payload accepted or sent, in bytes.
  uint64_t max_chunk_bytes = uint64_t{4} << 20;
  // Longest a pull waits for its consistency bound when the caller set no shorter deadline.
  absl::Duration max_wait = absl::Minutes(5);
  // Capacity of received-chunk buffers kept for reuse across push streams (at most a quarter
  // of max_inflight_request_bytes).
  uint64_t buffer_pool_bytes = uint64_t{256} << 20;
  // Most bytes the requests in flight may hold at once (RequestBudget): a push stream holds
  // its whole transfer until it is applied, an import or export the table's whole state; one
  // that would go over is refused with RESOURCE_EXHAUSTED. Unary requests and pulls count
  // what they hold but are never refused (gRPC has received them already).
  uint64_t max_inflight_request_bytes = uint64_t{1} << 30;
  // Once no request has held memory for this long and the process grew by at least
  // release_min_bytes since the last time, the pooled buffers are freed and the heap's free
  // pages go back to the kernel (malloc_trim). InfiniteDuration: never.
  absl::Duration release_idle_memory_after = absl::Seconds(2);
  uint64_t release_min_bytes = uint64_t{32} << 20;
  // A push or import stream that receives nothing for this long is cancelled, and nothing
  // of it applied (StreamWatchdog). InfiniteDuration: never.
  absl::Duration stream_idle_timeout = absl::Seconds(30);
  // Most threads that apply and hand on the updates a replica receives from the one before
  // it (each waits for its successor's answer) and stream its state to a joiner (ps_server
  // --threads). An update waiting for its turn holds none.
  int replication_threads = 64;
};

// gRPC's own message limit for a server using `options`: a chunk plus its header.
inline int MaxMessageBytes(const ServiceOptions& options) {
  return static_cast<int>(options.max_chunk_bytes + (64 << 10));
}

inline constexpr int kMaxExceptClients = 64;  // StatsRequest.except_clients

}  // namespace pscluster::ps
