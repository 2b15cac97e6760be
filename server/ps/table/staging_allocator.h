// Allocator for snapshot staging arrays. A capture copies the whole table while pushes are
// blocked, so its destination must be ready: large arrays are anonymous mappings with
// transparent huge pages, pre-faulted when allocated (outside the lock), and their floats
// are left uninitialised (the capture overwrites every one). Small arrays use operator new.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace pscluster::ps {

template <typename T>
class StagingAllocator {
 public:
  using value_type = T;
  static constexpr size_t kMapBytes = size_t{1} << 20;

  StagingAllocator() = default;
  template <typename U>
  StagingAllocator(const StagingAllocator<U>&) {}  // NOLINT: allocators convert implicitly

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kMapBytes) return static_cast<T*>(::operator new(bytes));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);
    for (size_t at = 0; at < bytes; at += 4096) static_cast<volatile char*>(p)[at] = 0;
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kMapBytes) {
      ::operator delete(p);
    } else {
      munmap(p, bytes);
    }
  }

  // Default-initialise (no zeroing) on resize; construct normally otherwise.
  template <typename U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  bool operator==(const StagingAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const StagingAllocator<U>&) const {
    return false;
  }
};

using StagingArray = std::vector<float, StagingAllocator<float>>;

}  // namespace pscluster::ps
