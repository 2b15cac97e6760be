// Incremental snapshots (snapshot_chain.h) on real files: a chain restores exactly what a
// full snapshot of the same moment would, into the same or another shard count; a damaged
// or missing link is refused naming it, deleting nothing; retention keeps chains whole.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/sharding.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps/snapshot/file_snapshot_store.h"
#include "server/ps/snapshot/snapshotter.h"
#include "server/ps/table/dense_table.h"
#include "server/ps/table/shard.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint32_t kSparse = 1, kDense = 2, kDim = 4;
constexpr uint64_t kKeys = 4000;

absl::Time Generous() { return absl::Now() + absl::Seconds(120); }

TableSpec SparseSpec(int64_t evict_after) {
  TableSpec spec;
  spec.set_table_id(kSparse);
  spec.set_name("emb");
  spec.set_kind(TableSpec::SPARSE);
  spec.set_dim(kDim);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
  spec.mutable_initializer()->set_scale(0.5f);
  spec.mutable_initializer()->set_seed(11);
  if (evict_after > 0) spec.mutable_rows()->set_evict_after_steps(evict_after);
  return spec;
}

TableSpec DenseSpec() {
  TableSpec spec;
  spec.set_table_id(kDense);
  spec.set_name("dense");
  spec.set_kind(TableSpec::DENSE);
  spec.set_size(64);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(InitializerConfig::CONSTANT);
  spec.mutable_initializer()->set_value(0.25f);
  return spec;
}

// A table's whole state, by key (sparse) or as its arrays (dense), compared bitwise.
struct State {
  std::map<uint64_t, std::vector<float>> rows;  // values and slots, then updates and step
  std::vector<float> dense;
  bool operator==(const State& o) const {
    return rows.size() == o.rows.size() && dense.size() == o.dense.size() &&
           std::memcmp(dense.data(), o.dense.data(), dense.size() * 4) == 0 &&
           std::equal(rows.begin(), rows.end(), o.rows.begin(), [](const auto& a, const auto& b) {
             return a.first == b.first && a.second.size() == b.second.size() &&
                    std::memcmp(a.second.data(), b.second.data(), a.second.size() * 4) == 0;
           });
  }
};

void AddState(const Shard& shard, State* out) {
  for (Table* t : shard.Tables()) {
    auto image = t->CaptureNow();
    ASSERT_TRUE(image.ok()) << image.status();
    const TableImage& i = **image;
    if (t->spec().kind() == TableSpec::DENSE) {
      for (const StagingArray& a : i.arrays)
        out->dense.insert(out->dense.end(), a.begin(), a.end());
      continue;
    }
    const size_t len = i.row_data.size() / std::max<size_t>(1, i.keys.size());
    for (size_t r = 0; r < i.keys.size(); ++r) {
      std::vector<float> row(i.row_data.begin() + r * len, i.row_data.begin() + (r + 1) * len);
      row.push_back(static_cast<float>(i.row_updates[r]));
      if (!i.row_steps.empty()) row.push_back(static_cast<float>(i.row_steps[r]));
      out->rows[i.keys[r]] = std::move(row);
    }
  }
}

// A cluster of `n` shards writing snapshots under one root.
class Cluster {
 public:
  // With `full_root`, each shard also writes every snapshot whole there, to compare.
  Cluster(const std::string& root, uint32_t n, int full_every, int64_t evict_after,
          const std::string& full_root = "")
      : root_(root) {
    for (uint32_t i = 0; i < n; ++i) {
      ShardOptions o;
      o.shard_id = i;
      o.num_shards = n;
      o.track_row_versions = full_every > 1;
      shards_.push_back(std::make_unique<Shard>(o));
      shards_.back()->RegisterWorker(0);
      EXPECT_TRUE(shards_.back()->CreateTable(SparseSpec(evict_after)).ok());
      EXPECT_TRUE(shards_.back()->CreateTable(DenseSpec()).ok());
      SnapshotterOptions so;
      so.root = root;
      so.full_every = full_every;
      so.keep_last = 100;
      auto s = Snapshotter::Create(shards_.back().get(), so);
      EXPECT_TRUE(s.ok()) << s.status();
      snapshotters_.push_back(*std::move(s));
      if (full_root.empty()) continue;
      so.root = full_root;
      so.full_every = 1;
      s = Snapshotter::Create(shards_.back().get(), so);
      EXPECT_TRUE(s.ok()) << s.status();
      snapshotters_.push_back(*std::move(s));
    }
  }

  // Worker 0's push of `step`: gradients for `keys` (each to its shard) and the dense table.
  void Push(int64_t step, const std::vector<uint64_t>& keys) {
    const uint32_t n = shards_.size();
    for (uint32_t i = 0; i < n; ++i) {
      std::vector<uint64_t> mine;
      for (uint64_t k : keys) {
        if (SparseShardOf(k, n) == i) mine.push_back(k);
      }
      std::vector<float> grads(mine.size() * kDim);
      for (size_t j = 0; j < grads.size(); ++j) grads[j] = 0.01f * ((step * 31 + j) % 17) - 0.08f;
      bool skipped = false;
      auto sparse = shards_[i]->GetSparse(kSparse, 0);
      ASSERT_TRUE(sparse.ok());
      ASSERT_TRUE((*sparse)->Push(0, step, mine, grads, &skipped).ok());
      auto dense = shards_[i]->GetTable(kDense);
      const TableInfo info = (*dense)->Info();
      std::vector<float> g(info.shard_end() - info.shard_begin(), 0.001f * (step % 5));
      ASSERT_TRUE(static_cast<DenseTable*>(*dense)
                      ->Push(0, step, info.shard_begin(), {absl::MakeConstSpan(g)}, &skipped)
                      .ok());
    }
  }

  void SnapshotAndWait(int64_t step) {
    for (auto& s : snapshotters_) {
      SnapshotRequest r;
      r.set_step(step);
      auto done = s->Snapshot(r, Generous());
      ASSERT_TRUE(done.ok()) << done.status();
      ASSERT_TRUE(s->AwaitIdle(Generous()));
      ASSERT_EQ(s->Status().last_error(), "");
    }
  }

  State Now() const {
    State s;
    for (const auto& shard : shards_) AddState(*shard, &s);
    return s;
  }
  // The i-th snapshotter: shard i's, or with a full root, 2i (chain) and 2i + 1 (full).
  Snapshotter& snapshotter(uint32_t i) { return *snapshotters_[i]; }

 private:
  std::string root_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::unique_ptr<Snapshotter>> snapshotters_;
};

// What `n` fresh shards restore from `which` under `root` (empty rows on failure).
absl::StatusOr<State> Restored(const std::string& root, uint32_t n, const std::string& which,
                               bool skip_damaged = false, int64_t* step = nullptr) {
  State out;
  for (uint32_t i = 0; i < n; ++i) {
    ShardOptions o;
    o.shard_id = i;
    o.num_shards = n;
    Shard shard(o);
    SnapshotterOptions so;
    so.root = root;
    so.skip_damaged = skip_damaged;
    so.keep_last = 100;
    auto s = Snapshotter::Create(&shard, so);
    if (!s.ok()) return s.status();
    auto loaded = (*s)->Load(which);
    if (!loaded.ok()) return loaded.status();
    if (step) *step = loaded->step;
    AddState(*loaded->shard, &out);
  }
  return out;
}

// Steps 1..10 of pushes touching about `fraction` of the keys each, some new.
std::vector<uint64_t> KeysOfStep(int64_t step, double fraction) {
  std::mt19937_64 rng(step);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kKeys; ++k) {
    if (std::uniform_real_distribution<double>(0, 1)(rng) < fraction) keys.push_back(k + step * 7);
  }
  return keys;
}

std::vector<SnapshotInfo> Listed(Snapshotter& s) {
  auto list = s.List();
  EXPECT_TRUE(list.ok()) << list.status();
  return {list->snapshots().begin(), list->snapshots().end()};
}

class IncrementalSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<pscluster::testing::TempDir>("incremental");
    root_ = tmp_->path() + "/root";
  }
  std::unique_ptr<pscluster::testing::TempDir> tmp_;
  std::string root_;
};

TEST_F(IncrementalSnapshotTest, EveryLinkRestoresWhatAFullSnapshotWould) {
  // Eviction after 3 steps: the links carry removed ids as well as changed rows.
  Cluster cluster(root_, 1, /*full_every=*/4, /*evict_after=*/3, tmp_->path() + "/full");
  for (int64_t step = 1; step <= 9; ++step) {
    cluster.Push(step, KeysOfStep(step, 0.1));
    cluster.SnapshotAndWait(step);
    const State now = cluster.Now();
    ASSERT_FALSE(now.rows.empty());
    auto restored = Restored(root_, 1, std::to_string(step));
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(*restored == now) << "step " << step;
  }
  // Full at 1, 5 and 9; each other one builds on the one before and is smaller than a
  // full snapshot of the same moment (a third of the rows change each step).
  const std::vector<SnapshotInfo> list = Listed(cluster.snapshotter(0));
  const std::vector<SnapshotInfo> whole = Listed(cluster.snapshotter(1));
  ASSERT_EQ(list.size(), 9u);
  ASSERT_EQ(whole.size(), 9u);
  for (size_t k = 0; k < list.size(); ++k) {
    const SnapshotInfo& i = list[k];
    const bool full = i.step() % 4 == 1;
    EXPECT_EQ(i.has_base(), !full) << "step " << i.step();
    EXPECT_FALSE(whole[k].has_base());
    if (full) {
      EXPECT_EQ(i.bytes(), whole[k].bytes()) << "step " << i.step();
    } else {
      EXPECT_EQ(i.base_step(), i.step() - 1);
      EXPECT_LT(i.bytes(), whole[k].bytes() * 0.6) << "step " << i.step();
    }
  }
}

TEST_F(IncrementalSnapshotTest, AChainRestoresIntoAnotherShardCount) {
  Cluster cluster(root_, 2, /*full_every=*/8, /*evict_after=*/0);
  for (int64_t step = 1; step <= 4; ++step) {
    cluster.Push(step, KeysOfStep(step, 0.2));
    cluster.SnapshotAndWait(step);
  }
  const State now = cluster.Now();
  for (uint32_t n : {1u, 3u}) {
    auto restored = Restored(root_, n, "latest");
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(restored->rows.size(), now.rows.size()) << n << " shards";
    // (The dense slices concatenate differently across shard counts: rows only.)
    State rows_only = *restored;
    rows_only.dense.clear();
    State now_rows = now;
    now_rows.dense.clear();
    EXPECT_TRUE(rows_only == now_rows) << n << " shards";
  }
}

TEST_F(IncrementalSnapshotTest, ADamagedLinkIsRefusedNamingItsFileAndNothingIsDeleted) {
  Cluster cluster(root_, 1, /*full_every=*/8, /*evict_after=*/0);
  State at_one;
  for (int64_t step = 1; step <= 3; ++step) {
    cluster.Push(step, KeysOfStep(step, 0.1));
    cluster.SnapshotAndWait(step);
    if (step == 1) at_one = cluster.Now();
  }
  const std::string dir = ShardSnapshotDir(root_, 0);
  const std::string link = FileSnapshotStore::SnapshotPath(dir, 2);
  {  // one byte of the middle link's rows flipped: its footer and manifest still verify
    std::fstream f(link, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(200);
    f.write(&c, 1);
  }
  auto refused = Restored(root_, 1, "latest");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr(link));
  for (int64_t step = 1; step <= 3; ++step) {
    EXPECT_TRUE(fs::exists(FileSnapshotStore::SnapshotPath(dir, step))) << step;
  }
  // Told to skip what does not verify, a restore falls back past both steps that need it.
  int64_t step = -1;
  auto fallback = Restored(root_, 1, "latest", /*skip_damaged=*/true, &step);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(step, 1);
  EXPECT_TRUE(*fallback == at_one);
}

TEST_F(IncrementalSnapshotTest, AMissingLinkMakesItsChainUnrestorableSayingWhich) {
  Cluster cluster(root_, 1, /*full_every=*/8, /*evict_after=*/0);
  for (int64_t step = 1; step <= 3; ++step) {
    cluster.Push(step, KeysOfStep(step, 0.1));
    cluster.SnapshotAndWait(step);
  }
  const std::string dir = ShardSnapshotDir(root_, 0);
  fs::rename(FileSnapshotStore::SnapshotPath(dir, 2), tmp_->path() + "/moved_away");
  auto refused = Restored(root_, 1, "3");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("changes since step 2, which is not there"));
  int64_t step = -1;
  auto fallback = Restored(root_, 1, "latest", /*skip_damaged=*/true, &step);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(step, 1);
}

TEST_F(IncrementalSnapshotTest, RetentionKeepsEveryLinkAKeptSnapshotNeeds) {
  Cluster cluster(root_, 1, /*full_every=*/3, /*evict_after=*/0);
  // Snapshots 1 (full), 2 and 3 (changes), 4 (full): the coordinator keeps step 3 only.
  for (int64_t step = 1; step <= 4; ++step) cluster.Push(step, KeysOfStep(step, 0.1));
  for (int64_t step = 1; step <= 3; ++step) cluster.SnapshotAndWait(step);
  SnapshotRequest r;
  r.set_step(4);
  r.add_keep_steps(3);
  ASSERT_TRUE(cluster.snapshotter(0).Snapshot(r, Generous()).ok());
  ASSERT_TRUE(cluster.snapshotter(0).AwaitIdle(Generous()));
  std::vector<int64_t> steps;
  for (const SnapshotInfo& i : Listed(cluster.snapshotter(0))) steps.push_back(i.step());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(Restored(root_, 1, "3").ok());
  // Keeping 4 alone (a full one) lets the chain of 3 go whole.
  r.set_step(5);
  r.clear_keep_steps();
  r.add_keep_steps(4);
  cluster.Push(5, KeysOfStep(5, 0.1));
  ASSERT_TRUE(cluster.snapshotter(0).Snapshot(r, Generous()).ok());
  ASSERT_TRUE(cluster.snapshotter(0).AwaitIdle(Generous()));
  steps.clear();
  for (const SnapshotInfo& i : Listed(cluster.snapshotter(0))) steps.push_back(i.step());
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 5}));
}

TEST_F(IncrementalSnapshotTest, WithoutRowVersionsEverySnapshotIsFull) {
  ShardOptions o;  // track_row_versions off
  Shard shard(o);
  shard.RegisterWorker(0);
  ASSERT_TRUE(shard.CreateTable(SparseSpec(0)).ok());
  SnapshotterOptions so;
  so.root = root_;
  so.full_every = 4;
  auto s = Snapshotter::Create(&shard, so);
  ASSERT_TRUE(s.ok());
  for (int64_t step = 1; step <= 3; ++step) {
    SnapshotRequest r;
    r.set_step(step);
    ASSERT_TRUE((*s)->Snapshot(r, Generous()).ok());
    ASSERT_TRUE((*s)->AwaitIdle(Generous()));
  }
  for (const SnapshotInfo& i : Listed(**s)) EXPECT_FALSE(i.has_base()) << i.step();
}

}  // namespace
}  // namespace pscluster::ps
