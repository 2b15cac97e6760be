// Recycles the byte buffers that received chunks are parsed into. Without it every chunk
// of a push stream lands in a freshly allocated megabyte, and the kernel page-faults and
// zeroes it on first touch: at loopback speeds that costs as much as the copy itself.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pscluster::ps {

class BufferPool {
 public:
  // Keeps at most `max_bytes` of capacity for reuse; the rest is freed.
  explicit BufferPool(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // An empty string, with capacity from an earlier Put when one is pooled.
  std::string Get() {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) return {};
    std::string s = std::move(free_.back());
    free_.pop_back();
    pooled_bytes_ -= s.capacity();
    s.clear();
    return s;
  }

  void Put(std::string s) {
    absl::MutexLock lock(&mu_);
    if (pooled_bytes_ + s.capacity() > max_bytes_) return;
    pooled_bytes_ += s.capacity();
    free_.push_back(std::move(s));
  }

 private:
  const uint64_t max_bytes_;
  absl::Mutex mu_;
  std::vector<std::string> free_ ABSL_GUARDED_BY(mu_);
  uint64_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster::ps
