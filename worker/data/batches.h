// Sharded, shuffled, resumable mini-batches over a Dataset for data-parallel workers.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace pscluster::data {

struct Batch {
  int size = 0;            // examples
  std::vector<float> x;    // size * dim, row-major
  std::vector<int32_t> y;  // size * label_width labels (the dataset's)
};

// Where a worker is in its data: enough to resume exactly (saved in checkpoints).
struct BatchCursor {
  int64_t epoch = 0;
  int64_t position = 0;  // batches taken this epoch
};

inline bool operator==(const BatchCursor& a, const BatchCursor& b) {
  return a.epoch == b.epoch && a.position == b.position;
}
inline bool operator!=(const BatchCursor& a, const BatchCursor& b) { return !(a == b); }

// Serves rank `rank` of `world` its share of each epoch, in a shuffled order that depends
// only on (seed, epoch): every epoch, one permutation of all examples (std::mt19937_64
// seeded from seed and epoch, Fisher-Yates) is split into global batches of
// world * batch_size consecutive examples; rank r takes examples
// [r * batch_size, (r + 1) * batch_size) of each global batch. So the ranks together see
// each example at most once per epoch, and a single rank with world = 1 sees the same
// order as their union. The last incomplete global batch of an epoch is dropped.
//
// The dataset must outlive the iterator and not change while it is used.
// Not thread-safe: one iterator per training thread.
class BatchIterator {
 public:
  // INVALID_ARGUMENT (naming the field) for a null or inconsistent dataset,
  // batch_size < 1, world < 1, rank outside [0, world), or a dataset too small for one
  // global batch.
  static absl::StatusOr<BatchIterator> Create(const Dataset* data, int rank, int world,
                                              int batch_size, uint64_t seed);

  BatchIterator(BatchIterator&&) = default;
  BatchIterator& operator=(BatchIterator&&) = default;

  // Fills *out (reusing its buffers) with the batch at cursor(), then advances, rolling
  // into the next epoch after the last batch of this one.
  void Next(Batch* out);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  BatchCursor cursor() const { return {epoch_, position_}; }

  // Resumes exactly where `c` (from cursor()) was taken. INVALID_ARGUMENT if c.epoch < 0
  // or c.position is outside [0, batches_per_epoch()).
  absl::Status Seek(BatchCursor c);

 private:
  BatchIterator(const Dataset* data, int rank, int world, int batch_size, uint64_t seed);

  // Makes perm_ the permutation of epoch_ (no-op if it already is).
  void EnsurePermutation();

  const Dataset* data_;
  int rank_;
  int world_;
  int batch_size_;
  uint64_t seed_;
  int64_t batches_per_epoch_;

  int64_t epoch_ = 0;
  int64_t position_ = 0;
  int64_t perm_epoch_ = -1;    // epoch perm_ was built for; -1: none yet
  std::vector<int64_t> perm_;  // example indices in epoch order
};

}  // namespace pscluster::data
