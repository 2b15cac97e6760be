// Recycles the byte buffers that received chunks are parsed into. Without it every chunk
// of a push stream lands in a freshly allocated megabyte, and the kernel page-faults and
// zeroes it on first touch: at loopback speeds that costs as much as the copy itself.
// The pooling itself (reuse within 2x of the size, a byte bound) is common/size_pool.h's.
#pragma once

#include <cstdint>
#include <string>

#include "common/size_pool.h"

namespace pscluster::ps {

class BufferPool {
 public:
  // Keeps at most `max_bytes` of capacity for reuse; the rest is freed.
  explicit BufferPool(uint64_t max_bytes) : pool_(max_bytes) {}

  // An empty string: with capacity in [expected_bytes, 2 * expected_bytes] from an earlier
  // Put when one is pooled, else a fresh one.
  std::string Get(uint64_t expected_bytes) {
    std::string s = pool_.Take(expected_bytes).value_or(std::string());
    s.clear();
    return s;
  }

  void Put(std::string s) {
    if (s.capacity() <= sizeof(std::string)) return;  // nothing allocated (small-string)
    const uint64_t capacity = s.capacity();
    pool_.Put(capacity, std::move(s));
  }

  // Frees every pooled buffer.
  void Clear() { pool_.Clear(); }

 private:
  SizePool<std::string> pool_;
};

}  // namespace pscluster::ps
