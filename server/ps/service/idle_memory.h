// Gives a shard's idle memory back. Requests leave memory behind when they end: recycled
// chunk buffers and message blocks (internal::ReleasePooledMessageMemory), and freed heap
// pages that glibc keeps for reuse (ps_server raises its mmap threshold so that buffers of a
// few MB come from the heap), as do connections that close. While requests keep coming that
// is what makes them fast; once nothing has held request memory for a while, a thread gives
// it back.
#pragma once

#include <cstdint>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/ps/service/buffer_pool.h"
#include "server/ps/service/request_budget.h"

namespace pscluster::ps {

class IdleMemoryReleaser {
 public:
  // Releases once `budget` has been idle for `idle` and the process grew by `min_bytes`
  // since the last release. InfiniteDuration: never (no thread).
  IdleMemoryReleaser(RequestBudget* budget, BufferPool* buffers, absl::Duration idle,
                     uint64_t min_bytes);
  ~IdleMemoryReleaser();

 private:
  void Run();

  RequestBudget* const budget_;
  BufferPool* const buffers_;
  const absl::Duration idle_;
  const uint64_t min_bytes_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once everything it uses exists
};

}  // namespace pscluster::ps
