#include "common/sharding.h"

#include <algorithm>

namespace pscluster {

Range DenseShardRange(uint64_t size, uint32_t shard, uint32_t num_shards) {
  using u128 = unsigned __int128;
  auto bound = [&](uint32_t i) {
    return static_cast<uint64_t>(static_cast<u128>(size) * i / num_shards);
  };
  return Range{bound(shard), bound(shard + 1)};
}

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint32_t SparseShardOf(uint64_t key, uint32_t num_shards) {
  return static_cast<uint32_t>(Mix64(key) % num_shards);
}

Range Intersect(Range a, Range b) {
  uint64_t begin = std::max(a.begin, b.begin);
  uint64_t end = std::min(a.end, b.end);
  return begin < end ? Range{begin, end} : Range{begin, begin};
}

}  // namespace pscluster
