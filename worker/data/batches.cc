#include "worker/data/batches.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pscluster::data {
namespace {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The generator seed for (seed, epoch): distinct, well-mixed values for nearby inputs.
uint64_t EpochSeed(uint64_t seed, int64_t epoch) {
  return Mix64(Mix64(seed + 0x9e3779b97f4a7c15ull) ^
               (static_cast<uint64_t>(epoch) * 0xd1b54a32d192ed03ull + 1));
}

// Uniform in [0, n) by rejection, n >= 1. Defined here rather than with
// std::uniform_int_distribution so the order is the same under every standard library.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  uint64_t r;
  do {
    r = rng();
  } while (r < threshold);
  return r % n;
}

}  // namespace

absl::StatusOr<BatchIterator> BatchIterator::Create(const Dataset* data, int rank, int world,
                                                    int batch_size, uint64_t seed) {
  if (data == nullptr) return absl::InvalidArgumentError("data is null");
  if (data->size < 0 || data->dim < 1 || data->label_width < 1 ||
      data->x.size() != static_cast<size_t>(data->size) * static_cast<size_t>(data->dim) ||
      data->y.size() != static_cast<size_t>(data->size) * data->label_width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data is inconsistent: size ", data->size, ", dim ", data->dim, ", label width ",
        data->label_width, ", ", data->x.size(), " floats, ", data->y.size(), " labels"));
  }
  if (batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size must be >= 1, got ", batch_size));
  }
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world must be >= 1, got ", world));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [0, world=", world, "), got ", rank));
  }
  const int64_t global = int64_t{world} * batch_size;
  if (data->size < global) {
    return absl::InvalidArgumentError(
        absl::StrCat("data size ", data->size, " is smaller than one global batch (world ", world,
                     " * batch_size ", batch_size, " = ", global, ")"));
  }
  return BatchIterator(data, rank, world, batch_size, seed);
}

BatchIterator::BatchIterator(const Dataset* data, int rank, int world, int batch_size,
                             uint64_t seed)
    : data_(data),
      rank_(rank),
      world_(world),
      batch_size_(batch_size),
      seed_(seed),
      batches_per_epoch_(data->size / (int64_t{world} * batch_size)) {}

void BatchIterator::EnsurePermutation() {
  if (perm_epoch_ == epoch_) return;
  perm_.resize(static_cast<size_t>(data_->size));
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  std::mt19937_64 rng(EpochSeed(seed_, epoch_));
  for (int64_t i = data_->size - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(i) + 1));
    std::swap(perm_[i], perm_[j]);
  }
  perm_epoch_ = epoch_;
}

void BatchIterator::Next(Batch* out) {
  EnsurePermutation();
  const size_t dim = static_cast<size_t>(data_->dim);
  out->size = batch_size_;
  out->x.resize(static_cast<size_t>(batch_size_) * dim);
  const size_t labels = static_cast<size_t>(data_->label_width);
  out->y.resize(static_cast<size_t>(batch_size_) * labels);
  const int64_t first = position_ * world_ * int64_t{batch_size_} + int64_t{rank_} * batch_size_;
  for (int k = 0; k < batch_size_; ++k) {
    const int64_t example = perm_[first + k];
    const float* src = data_->x.data() + static_cast<size_t>(example) * dim;
    std::copy(src, src + dim, out->x.data() + static_cast<size_t>(k) * dim);
    const int32_t* y = data_->y.data() + static_cast<size_t>(example) * labels;
    std::copy(y, y + labels, out->y.data() + static_cast<size_t>(k) * labels);
  }
  if (++position_ == batches_per_epoch_) {
    ++epoch_;
    position_ = 0;
  }
}

absl::Status BatchIterator::Seek(BatchCursor c) {
  if (c.epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cursor epoch must be >= 0, got ", c.epoch));
  }
  if (c.position < 0 || c.position >= batches_per_epoch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cursor position must be in [0, ", batches_per_epoch_, "), got ", c.position));
  }
  epoch_ = c.epoch;
  position_ = c.position;
  return absl::OkStatus();
}

}  // namespace pscluster::data
