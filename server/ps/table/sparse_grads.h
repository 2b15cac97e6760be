// SparseGrads: the gradient rows of a sparse push (or of a BSP step's pushes), one per key,
// in one buffer: the keys in the order they first came, their rows of `dim` floats side by
// side, and a hash index from key to row. A push of a million ids costs a few allocations,
// not a million; the ordered map of vectors it replaced spent a third of a large push's
// time on its nodes (bench/sparse_throughput.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace pscluster::ps {

class SparseGrads {
 public:
  explicit SparseGrads(size_t dim = 0) : dim_(dim) {}

  // The rows of keys.size() keys (grads: keys.size() * dim floats), duplicate keys summed
  // in request order, each sum starting from +0 (so a row reads the same however it came).
  static SparseGrads Of(size_t dim, absl::Span<const uint64_t> keys, absl::Span<const float> grads);

  size_t size() const { return keys_.size(); }
  bool empty() const { return keys_.empty(); }
  size_t dim() const { return dim_; }
  const uint64_t& key(size_t i) const { return keys_[i]; }
  float* row(size_t i) { return values_.data() + i * dim_; }
  const float* row(size_t i) const { return values_.data() + i * dim_; }

  // The row of `key`, or null.
  const float* Find(uint64_t key) const;
  // Starts loading the index entry of `key` (see RowStore::Prefetch).
  void Prefetch(uint64_t key) const { index_.prefetch(key); }
  // Adds g (dim floats) to the row of `key`, a new row starting from +0; returns its number.
  size_t Add(uint64_t key, const float* g);
  // The row of `key` becomes g (a new row when it has none).
  void Put(uint64_t key, const float* g);
  void Clear();
  // Room for `rows` rows without growing (a push in parts: its first part times the count).
  void Reserve(size_t rows);

 private:
  // The number of the row of `key`, appended (zeroed) if it has none.
  size_t RowOf(uint64_t key);

  size_t dim_;
  std::vector<uint64_t> keys_;
  std::vector<float> values_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
};

}  // namespace pscluster::ps
