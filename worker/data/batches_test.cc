#include "worker/data/batches.h"

#include <cstdint>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"

namespace pscluster::data {
namespace {

using ::testing::HasSubstr;

// `size` examples of dim 2 whose features are (index, -index) and label index % 7, so a
// batch tells which examples it holds.
Dataset Indexed(int64_t size) {
  Dataset d;
  d.size = size;
  d.dim = 2;
  d.classes = 7;
  for (int64_t i = 0; i < size; ++i) {
    d.x.push_back(static_cast<float>(i));
    d.x.push_back(-static_cast<float>(i));
    d.y.push_back(static_cast<int32_t>(i % 7));
  }
  return d;
}

// The example indices of a batch, checking that features and labels agree.
std::vector<int64_t> Ids(const Batch& b) {
  std::vector<int64_t> ids;
  EXPECT_EQ(b.x.size(), static_cast<size_t>(b.size) * 2);
  EXPECT_EQ(b.y.size(), static_cast<size_t>(b.size));
  for (int k = 0; k < b.size; ++k) {
    const int64_t id = static_cast<int64_t>(b.x[2 * k]);
    EXPECT_EQ(b.x[2 * k + 1], -b.x[2 * k]);
    EXPECT_EQ(b.y[k], id % 7);
    ids.push_back(id);
  }
  return ids;
}

BatchIterator MustCreate(const Dataset* d, int rank, int world, int batch_size, uint64_t seed) {
  absl::StatusOr<BatchIterator> it = BatchIterator::Create(d, rank, world, batch_size, seed);
  EXPECT_TRUE(it.ok()) << it.status();
  return *std::move(it);
}

// The concatenated example ids of the next n batches.
std::vector<int64_t> Take(BatchIterator& it, int64_t n) {
  std::vector<int64_t> ids;
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t> batch = Ids((it.Next(&b), b));
    ids.insert(ids.end(), batch.begin(), batch.end());
  }
  return ids;
}

TEST(BatchIteratorTest, SingleRankCoversEveryExampleOncePerEpochDroppingTheTail) {
  const Dataset d = Indexed(103);
  BatchIterator it = MustCreate(&d, 0, 1, 10, /*seed=*/1);
  ASSERT_EQ(it.batches_per_epoch(), 10);
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_EQ(it.cursor(), (BatchCursor{epoch, 0}));
    const std::vector<int64_t> ids = Take(it, 10);
    const std::set<int64_t> distinct(ids.begin(), ids.end());
    EXPECT_EQ(ids.size(), 100u);
    EXPECT_EQ(distinct.size(), 100u) << "epoch " << epoch;
    for (int64_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 103);
    }
  }
  EXPECT_EQ(it.cursor(), (BatchCursor{3, 0}));
}

TEST(BatchIteratorTest, RanksSplitEachGlobalBatchOfTheSingleRankOrder) {
  const Dataset d = Indexed(100);
  constexpr int kWorld = 3, kBatch = 4;
  BatchIterator single = MustCreate(&d, 0, 1, kBatch, /*seed=*/9);
  std::vector<BatchIterator> ranks;
  for (int r = 0; r < kWorld; ++r) ranks.push_back(MustCreate(&d, r, kWorld, kBatch, 9));
  const int64_t per_epoch = ranks[0].batches_per_epoch();
  ASSERT_EQ(per_epoch, 100 / 12);
  for (int epoch = 0; epoch < 2; ++epoch) {
    // The single rank's first per_epoch * world batches are the epoch's global batches.
    const std::vector<int64_t> single_ids = Take(single, single.batches_per_epoch());
    std::set<int64_t> seen;
    for (int64_t g = 0; g < per_epoch; ++g) {
      for (int r = 0; r < kWorld; ++r) {
        const std::vector<int64_t> ids = Take(ranks[r], 1);
        const int64_t begin = (g * kWorld + r) * kBatch;
        EXPECT_EQ(ids, std::vector<int64_t>(single_ids.begin() + begin,
                                            single_ids.begin() + begin + kBatch))
            << "epoch " << epoch << " global batch " << g << " rank " << r;
        for (int64_t id : ids) EXPECT_TRUE(seen.insert(id).second) << "repeated " << id;
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(per_epoch * kWorld * kBatch));
  }
}

TEST(BatchIteratorTest, SameSeedAndEpochGiveTheSameOrder) {
  const Dataset d = Indexed(64);
  BatchIterator a = MustCreate(&d, 0, 1, 8, /*seed=*/123);
  BatchIterator b = MustCreate(&d, 0, 1, 8, /*seed=*/123);
  EXPECT_EQ(Take(a, 3 * 8), Take(b, 3 * 8));
}

TEST(BatchIteratorTest, OrderDiffersBetweenEpochs) {
  const Dataset d = Indexed(64);
  BatchIterator it = MustCreate(&d, 0, 1, 8, /*seed=*/123);
  const std::vector<int64_t> epoch0 = Take(it, 8);
  const std::vector<int64_t> epoch1 = Take(it, 8);
  EXPECT_NE(epoch0, epoch1);
  // Both are permutations of all 64 examples.
  EXPECT_THAT(epoch1, ::testing::UnorderedElementsAreArray(epoch0));
}

TEST(BatchIteratorTest, OrderDiffersBetweenSeeds) {
  const Dataset d = Indexed(64);
  BatchIterator a = MustCreate(&d, 0, 1, 8, /*seed=*/1);
  BatchIterator b = MustCreate(&d, 0, 1, 8, /*seed=*/2);
  EXPECT_NE(Take(a, 8), Take(b, 8));
}

TEST(BatchIteratorTest, OrderIsShuffled) {
  const Dataset d = Indexed(64);
  BatchIterator it = MustCreate(&d, 0, 1, 64, /*seed=*/5);
  std::vector<int64_t> identity(64);
  for (int64_t i = 0; i < 64; ++i) identity[i] = i;
  EXPECT_NE(Take(it, 1), identity);
}

TEST(BatchIteratorTest, SeekToCursorInFreshIteratorContinuesWithTheSameBatches) {
  const Dataset d = Indexed(50);
  for (int64_t k : {0, 1, 3, 4, 5, 9, 13}) {  // 4 batches per epoch: crosses epochs
    SCOPED_TRACE(k);
    BatchIterator original = MustCreate(&d, 1, 2, 6, /*seed=*/77);
    ASSERT_EQ(original.batches_per_epoch(), 4);
    Take(original, k);
    const BatchCursor saved = original.cursor();
    EXPECT_EQ(saved, (BatchCursor{k / 4, k % 4}));
    BatchIterator resumed = MustCreate(&d, 1, 2, 6, /*seed=*/77);
    ASSERT_TRUE(resumed.Seek(saved).ok());
    EXPECT_EQ(resumed.cursor(), saved);
    EXPECT_EQ(Take(resumed, 10), Take(original, 10));
  }
}

TEST(BatchIteratorTest, SeekBackwardsReplaysTheSameBatches) {
  const Dataset d = Indexed(50);
  BatchIterator it = MustCreate(&d, 0, 1, 5, /*seed=*/3);
  Take(it, 2);
  const BatchCursor saved = it.cursor();
  const std::vector<int64_t> first = Take(it, 25);
  ASSERT_TRUE(it.Seek(saved).ok());
  EXPECT_EQ(Take(it, 25), first);
}

TEST(BatchIteratorTest, NextReusesTheBatchBuffers) {
  const Dataset d = Indexed(40);
  BatchIterator it = MustCreate(&d, 0, 1, 4, /*seed=*/3);
  Batch b;
  it.Next(&b);
  const float* x = b.x.data();
  const int32_t* y = b.y.data();
  for (int i = 0; i < 20; ++i) it.Next(&b);
  EXPECT_EQ(b.x.data(), x);
  EXPECT_EQ(b.y.data(), y);
  EXPECT_EQ(b.size, 4);
}

TEST(BatchIteratorTest, CopiesFeatureRowsOfRealDatasets) {
  const Dataset d = MakeSynthetic(30, 5, 3, /*seed=*/4);
  BatchIterator it = MustCreate(&d, 0, 1, 30, /*seed=*/8);
  Batch b;
  it.Next(&b);
  // Each batch row is some dataset row with its label.
  int matched = 0;
  for (int k = 0; k < b.size; ++k) {
    for (int64_t i = 0; i < d.size; ++i) {
      if (std::equal(b.x.begin() + k * 5, b.x.begin() + (k + 1) * 5, d.x.begin() + i * 5)) {
        EXPECT_EQ(b.y[k], d.y[i]);
        ++matched;
        break;
      }
    }
  }
  EXPECT_EQ(matched, 30);
}

void ExpectInvalid(const absl::StatusOr<BatchIterator>& it, const char* field) {
  EXPECT_EQ(it.status().code(), absl::StatusCode::kInvalidArgument) << it.status();
  EXPECT_THAT(it.status().message(), HasSubstr(field));
}

TEST(BatchIteratorTest, CreateRejectsInvalidArguments) {
  const Dataset d = Indexed(20);
  ExpectInvalid(BatchIterator::Create(nullptr, 0, 1, 4, 0), "data");
  ExpectInvalid(BatchIterator::Create(&d, 0, 1, 0, 0), "batch_size");
  ExpectInvalid(BatchIterator::Create(&d, 0, 0, 4, 0), "world");
  ExpectInvalid(BatchIterator::Create(&d, -1, 2, 4, 0), "rank");
  ExpectInvalid(BatchIterator::Create(&d, 2, 2, 4, 0), "rank");
  ExpectInvalid(BatchIterator::Create(&d, 0, 3, 7, 0), "data size");  // 21 > 20
  Dataset broken = Indexed(20);
  broken.y.pop_back();
  ExpectInvalid(BatchIterator::Create(&broken, 0, 1, 4, 0), "data");
  EXPECT_TRUE(BatchIterator::Create(&d, 2, 3, 6, 0).ok());  // 18 <= 20
}

TEST(BatchIteratorTest, SeekRejectsOutOfRangeCursors) {
  const Dataset d = Indexed(20);
  BatchIterator it = MustCreate(&d, 0, 1, 4, /*seed=*/0);  // 5 batches per epoch
  Take(it, 2);
  for (BatchCursor bad : {BatchCursor{-1, 0}, BatchCursor{0, -1}, BatchCursor{0, 5}}) {
    const absl::Status s = it.Seek(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(it.cursor(), (BatchCursor{0, 2})) << "a failed Seek must not move";
  }
  EXPECT_TRUE(it.Seek({1000, 4}).ok());
  EXPECT_EQ(it.cursor(), (BatchCursor{1000, 4}));
}

}  // namespace
}  // namespace pscluster::data
