// RowStore: a sparse table's stored rows with little beside the rows themselves. Rows live
// in blocks of kRowsPerBlock (each row `width` floats: the values, then each optimizer
// slot), with each row's key and update count beside it in the same block; an open-
// addressing index (absl::flat_hash_set of 4-byte row numbers, hashed and compared through
// the keys in the blocks) finds a key's row. A row costs its floats, 16 bytes of key and
// count, and 5-11 bytes of index (its load between 7/16 and 7/8): no allocation of its
// own, no pointers. (The map of keys to std::vector rows it replaces spent a heap block
// and about 40 bytes of bookkeeping on every row.) A store that tracks steps keeps, beside
// each row, the step of its last update (8 bytes more), for eviction; one that tracks
// versions keeps the table's change count at it (8 more), for incremental snapshots. Rows keep
// their place in insertion order until one is removed, when the last row takes its place: replicas
// that apply the same updates and removals iterate alike. Not thread-safe (the table's lock guards
// it); neither copyable nor movable (the index refers to the store).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"

namespace pscluster::ps {

class RowStore {
 public:
  static constexpr size_t kRowsPerBlock = 4096;

  explicit RowStore(size_t width, bool track_steps = false, bool track_versions = false);
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  struct Row {
    float* data = nullptr;  // width floats; null: no such row
    int64_t* updates = nullptr;
    int64_t* step = nullptr;      // its last update's step; null unless the store tracks steps
    uint64_t* version = nullptr;  // the change its last update was; null unless tracked
    explicit operator bool() const { return data != nullptr; }
  };

  size_t size() const { return size_; }
  size_t width() const { return width_; }
  bool tracks_steps() const { return track_steps_; }
  bool tracks_versions() const { return track_versions_; }
  bool Contains(uint64_t key) const { return index_.find(Key{key}) != index_.end(); }
  // Starts loading the index entry of `key` into the cache: a loop over many keys that
  // prefetches a few ahead overlaps their cache misses instead of taking them one by one.
  void Prefetch(uint64_t key) const { index_.prefetch(Key{key}); }
  // The stored row of `key`, or a null Row.
  Row Find(uint64_t key) const;
  // The row of `key`; a new one (update count 0) is filled by init(data) first.
  template <typename Init>
  Row FindOrInsert(uint64_t key, Init init) {
    if (Row r = Find(key)) return r;
    return Insert(key, init);
  }
  // A new row for `key`, which has none (update count 0), filled by init(data).
  template <typename Init>
  Row Insert(uint64_t key, Init init) {
    Row r = Append(key);
    init(r.data);
    return r;
  }
  // fn(key, row) for every stored row, in the store's order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (size_t i = 0; i < size_; ++i) fn(KeyOf(i), RowAt(i));
  }
  // Removes every row for which pred(key, row) holds; returns how many. Blocks no row uses
  // any more are freed.
  template <typename Pred>
  size_t RemoveIf(Pred pred) {
    const size_t before = size_;
    for (size_t i = 0; i < size_;) {
      if (pred(KeyOf(i), RowAt(i))) {
        Remove(i);
      } else {
        ++i;
      }
    }
    FreeUnusedBlocks();
    return before - size_;
  }
  // Removes the row of `key`, if any (the last row takes its place); whether there was one.
  bool Erase(uint64_t key);
  // The bytes the store holds: its blocks (whole, the last one's free rows included) and
  // the index's slots and control bytes.
  uint64_t bytes() const;

 private:
  struct Key {
    uint64_t value;
  };
  struct Block {
    std::unique_ptr<float[]> rows;
    std::unique_ptr<uint64_t[]> keys;
    std::unique_ptr<int64_t[]> updates;
    std::unique_ptr<int64_t[]> steps;      // tracked stores only
    std::unique_ptr<uint64_t[]> versions;  // likewise
  };
  // Hashes and compares row numbers through their keys, and keys directly (heterogeneous
  // lookup: find(Key{k}) needs no row).
  struct Hash {
    using is_transparent = void;
    const RowStore* store;
    size_t operator()(uint32_t row) const { return (*this)(Key{store->KeyOf(row)}); }
    size_t operator()(Key k) const { return absl::Hash<uint64_t>()(k.value); }
  };
  struct Eq {
    using is_transparent = void;
    const RowStore* store;
    uint64_t Of(uint32_t row) const { return store->KeyOf(row); }
    uint64_t Of(Key k) const { return k.value; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Of(a) == Of(b);
    }
  };

  uint64_t KeyOf(uint32_t row) const {
    return blocks_[row / kRowsPerBlock]->keys[row % kRowsPerBlock];
  }
  Row RowAt(size_t row) const;
  Row Append(uint64_t key);
  // Removes row `row`: the last row moves into its place.
  void Remove(size_t row);
  void FreeUnusedBlocks();

  const size_t width_;
  const bool track_steps_;
  const bool track_versions_;
  std::vector<std::unique_ptr<Block>> blocks_;
  size_t size_ = 0;
  absl::flat_hash_set<uint32_t, Hash, Eq> index_;
};

}  // namespace pscluster::ps
