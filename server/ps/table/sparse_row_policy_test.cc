// A sparse table's SparseRowPolicy against a reference simulation of its documented rules:
// under BSP with two workers, whichever of them pushes first, the rows stored after every
// step, their values and the admission and eviction counts equal the reference's exactly.
// A table restored from a capture goes on exactly as the original (the admission counts
// and the rows' last update steps travel with it); a table without a policy tracks nothing.
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps/table/shard.h"
#include "server/ps/table/sparse_table.h"
#include "server/ps/table/sparse_table_testing.h"

namespace pscluster::ps {
namespace {

constexpr float kLr = 0.5f;
constexpr uint32_t kDim = 2;
constexpr uint64_t kIds = 300;

// The policy's rules, written out: an id without a row counts the pushes that carry it
// (once per push) and gets a row at admit_after of them; a row's value falls by kLr per
// push (gradients of 1); every max(1, evict_after / 8) steps, rows last updated at or
// before step - evict_after go.
struct Reference {
  uint32_t admit_after;
  int64_t evict_after;
  std::map<uint64_t, uint32_t> pushes;
  std::map<uint64_t, std::pair<float, int64_t>> rows;  // value, last update's step
  uint64_t admitted = 0, not_admitted = 0, evicted = 0;

  void Step(int64_t step, const std::vector<std::vector<uint64_t>>& per_worker) {
    std::map<uint64_t, uint32_t> carried;
    for (const auto& keys : per_worker) {
      for (uint64_t k : std::set<uint64_t>(keys.begin(), keys.end())) ++carried[k];
    }
    for (const auto& [key, n] : carried) {
      if (!rows.count(key)) {
        if ((pushes[key] += n) < admit_after) {
          ++not_admitted;
          continue;
        }
        ++admitted;
        rows[key] = {kInit, 0};
      }
      float sum = 0;  // the workers' gradients for the key, each 1 per occurrence
      for (const auto& keys : per_worker) {
        for (uint64_t k : keys) sum += k == key ? 1.0f : 0.0f;
      }
      rows[key] = {rows[key].first - kLr * sum, step};
    }
    if (evict_after == 0 || step % std::max<int64_t>(1, evict_after / 8) != 0) return;
    for (auto it = rows.begin(); it != rows.end();) {
      const bool idle = it->second.second <= step - evict_after;
      evicted += idle;
      it = idle ? rows.erase(it) : std::next(it);
    }
  }
};

// Step `step`'s keys for each of two workers: ids drawn skewed (a few often, most rarely),
// with repeats, from a generator seeded by the step.
std::vector<std::vector<uint64_t>> KeysOfStep(int64_t step) {
  std::mt19937_64 rng(1000 + step);
  std::vector<std::vector<uint64_t>> out(2);
  for (auto& keys : out) {
    for (int i = 0; i < 12; ++i) {
      const uint64_t r = rng() % 1000;
      keys.push_back(r < 500 ? r % 10 : r % kIds);
    }
  }
  return out;
}

TableSpec PolicySpec(uint32_t admit_after, uint64_t evict_after) {
  TableSpec spec = SparseSpec(kDim, ConsistencyConfig::BSP, kLr);
  spec.mutable_rows()->set_admit_after_pushes(admit_after);
  spec.mutable_rows()->set_evict_after_steps(evict_after);
  return spec;
}

// Pushes step `step` from both workers, worker `first` first.
void PushStep(SparseTable& table, int64_t step, int first) {
  const auto keys = KeysOfStep(step);
  for (int i = 0; i < 2; ++i) {
    const int w = (first + i) % 2;
    ASSERT_TRUE(
        PushRows(table, w, step, keys[w], std::vector<float>(keys[w].size() * kDim, 1.0f)).ok());
  }
}

void ExpectAsReference(SparseTable& table, const Reference& ref, int64_t step) {
  const std::map<uint64_t, StoredRow> stored = StoredRows(table);
  ASSERT_EQ(stored.size(), ref.rows.size()) << "after step " << step;
  for (const auto& [key, row] : ref.rows) {
    ASSERT_TRUE(stored.count(key)) << "key " << key << " after step " << step;
    const std::vector<float> read = ReadRows(table, {key});
    EXPECT_EQ(read[0], row.first) << "key " << key << " after step " << step;
  }
  const TableStats stats = table.Stats();
  EXPECT_EQ(stats.rows_admitted(), ref.admitted) << "after step " << step;
  EXPECT_EQ(stats.rows_not_admitted(), ref.not_admitted) << "after step " << step;
  EXPECT_EQ(stats.rows_evicted(), ref.evicted) << "after step " << step;
}

TEST(SparseRowPolicyTest, BspRowsAndCountsEqualTheReferenceWhicheverWorkerPushesFirst) {
  for (int first = 0; first < 2; ++first) {
    auto table = MakeTable(PolicySpec(3, 8), {0, 1});
    Reference ref{3, 8};
    for (int64_t step = 0; step < 40; ++step) {
      PushStep(*table, step, first);
      ref.Step(step, KeysOfStep(step));
      ExpectAsReference(*table, ref, step);
      if (HasFailure()) return;
    }
    EXPECT_GT(ref.not_admitted, 0u);  // the run exercises both rules
    EXPECT_GT(ref.evicted, 0u);
  }
}

TEST(SparseRowPolicyTest, AnIdNotAdmittedReadsItsInitialRowAndStoresNothing) {
  auto table = MakeTable(PolicySpec(2, 0), {0});
  const float grad[kDim] = {1.0f, 1.0f};
  ASSERT_TRUE(PushRows(*table, 0, 0, {7}, {grad, grad + kDim}).ok());
  EXPECT_EQ(ReadRows(*table, {7}), std::vector<float>(kDim, kInit));
  EXPECT_TRUE(StoredRows(*table).empty());
  ASSERT_TRUE(PushRows(*table, 0, 1, {7}, {grad, grad + kDim}).ok());
  EXPECT_EQ(ReadRows(*table, {7}), std::vector<float>(kDim, kInit - kLr));
}

// Restores `from`'s captured state into a new table as a snapshot restore does.
std::unique_ptr<SparseTable> Restored(SparseTable& from) {
  auto image = from.CaptureNow();
  EXPECT_TRUE(image.ok()) << image.status();
  auto table = MakeTable(from.spec(), {0, 1});
  table->RestoreClocks((*image)->header);
  EXPECT_TRUE(table->RestoreLifecycle((*image)->header).ok());
  const TableImage& im = **image;
  const size_t width = im.keys.empty() ? 0 : im.row_data.size() / im.keys.size();
  for (size_t i = 0; i < im.keys.size(); ++i) {
    EXPECT_TRUE(table
                    ->RestoreRow(im.keys[i], im.row_updates[i], im.row_data.data() + i * width,
                                 im.row_steps.at(i))
                    .ok());
  }
  return table;
}

TEST(SparseRowPolicyTest, ARestoredTableGoesOnExactlyAsTheOriginal) {
  auto original = MakeTable(PolicySpec(3, 8), {0, 1});
  for (int64_t step = 0; step < 20; ++step) PushStep(*original, step, 0);
  auto restored = Restored(*original);
  EXPECT_EQ(restored->Fingerprint(), original->Fingerprint());
  for (int64_t step = 20; step < 40; ++step) {
    PushStep(*original, step, 0);
    PushStep(*restored, step, 1);
    ASSERT_EQ(StoredRows(*restored), StoredRows(*original)) << "after step " << step;
  }
  EXPECT_EQ(restored->Fingerprint(), original->Fingerprint());
}

TEST(SparseRowPolicyTest, ATableWithoutAPolicyKeepsEveryRowAndNoSketch) {
  auto table = MakeTable(SparseSpec(kDim, ConsistencyConfig::BSP, kLr), {0, 1});
  for (int64_t step = 0; step < 10; ++step) PushStep(*table, step, 0);
  std::set<uint64_t> pushed;
  for (int64_t step = 0; step < 10; ++step) {
    for (const auto& keys : KeysOfStep(step)) pushed.insert(keys.begin(), keys.end());
  }
  EXPECT_EQ(StoredRows(*table).size(), pushed.size());
  const TableStats stats = table->Stats();
  EXPECT_EQ(stats.rows_admitted(), pushed.size());
  EXPECT_EQ(stats.rows_not_admitted(), 0u);
  EXPECT_EQ(stats.memory_bytes(), pushed.size() * kDim * sizeof(float));
  auto image = table->CaptureNow();
  ASSERT_TRUE(image.ok());
  EXPECT_FALSE((*image)->header.row_steps());
  EXPECT_TRUE((*image)->row_steps.empty());
  EXPECT_TRUE((*image)->header.admission_counts().empty());
}

// A sketch takes its memory when the table is made: it counts against --max_memory_bytes,
// so that tables made in a loop cannot take the machine.
TEST(SparseRowPolicyTest, SketchesCountAgainstTheShardsMemoryLimit) {
  ShardOptions options;
  options.max_memory_bytes = 10 << 20;  // room for two sketches of 4 MiB
  Shard shard(options);
  TableSpec spec = PolicySpec(2, 0);
  for (uint32_t id = 1; id <= 2; ++id) {
    spec.set_table_id(id);
    ASSERT_TRUE(shard.CreateTable(spec).ok()) << id;
  }
  spec.set_table_id(3);
  absl::StatusOr<CreateTableResponse> third = shard.CreateTable(spec);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), ::testing::HasSubstr("--max_memory_bytes"));
  spec.mutable_rows()->set_admission_counters(1 << 18);  // 1 MiB
  EXPECT_TRUE(shard.CreateTable(spec).ok());
  spec.set_table_id(4);
  spec.clear_rows();  // no sketch: rows come with pushes
  EXPECT_TRUE(shard.CreateTable(spec).ok());
}

}  // namespace
}  // namespace pscluster::ps
