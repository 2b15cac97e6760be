// A sparse table on a shard with a disk tier whose RAM budget holds a fraction of its rows
// trains exactly as the same table all in RAM: the same values pulled at every step, the
// same rows stored (captures, fingerprints), the same evictions and incremental changes;
// and its rows really moved to disk and back. A disk without room refuses the pushes that
// need it, changes nothing, and the table goes on serving.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps/table/disk_tier.h"
#include "server/ps/table/sparse_table.h"
#include "server/ps/table/sparse_table_testing.h"

namespace pscluster::ps {
namespace {

constexpr uint32_t kDim = 4;
constexpr uint64_t kIds = 4000;

TableSpec AdagradSpec(ConsistencyConfig::Mode mode) {
  TableSpec spec = SparseSpec(kDim, mode, 0.1f);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAGRAD);
  spec.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
  spec.mutable_initializer()->set_scale(0.5f);
  spec.mutable_initializer()->set_seed(7);
  return spec;
}

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

std::unique_ptr<DiskTier> OpenTier(const std::string& dir, uint64_t memory_rows,
                                   uint64_t reserve = 1 << 20) {
  // A row of AdagradSpec: 4 values and 4 slots, with its key, count and step.
  const uint64_t row_bytes = SparseTable::RowBytes(AdagradSpec(ConsistencyConfig::BSP), 1) + 8;
  auto tier = DiskTier::Open({dir, memory_rows * row_bytes, reserve});
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? *std::move(tier) : nullptr;
}

std::unique_ptr<SparseTable> Make(const TableSpec& spec, DiskTier* tier, int workers,
                                  bool versions = false) {
  auto table = SparseTable::Create(spec, 0, 1, UINT64_MAX, versions, tier);
  EXPECT_TRUE(table.ok()) << table.status();
  for (int w = 0; w < workers; ++w) (*table)->AddWorker(w);
  return *std::move(table);
}

// One worker's push of a step: ids drawn with a skew (a few hot, many cold), gradients
// from the same stream.
struct Push {
  std::vector<uint64_t> keys;
  std::vector<float> grads;
};
Push Draw(std::mt19937_64& rng, size_t n) {
  Push p;
  std::uniform_real_distribution<float> g(-1, 1);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t u = rng() % kIds;
    p.keys.push_back(i % 4 == 0 ? u % 50 : u);
    for (uint32_t j = 0; j < kDim; ++j) p.grads.push_back(g(rng));
  }
  return p;
}

std::vector<uint64_t> AllIds() {
  std::vector<uint64_t> ids(kIds);
  for (uint64_t i = 0; i < kIds; ++i) ids[i] = i;
  return ids;
}

// Trains `tables` alike for `steps` steps of `workers` workers; every step, every id pulls
// the same bits from each.
void TrainAlike(const std::vector<SparseTable*>& tables, int workers, int64_t from, int64_t steps) {
  std::mt19937_64 rng(from + 11);
  for (int64_t step = from; step < from + steps; ++step) {
    for (int w = 0; w < workers; ++w) {
      const Push p = Draw(rng, 300);
      for (SparseTable* t : tables) ASSERT_TRUE(PushRows(*t, w, step, p.keys, p.grads).ok());
    }
    const std::vector<float> want = ReadRows(*tables[0], AllIds());
    for (size_t i = 1; i < tables.size(); ++i) {
      ASSERT_EQ(ReadRows(*tables[i], AllIds()), want) << "table " << i << " after step " << step;
    }
  }
}

class SparseTableTierTest : public ::testing::TestWithParam<ConsistencyConfig::Mode> {};

TEST_P(SparseTableTierTest, TrainsExactlyAsInRamWithMostRowsOnDisk) {
  const int workers = GetParam() == ConsistencyConfig::BSP ? 2 : 1;
  auto tier = OpenTier(TestDir("trains"), 400);
  auto ram = Make(AdagradSpec(GetParam()), nullptr, workers);
  auto tiered = Make(AdagradSpec(GetParam()), tier.get(), workers);
  TrainAlike({ram.get(), tiered.get()}, workers, 0, 25);

  EXPECT_EQ(StoredRows(*tiered), StoredRows(*ram));
  EXPECT_EQ(tiered->Fingerprint(), ram->Fingerprint());
  const TableStats s = tiered->Stats();
  EXPECT_EQ(s.info().num_rows(), ram->Stats().info().num_rows());
  EXPECT_GT(s.rows_on_disk(), s.info().num_rows() / 2);
  EXPECT_GT(s.rows_to_disk(), 0u);
  EXPECT_GT(s.rows_from_disk(), 0u);
  EXPECT_GT(s.disk_reads(), 0u);
  EXPECT_GT(s.ram_hits(), 0u);
  // RAM holds the budget (400 rows) and at most one push's new rows beyond it.
  EXPECT_LE(s.info().num_rows() - s.rows_on_disk(), 400u + 2 * 300u);
}

INSTANTIATE_TEST_SUITE_P(Modes, SparseTableTierTest,
                         ::testing::Values(ConsistencyConfig::BSP, ConsistencyConfig::ASP));

TEST(SparseTableTier, ACaptureRestoresIntoATieredTableAndIntoOneInRam) {
  auto tier = OpenTier(TestDir("restore"), 300);
  auto tiered = Make(AdagradSpec(ConsistencyConfig::BSP), tier.get(), 2);
  TrainAlike({tiered.get()}, 2, 0, 10);
  auto image = tiered->CaptureNow();
  ASSERT_TRUE(image.ok()) << image.status();
  const TableImage& im = **image;
  ASSERT_GT(tiered->Stats().rows_on_disk(), 0u);

  auto into_ram = Make(AdagradSpec(ConsistencyConfig::BSP), nullptr, 2);
  auto into_tier = Make(AdagradSpec(ConsistencyConfig::BSP), tier.get(), 2);
  const size_t row_len = im.row_data.size() / im.keys.size();
  for (size_t i = 0; i < im.keys.size(); ++i) {
    for (SparseTable* t : {into_ram.get(), into_tier.get()}) {
      ASSERT_TRUE(
          t->RestoreRow(im.keys[i], im.row_updates[i], im.row_data.data() + i * row_len).ok());
    }
  }
  EXPECT_EQ(StoredRows(*into_ram), StoredRows(*tiered));
  EXPECT_EQ(StoredRows(*into_tier), StoredRows(*tiered));
  EXPECT_GT(into_tier->Stats().rows_on_disk(), 0u);
  EXPECT_EQ(ReadRows(*into_tier, AllIds()), ReadRows(*tiered, AllIds()));
}

TEST(SparseTableTier, EvictionAndIncrementalCapturesSeeTheRowsOnDisk) {
  TableSpec spec = AdagradSpec(ConsistencyConfig::BSP);
  spec.mutable_rows()->set_evict_after_steps(6);
  auto tier = OpenTier(TestDir("evict"), 300);
  auto ram = Make(spec, nullptr, 2, /*versions=*/true);
  auto tiered = Make(spec, tier.get(), 2, /*versions=*/true);
  TrainAlike({ram.get(), tiered.get()}, 2, 0, 12);
  absl::Duration pause;
  ASSERT_TRUE(ram->HoldStep(12).ok() && tiered->HoldStep(12).ok());
  auto base_ram = ram->Capture(12, absl::InfiniteFuture(), &pause);
  auto base_tiered = tiered->Capture(12, absl::InfiniteFuture(), &pause);
  ASSERT_TRUE(base_ram.ok() && base_tiered.ok());
  TrainAlike({ram.get(), tiered.get()}, 2, 12, 12);

  EXPECT_EQ(tiered->Stats().rows_evicted(), ram->Stats().rows_evicted());
  EXPECT_GT(tiered->Stats().rows_evicted(), 0u);
  EXPECT_EQ(StoredRows(*tiered), StoredRows(*ram));
  ASSERT_TRUE(ram->HoldStep(24).ok() && tiered->HoldStep(24).ok());
  auto changes_ram = ram->Capture(24, absl::InfiniteFuture(), &pause, (*base_ram)->version);
  auto changes_tiered =
      tiered->Capture(24, absl::InfiniteFuture(), &pause, (*base_tiered)->version);
  ASSERT_TRUE(changes_ram.ok() && changes_tiered.ok());
  ASSERT_TRUE((*changes_tiered)->header.changes_only());
  auto sorted = [](std::vector<uint64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted((*changes_tiered)->keys), sorted((*changes_ram)->keys));
  EXPECT_EQ(sorted((*changes_tiered)->removed), sorted((*changes_ram)->removed));
  EXPECT_GT(tiered->Stats().rows_on_disk(), 0u);
}

TEST(SparseTableTier, RefusesADirectoryThatIsNotATiers) {
  const std::string dir = TestDir("foreign");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/precious.txt") << "not yours";
  auto tier = DiskTier::Open({dir, 1 << 20, 1 << 20});
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()), ::testing::HasSubstr("--sparse_tier_dir"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/precious.txt"));
}

// Needs a small file system: tests/run.sh mounts a tmpfs (as root) and passes it in
// PSCLUSTER_SMALL_FS; elsewhere the test skips, saying so.
TEST(SparseTableTier, ADiskWithoutRoomRefusesThePushesThatNeedItAndChangesNothing) {
  const char* small = std::getenv("PSCLUSTER_SMALL_FS");
  if (small == nullptr || *small == '\0') {
    GTEST_SKIP() << "PSCLUSTER_SMALL_FS is not set: no small file system to fill "
                    "(tests/run.sh mounts one when run as root)";
  }
  const std::string dir = std::string(small) + "/sparse_tier";
  auto tier = OpenTier(dir, 4096, /*reserve=*/2 << 20);
  ASSERT_NE(tier, nullptr);
  auto table = Make(AdagradSpec(ConsistencyConfig::ASP), tier.get(), 1);
  absl::Status refused;
  int64_t step = 0;
  std::vector<float> grads(2048 * kDim, 0.5f);
  std::vector<uint64_t> last;
  for (uint64_t next = 0; refused.ok() && step < 10000; ++step) {
    std::vector<uint64_t> keys(2048);
    for (uint64_t& k : keys) k = next++;  // new rows every push: the older ones go to disk
    const uint32_t before = table->Fingerprint();
    refused = PushRows(*table, 0, step, keys, grads);
    if (!refused.ok()) EXPECT_EQ(table->Fingerprint(), before) << "a refused push changed rows";
    if (refused.ok()) last = keys;
  }
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("--sparse_tier_reserve_bytes"));
  // Still serving: rows on disk and in RAM read back, and pushes to RAM rows go on.
  const std::vector<uint64_t> first = {0, 1, 2};
  EXPECT_EQ(ReadRows(*table, first).size(), 3 * kDim);
  const TableStats s = table->Stats();
  EXPECT_GT(s.rows_on_disk(), 0u);
  EXPECT_TRUE(PushRows(*table, 0, step, last, grads).ok()) << "the rows in RAM need no disk";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pscluster::ps
