// Free buffers kept by capacity for reuse, up to a bound. Fresh memory of a megabyte or more
// costs a page fault per page on first touch (on a virtual machine as much as the copy
// into it), so the bulk paths recycle theirs: the shard the buffers it parses pushed chunks
// into (server/ps/service/buffer_pool.h), the encoders the blocks of the messages they send
// (common/dense_wire.cc). A buffer is handed out only for a request it fits without waste
// (capacity at most twice the size asked for), so small requests never hold large buffers.
// Thread-safe.
//
// `Buffer` is a movable owner of its memory (std::string, std::unique_ptr with a deleter):
// a buffer the pool does not keep is dropped, and its destructor frees it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pscluster {

template <typename Buffer>
class SizePool {
 public:
  // Keeps at most `max_bytes` of capacity; the rest is freed.
  explicit SizePool(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  SizePool(const SizePool&) = delete;
  SizePool& operator=(const SizePool&) = delete;

  // A pooled buffer with capacity in [bytes, 2 * bytes], or none.
  std::optional<Buffer> Take(uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    auto it = free_.lower_bound(bytes);
    if (it == free_.end() || it->first > 2 * bytes) return std::nullopt;
    std::optional<Buffer> b(std::move(it->second));
    pooled_bytes_ -= it->first;
    free_.erase(it);
    return b;
  }

  // Keeps `b`, whose capacity is `capacity` bytes, unless that would pass the bound; a
  // buffer not kept is freed after the lock is released.
  void Put(uint64_t capacity, Buffer b) {
    absl::MutexLock lock(&mu_);
    if (pooled_bytes_ + capacity > max_bytes_) return;
    pooled_bytes_ += capacity;
    free_.emplace(capacity, std::move(b));
  }

  // Frees every pooled buffer.
  void Clear() {
    std::multimap<uint64_t, Buffer> dropped;
    absl::MutexLock lock(&mu_);
    dropped.swap(free_);
    pooled_bytes_ = 0;
  }  // (`dropped` goes after the lock: its destructor runs last)

  uint64_t pooled_bytes() const {
    absl::MutexLock lock(&mu_);
    return pooled_bytes_;
  }

 private:
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::multimap<uint64_t, Buffer> free_ ABSL_GUARDED_BY(mu_);  // by capacity
  uint64_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster
