// The memory a sparse table's stored rows take (issue 46): RowStore, the shards' store now
// (server/ps/table/row_store.h), beside the map of keys to std::vector rows it replaced
// (rebuilt here, as the table held it: absl::flat_hash_map<uint64_t, {updates, vector}>)
// and beside the ceiling, the raw row (its floats, a key, an update count). Each round
// stores N rows of `width` floats in one layout, then the other, and reads the growth of
// this process's resident memory (free pages given back between them, malloc_trim).
// Prints one JSON line: medians over the rounds of the bytes a row costs.
//   sparse_row_memory [ROWS=1000000] [WIDTH=32] [ROUNDS=5]
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/process_memory.h"
#include "server/ps/table/row_store.h"

namespace {

struct OldRow {
  int64_t updates = 0;
  std::vector<float> data;
};

// Resident bytes this layout's N rows add.
template <typename Fill>
double Growth(size_t rows, Fill fill) {
  malloc_trim(0);
  const double before = static_cast<double>(pscluster::ResidentMemoryBytes());
  const double after = fill(rows);
  malloc_trim(0);
  return (after - before) / rows;
}

double RowStoreRows(size_t rows, size_t width) {
  return Growth(rows, [width](size_t n) {
    pscluster::ps::RowStore store(width);
    for (uint64_t k = 0; k < n; ++k) {
      store.FindOrInsert(k * 0x9E3779B97F4A7C15ull,
                         [width](float* r) { std::fill_n(r, width, 0.5f); });
    }
    return static_cast<double>(pscluster::ResidentMemoryBytes());
  });
}

double MapRows(size_t rows, size_t width) {
  return Growth(rows, [width](size_t n) {
    absl::flat_hash_map<uint64_t, OldRow> map;
    for (uint64_t k = 0; k < n; ++k) {
      auto [it, inserted] = map.try_emplace(k * 0x9E3779B97F4A7C15ull);
      it->second.data.assign(width, 0.5f);
    }
    return static_cast<double>(pscluster::ResidentMemoryBytes());
  });
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t rows = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  const size_t width = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 32;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  const double raw = width * sizeof(float) + 2 * sizeof(uint64_t);
  std::vector<double> store, map;
  for (int r = 0; r < rounds; ++r) {  // interleaved, and each side first in turn
    if (r % 2 == 0) {
      store.push_back(RowStoreRows(rows, width));
      map.push_back(MapRows(rows, width));
    } else {
      map.push_back(MapRows(rows, width));
      store.push_back(RowStoreRows(rows, width));
    }
    std::fprintf(stderr, "round %d/%d: RowStore %.1f, map of vectors %.1f bytes a row\n", r + 1,
                 rounds, store.back(), map.back());
  }
  std::printf(
      "{\"rows\": %zu, \"width\": %zu, \"rounds\": %d, \"raw_bytes\": %.0f, "
      "\"row_store_bytes\": %.1f, \"map_bytes\": %.1f}\n",
      rows, width, rounds, raw, Median(store), Median(map));
  return 0;
}
