#include "server/ps/service/idle_memory.h"

#include <malloc.h>

#include <algorithm>

#include "common/dense_wire.h"
#include "common/process_memory.h"

namespace pscluster::ps {
namespace {

// The process's resident memory and the bytes free in its heap.
struct Heap {
  uint64_t resident = 0, free = 0;
};
Heap HeapNow() {
  Heap h;
  h.resident = ResidentMemoryBytes();
  h.free = mallinfo2().fordblks;
  return h;
}

}  // namespace

IdleMemoryReleaser::IdleMemoryReleaser(RequestBudget* budget, BufferPool* buffers,
                                       absl::Duration idle, uint64_t min_bytes)
    : budget_(budget), buffers_(buffers), idle_(idle), min_bytes_(min_bytes) {
  if (idle_ != absl::InfiniteDuration()) thread_ = std::thread([this] { Run(); });
}

IdleMemoryReleaser::~IdleMemoryReleaser() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void IdleMemoryReleaser::Run() {
  Heap released = HeapNow();  // the lowest since the last release
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), idle_ / 2)) {
    if (budget_->IdleFor() < idle_) continue;
    const Heap now = HeapNow();
    if (now.resident < released.resident + min_bytes_ && now.free < released.free + min_bytes_) {
      released.resident = std::min(released.resident, now.resident);
      released.free = std::min(released.free, now.free);
      continue;
    }
    mu_.Unlock();
    buffers_->Clear();
    internal::ReleasePooledMessageMemory();
    malloc_trim(0);
    released = HeapNow();
    mu_.Lock();
  }
}

}  // namespace pscluster::ps
