#include "server/ps/table/row_store.h"

namespace pscluster::ps {

RowStore::RowStore(size_t width) : width_(width), index_(0, Hash{this}, Eq{this}) {}

RowStore::Row RowStore::RowAt(size_t row) const {
  const Block& b = *blocks_[row / kRowsPerBlock];
  const size_t at = row % kRowsPerBlock;
  return Row{b.rows.get() + at * width_, b.updates.get() + at};
}

RowStore::Row RowStore::Find(uint64_t key) const {
  auto it = index_.find(Key{key});
  return it == index_.end() ? Row{} : RowAt(*it);
}

RowStore::Row RowStore::Append(uint64_t key) {
  if (size_ % kRowsPerBlock == 0) {
    auto b = std::make_unique<Block>();
    b->rows.reset(new float[kRowsPerBlock * width_]);
    b->keys.reset(new uint64_t[kRowsPerBlock]);
    b->updates.reset(new int64_t[kRowsPerBlock]);
    blocks_.push_back(std::move(b));
  }
  const size_t row = size_++;
  Block& b = *blocks_.back();
  b.keys[row % kRowsPerBlock] = key;
  b.updates[row % kRowsPerBlock] = 0;
  index_.insert(static_cast<uint32_t>(row));  // after the key is in place: it hashes by it
  return RowAt(row);
}

uint64_t RowStore::bytes() const {
  const uint64_t per_block = kRowsPerBlock * (width_ * sizeof(float) + 2 * sizeof(uint64_t));
  // absl's swiss table: a 4-byte slot and a control byte per slot, and one group of
  // control bytes more.
  const uint64_t index = index_.capacity() * (sizeof(uint32_t) + 1) + 16;
  return blocks_.size() * (per_block + sizeof(Block)) +
         blocks_.capacity() * sizeof(std::unique_ptr<Block>) + index;
}

}  // namespace pscluster::ps
