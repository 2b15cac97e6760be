#include "server/ps/table/sparse_grads.h"

#include <algorithm>

namespace pscluster::ps {

SparseGrads SparseGrads::Of(size_t dim, absl::Span<const uint64_t> keys,
                            absl::Span<const float> grads) {
  SparseGrads out(dim);
  out.keys_.reserve(keys.size());
  out.values_.reserve(keys.size() * dim);
  out.index_.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out.Add(keys[i], grads.data() + i * dim);
  return out;
}

const float* SparseGrads::Find(uint64_t key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : row(it->second);
}

size_t SparseGrads::RowOf(uint64_t key) {
  auto [it, inserted] = index_.try_emplace(key, static_cast<uint32_t>(keys_.size()));
  if (inserted) {
    keys_.push_back(key);
    values_.resize(values_.size() + dim_, 0.0f);
  }
  return it->second;
}

size_t SparseGrads::Add(uint64_t key, const float* g) {
  const size_t i = RowOf(key);
  float* r = row(i);
  for (size_t j = 0; j < dim_; ++j) r[j] += g[j];
  return i;
}

void SparseGrads::Put(uint64_t key, const float* g) {
  auto [it, inserted] = index_.try_emplace(key, static_cast<uint32_t>(keys_.size()));
  if (!inserted) {
    std::copy_n(g, dim_, row(it->second));
    return;
  }
  keys_.push_back(key);
  values_.insert(values_.end(), g, g + dim_);  // not zeroed first: half the writes
}

void SparseGrads::Reserve(size_t rows) {
  keys_.reserve(rows);
  values_.reserve(rows * dim_);
  index_.reserve(rows);
}

void SparseGrads::Clear() {
  keys_.clear();
  values_.clear();
  index_.clear();
}

}  // namespace pscluster::ps
