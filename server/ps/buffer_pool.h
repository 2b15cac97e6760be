// Recycles the byte buffers that received chunks are parsed into. Without it every chunk
// of a push stream lands in a freshly allocated megabyte, and the kernel page-faults and
// zeroes it on first touch: at loopback speeds that costs as much as the copy itself.
// A buffer is handed out only for chunks it fits without waste (capacity at most twice the
// expected size), so a stream of small chunks never holds large buffers. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pscluster::ps {

class BufferPool {
 public:
  // Keeps at most `max_bytes` of capacity for reuse; the rest is freed.
  explicit BufferPool(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // An empty string: with capacity in [expected_bytes, 2 * expected_bytes] from an earlier
  // Put when one is pooled, else a fresh one.
  std::string Get(uint64_t expected_bytes) {
    absl::MutexLock lock(&mu_);
    auto it = free_.lower_bound(expected_bytes);
    if (it == free_.end() || it->first > 2 * expected_bytes) return {};
    std::string s = std::move(it->second);
    free_.erase(it);
    pooled_bytes_ -= s.capacity();
    s.clear();
    return s;
  }

  void Put(std::string s) {
    if (s.capacity() <= sizeof(std::string)) return;  // nothing allocated (small-string)
    absl::MutexLock lock(&mu_);
    if (pooled_bytes_ + s.capacity() > max_bytes_) return;
    pooled_bytes_ += s.capacity();
    const size_t capacity = s.capacity();
    free_.emplace(capacity, std::move(s));
  }

  // Frees every pooled buffer.
  void Clear() {
    std::multimap<uint64_t, std::string> dropped;
    absl::MutexLock lock(&mu_);
    dropped.swap(free_);
    pooled_bytes_ = 0;
  }

 private:
  const uint64_t max_bytes_;
  absl::Mutex mu_;
  std::multimap<uint64_t, std::string> free_ ABSL_GUARDED_BY(mu_);  // by capacity
  uint64_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster::ps
