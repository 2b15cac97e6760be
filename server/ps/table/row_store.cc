#include "server/ps/table/row_store.h"

#include <algorithm>

namespace pscluster::ps {

RowStore::RowStore(size_t width, bool track_steps, bool track_versions)
    : width_(width),
      track_steps_(track_steps),
      track_versions_(track_versions),
      index_(0, Hash{this}, Eq{this}) {}

RowStore::Row RowStore::RowAt(size_t row) const {
  const Block& b = *blocks_[row / kRowsPerBlock];
  const size_t at = row % kRowsPerBlock;
  return Row{b.rows.get() + at * width_, b.updates.get() + at,
             b.steps ? b.steps.get() + at : nullptr, b.versions ? b.versions.get() + at : nullptr};
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
    if (track_steps_) b->steps.reset(new int64_t[kRowsPerBlock]);
    if (track_versions_) b->versions.reset(new uint64_t[kRowsPerBlock]);
    blocks_.push_back(std::move(b));
  }
  const size_t row = size_++;
  Block& b = *blocks_.back();
  b.keys[row % kRowsPerBlock] = key;
  b.updates[row % kRowsPerBlock] = 0;
  if (track_steps_) b.steps[row % kRowsPerBlock] = 0;
  if (track_versions_) b.versions[row % kRowsPerBlock] = 0;
  index_.insert(static_cast<uint32_t>(row));  // after the key is in place: it hashes by it
  return RowAt(row);
}

void RowStore::Remove(size_t row) {
  const size_t last = size_ - 1;
  index_.erase(Key{KeyOf(row)});
  if (row != last) {  // the last row moves: its index entry names its new place
    index_.erase(Key{KeyOf(last)});
    const Row from = RowAt(last), to = RowAt(row);
    std::copy(from.data, from.data + width_, to.data);
    *to.updates = *from.updates;
    if (track_steps_) *to.step = *from.step;
    if (track_versions_) *to.version = *from.version;
    blocks_[row / kRowsPerBlock]->keys[row % kRowsPerBlock] = KeyOf(last);
    index_.insert(static_cast<uint32_t>(row));
  }
  size_ = last;
}

bool RowStore::Erase(uint64_t key) {
  auto it = index_.find(Key{key});
  if (it == index_.end()) return false;
  Remove(*it);
  FreeUnusedBlocks();
  return true;
}

void RowStore::FreeUnusedBlocks() {
  const size_t used = (size_ + kRowsPerBlock - 1) / kRowsPerBlock;
  if (used < blocks_.size()) blocks_.resize(used);
}

uint64_t RowStore::bytes() const {
  const uint64_t per_row =
      width_ * sizeof(float) + (2 + track_steps_ + track_versions_) * sizeof(uint64_t);
  const uint64_t per_block = kRowsPerBlock * per_row;
  // absl's swiss table: a 4-byte slot and a control byte per slot, and one group of
  // control bytes more.
  const uint64_t index = index_.capacity() * (sizeof(uint32_t) + 1) + 16;
  return blocks_.size() * (per_block + sizeof(Block)) +
         blocks_.capacity() * sizeof(std::unique_ptr<Block>) + index;
}

}  // namespace pscluster::ps
