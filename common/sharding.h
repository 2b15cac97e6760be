// How tables are split across parameter-server shards. The client and every shard compute
// placement with these same functions, so they agree without a lookup.
#pragma once

#include <cstdint>

namespace pscluster {

// Half-open range [begin, end) of global value indices.
struct Range {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const Range& o) const { return begin == o.begin && end == o.end; }
};

// Dense tables: shard `shard` of `num_shards` holds a contiguous, balanced range of a
// tensor of `size` values (sizes differ by at most one). Requires shard < num_shards.
Range DenseShardRange(uint64_t size, uint32_t shard, uint32_t num_shards);

// A well-mixed 64-bit hash (splitmix64 finaliser): consecutive keys spread evenly.
uint64_t Mix64(uint64_t x);

// Sparse tables: the shard that owns `key`. Requires num_shards > 0.
uint32_t SparseShardOf(uint64_t key, uint32_t num_shards);

// The intersection of two ranges (empty, begin == end, when disjoint).
Range Intersect(Range a, Range b);

}  // namespace pscluster
