// What the sparse table's tests share: specs, a table with its workers, pushes and reads,
// and the rows a table stores (as a snapshot or a joining replica gets them).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {

inline constexpr float kInit = 1.0f;  // SparseSpec's initial value

inline TableSpec SparseSpec(uint32_t dim, ConsistencyConfig::Mode mode, float lr) {
  TableSpec spec;
  spec.set_table_id(2);
  spec.set_name("embeddings");
  spec.set_kind(TableSpec::SPARSE);
  spec.set_dim(dim);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(lr);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_initializer()->set_kind(InitializerConfig::CONSTANT);
  spec.mutable_initializer()->set_value(kInit);
  return spec;
}

inline std::unique_ptr<SparseTable> MakeTable(const TableSpec& spec,
                                              const std::vector<int32_t>& workers,
                                              uint32_t shard = 0, uint32_t num_shards = 1) {
  std::unique_ptr<SparseTable> table = SparseTable::Create(spec, shard, num_shards).value();
  for (int32_t w : workers) table->AddWorker(w);
  return table;
}

inline std::vector<float> ReadRows(SparseTable& table, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * table.spec().dim());
  absl::Status s = table.Read(keys, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

inline absl::Status PushRows(SparseTable& table, int32_t worker, int64_t step,
                             const std::vector<uint64_t>& keys, const std::vector<float>& grads,
                             bool* skipped = nullptr) {
  bool ignored = false;
  return table.Push(worker, step, keys, grads, skipped ? skipped : &ignored);
}

// What a sparse table stores of a row: its update count, then its values and optimizer
// slots as bits (so that equal means bitwise equal).
using StoredRow = std::pair<int64_t, std::vector<uint32_t>>;

// Every stored row by key, as a snapshot or a joining replica would get it.
inline std::map<uint64_t, StoredRow> StoredRows(SparseTable& table) {
  std::map<uint64_t, StoredRow> rows;
  auto image = table.CaptureNow();
  EXPECT_TRUE(image.ok()) << image.status();
  if (!image.ok()) return rows;
  const size_t n = (*image)->keys.empty() ? 0 : (*image)->row_data.size() / (*image)->keys.size();
  for (size_t i = 0; i < (*image)->keys.size(); ++i) {
    std::vector<uint32_t> bits(n);
    std::memcpy(bits.data(), (*image)->row_data.data() + i * n, n * sizeof(float));
    rows[(*image)->keys[i]] = {(*image)->row_updates[i], std::move(bits)};
  }
  return rows;
}

}  // namespace pscluster::ps
