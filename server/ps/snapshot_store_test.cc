#include "server/ps/snapshot_store.h"

#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "proto/snapshot.pb.h"
#include "rocksdb/db.h"
#include "server/ps/table.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// ---------------------------------------------------------------------------------------
// Key layout (documented at the top of snapshot_store.h), spelled out independently here.

std::string ManifestKey(int64_t step) { return absl::StrFormat("manifest/%020d", step); }
std::string StepPrefix(int64_t step) { return absl::StrFormat("snap/%020d/", step); }
std::string HeaderKey(int64_t step, uint32_t table) {
  return StepPrefix(step) + absl::StrFormat("t/%010u/h", table);
}
std::string BlockKey(int64_t step, uint32_t table, uint64_t block) {
  return StepPrefix(step) + absl::StrFormat("t/%010u/x/%012u", table, block);
}

// Raw access to the store's RocksDB database (the store must be closed for writes).
std::unique_ptr<rocksdb::DB> RawOpen(const std::string& dir, bool read_only) {
  rocksdb::Options options;
  options.create_if_missing = false;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = read_only ? rocksdb::DB::OpenForReadOnly(options, dir, &db)
                                : rocksdb::DB::Open(options, dir, &db);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return std::unique_ptr<rocksdb::DB>(db);
}

void RawPut(const std::string& dir, const std::string& key, const std::string& value) {
  std::unique_ptr<rocksdb::DB> db = RawOpen(dir, /*read_only=*/false);
  ASSERT_NE(db, nullptr);
  rocksdb::WriteOptions sync;
  sync.sync = true;
  rocksdb::Status s = db->Put(sync, key, value);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

std::string RawGet(const std::string& dir, const std::string& key) {
  std::unique_ptr<rocksdb::DB> db = RawOpen(dir, /*read_only=*/true);
  if (db == nullptr) return "";
  std::string value;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), key, &value);
  EXPECT_TRUE(s.ok()) << key << ": " << s.ToString();
  return value;
}

std::vector<std::string> RawKeys(const std::string& dir) {
  std::unique_ptr<rocksdb::DB> db = RawOpen(dir, /*read_only=*/true);
  std::vector<std::string> keys;
  if (db == nullptr) return keys;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) keys.push_back(it->key().ToString());
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
  return keys;
}

int CountWithPrefix(const std::vector<std::string>& keys, const std::string& prefix) {
  int n = 0;
  for (const std::string& k : keys) n += k.rfind(prefix, 0) == 0;
  return n;
}

// ---------------------------------------------------------------------------------------
// Images and a visitor that rebuilds them.

::testing::AssertionResult BitwiseEqual(const void* a, const void* b, size_t bytes) {
  if (std::memcmp(a, b, bytes) == 0) return ::testing::AssertionSuccess();
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  size_t i = 0;
  while (x[i] == y[i]) ++i;
  return ::testing::AssertionFailure() << "first differing byte at " << i << " of " << bytes;
}

template <typename T, typename A>
::testing::AssertionResult BitwiseEqual(const std::vector<T, A>& a, const std::vector<T, A>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  return BitwiseEqual(a.data(), b.data(), a.size() * sizeof(T));
}

// Arbitrary bit patterns (NaN payloads, denormals, -0 included): the store must keep bytes.
std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out(n);
  for (float& f : out) {
    uint32_t bits = rng();
    std::memcpy(&f, &bits, sizeof(f));
  }
  return out;
}

std::unique_ptr<TableImage> DenseImage(uint32_t table_id, uint64_t begin, uint64_t size,
                                       uint32_t num_slots, uint32_t seed) {
  auto image = std::make_unique<TableImage>();
  TableSnapshotHeader& h = image->header;
  h.mutable_spec()->set_table_id(table_id);
  h.mutable_spec()->set_name("dense");
  h.mutable_spec()->set_kind(TableSpec::DENSE);
  h.mutable_spec()->set_size(begin + size + 1000);
  h.mutable_spec()->mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  h.mutable_spec()->mutable_optimizer()->set_learning_rate(0.01f);
  h.set_shard_begin(begin);
  h.set_shard_end(begin + size);
  h.set_applied_steps(17);
  h.set_updates(42);
  h.set_num_slots(num_slots);
  WorkerClock* c = h.add_clocks();
  c->set_worker_id(0);
  c->set_clock(18);
  c = h.add_clocks();
  c->set_worker_id(3);
  c->set_clock(19);
  for (uint32_t a = 0; a <= num_slots; ++a) {
    std::vector<float> values = RandomFloats(size, seed + a);
    image->arrays.emplace_back(values.begin(), values.end());
  }
  return image;
}

std::unique_ptr<TableImage> SparseImage(uint32_t table_id, uint64_t rows, uint32_t dim,
                                        uint32_t num_slots, uint32_t seed) {
  auto image = std::make_unique<TableImage>();
  TableSnapshotHeader& h = image->header;
  h.mutable_spec()->set_table_id(table_id);
  h.mutable_spec()->set_name("sparse");
  h.mutable_spec()->set_kind(TableSpec::SPARSE);
  h.mutable_spec()->set_dim(dim);
  h.mutable_spec()->mutable_optimizer()->set_kind(OptimizerConfig::ADAGRAD);
  h.mutable_spec()->mutable_optimizer()->set_learning_rate(0.1f);
  h.mutable_spec()->mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  h.set_applied_steps(5);
  h.set_num_slots(num_slots);
  h.set_num_rows(rows);
  WorkerClock* c = h.add_clocks();
  c->set_worker_id(7);
  c->set_clock(6);
  std::mt19937_64 rng(seed);
  for (uint64_t r = 0; r < rows; ++r) {
    image->keys.push_back(rng());
    image->row_updates.push_back(static_cast<int64_t>(rng() % 1000) - 3);
  }
  image->row_data = RandomFloats(rows * dim * (1 + num_slots), seed + 1);
  return image;
}

uint64_t DataBytes(const TableImage& image) {
  uint64_t n = image.keys.size() * 16 + image.row_data.size() * sizeof(float);
  for (const auto& a : image.arrays) n += a.size() * sizeof(float);
  return n;
}

struct DenseCall {
  uint64_t begin, n;
};

class RebuildVisitor : public SnapshotStore::Visitor {
 public:
  absl::Status Header(const TableSnapshotHeader& header) override {
    const uint32_t id = header.spec().table_id();
    EXPECT_EQ(images.count(id), 0u) << "header of table " << id << " visited twice";
    auto image = std::make_unique<TableImage>();
    image->header = header;
    if (header.spec().kind() == TableSpec::DENSE) {
      image->arrays.resize(1 + header.num_slots());
      for (auto& a : image->arrays) a.resize(header.shard_end() - header.shard_begin());
    }
    order.push_back(id);
    images[id] = std::move(image);
    return absl::OkStatus();
  }

  absl::Status DenseBlock(const TableSnapshotHeader& header, uint64_t begin, uint64_t n,
                          const float* data) override {
    TableImage& image = *images.at(header.spec().table_id());
    dense_calls[header.spec().table_id()].push_back({begin, n});
    const uint64_t local = begin - header.shard_begin();
    EXPECT_LE(local + n, image.arrays[0].size());
    if (local + n > image.arrays[0].size()) return absl::OkStatus();
    for (size_t a = 0; a < image.arrays.size(); ++a) {
      std::memcpy(image.arrays[a].data() + local, data + a * n, n * sizeof(float));
    }
    return absl::OkStatus();
  }

  absl::Status SparseRow(const TableSnapshotHeader& header, uint64_t key, int64_t updates,
                         const float* data) override {
    TableImage& image = *images.at(header.spec().table_id());
    image.keys.push_back(key);
    image.row_updates.push_back(updates);
    const size_t row_len = header.spec().dim() * (1 + header.num_slots());
    image.row_data.insert(image.row_data.end(), data, data + row_len);
    return absl::OkStatus();
  }

  std::vector<uint32_t> order;
  std::map<uint32_t, std::unique_ptr<TableImage>> images;
  std::map<uint32_t, std::vector<DenseCall>> dense_calls;
};

// Expects `got` to be exactly `want` (header and every byte of data).
void ExpectSameImage(const TableImage& want, const TableImage& got) {
  EXPECT_TRUE(MessageDifferencer::Equals(want.header, got.header))
      << "want " << want.header.ShortDebugString() << "\n got " << got.header.ShortDebugString();
  ASSERT_EQ(want.arrays.size(), got.arrays.size());
  for (size_t a = 0; a < want.arrays.size(); ++a) {
    EXPECT_TRUE(BitwiseEqual(want.arrays[a], got.arrays[a])) << "array " << a;
  }
  EXPECT_TRUE(BitwiseEqual(want.keys, got.keys));
  EXPECT_TRUE(BitwiseEqual(want.row_updates, got.row_updates));
  EXPECT_TRUE(BitwiseEqual(want.row_data, got.row_data));
}

// ---------------------------------------------------------------------------------------

class SnapshotStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_dir_ = std::make_unique<pscluster::testing::TempDir>("snapshot_store_test");
    tmp_ = tmp_dir_->path();
    dir_ = tmp_ + "/db";
  }
  void TearDown() override { tmp_dir_.reset(); }

  std::unique_ptr<pscluster::testing::TempDir> tmp_dir_;

  std::unique_ptr<SnapshotStore> OpenStore(bool read_only = false) {
    auto store = SnapshotStore::Open(dir_, read_only);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  static std::vector<std::unique_ptr<TableImage>> Images(std::unique_ptr<TableImage> a) {
    std::vector<std::unique_ptr<TableImage>> v;
    v.push_back(std::move(a));
    return v;
  }

  // Writes a small dense snapshot of `step`.
  static SnapshotManifest WriteSmall(SnapshotStore& store, int64_t step, bool has_metric = false,
                                     double metric = 0) {
    SnapshotStore::WriteOptions o;
    o.has_metric = has_metric;
    o.metric = metric;
    auto m = store.Write(step, Images(DenseImage(1, 0, 100, 1, static_cast<uint32_t>(step))), o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : SnapshotManifest();
  }

  static std::vector<int64_t> Steps(const SnapshotStore& store) {
    auto list = store.List();
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<int64_t> out;
    if (list.ok()) {
      for (const auto& m : *list) out.push_back(m.step());
    }
    return out;
  }

  std::string tmp_;  // removed in TearDown
  std::string dir_;  // the database, inside tmp_
};

TEST_F(SnapshotStoreTest, DenseAndSparseRoundTripBitwise) {
  const uint64_t dense_size = kDenseBlockValues * 2 + 123;
  const uint64_t dense_begin = 5000;
  const uint64_t sparse_rows = kSparseBlockRows * 2 + 17;
  std::vector<std::unique_ptr<TableImage>> images;
  // Unsorted on purpose: the store orders tables by id.
  images.push_back(SparseImage(9, sparse_rows, 3, 1, 11));
  images.push_back(DenseImage(4, dense_begin, dense_size, 2, 21));
  const uint64_t data_bytes = DataBytes(*images[0]) + DataBytes(*images[1]);

  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::atomic<uint64_t> written{0};
  SnapshotStore::WriteOptions o;
  o.shard_id = 1;
  o.num_shards = 3;
  o.has_metric = true;
  o.metric = 0.25;
  o.bytes_written = &written;
  auto manifest = store->Write(12, images, o);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->format_version(), kSnapshotFormatVersion);
  EXPECT_EQ(manifest->step(), 12);
  EXPECT_EQ(manifest->shard_id(), 1u);
  EXPECT_EQ(manifest->num_shards(), 3u);
  EXPECT_TRUE(manifest->has_metric());
  EXPECT_EQ(manifest->metric(), 0.25);
  ASSERT_EQ(manifest->tables_size(), 2);
  EXPECT_EQ(manifest->tables(0).table_id(), 4u);
  EXPECT_EQ(manifest->tables(1).table_id(), 9u);
  EXPECT_EQ(manifest->tables(0).bytes(), images[1]->header.ByteSizeLong() + DataBytes(*images[1]));
  EXPECT_EQ(manifest->tables(1).bytes(), images[0]->header.ByteSizeLong() + DataBytes(*images[0]));
  EXPECT_EQ(manifest->bytes(), manifest->tables(0).bytes() + manifest->tables(1).bytes());
  EXPECT_EQ(written.load(), data_bytes);

  auto check = [&](const SnapshotStore& s) {
    RebuildVisitor v;
    absl::Status st = s.Read(12, &v);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_THAT(v.order, ElementsAre(4u, 9u));
    ASSERT_EQ(v.images.count(4), 1u);
    ASSERT_EQ(v.images.count(9), 1u);
    ExpectSameImage(*images[1], *v.images[4]);
    ExpectSameImage(*images[0], *v.images[9]);
    // Dense blocks: global indices, kDenseBlockValues each, the last one partial.
    const auto& calls = v.dense_calls[4];
    ASSERT_EQ(calls.size(), 3u);
    EXPECT_EQ(calls[0].begin, dense_begin);
    EXPECT_EQ(calls[0].n, kDenseBlockValues);
    EXPECT_EQ(calls[1].begin, dense_begin + kDenseBlockValues);
    EXPECT_EQ(calls[1].n, kDenseBlockValues);
    EXPECT_EQ(calls[2].begin, dense_begin + 2 * kDenseBlockValues);
    EXPECT_EQ(calls[2].n, 123u);
    EXPECT_EQ(v.dense_calls.count(9), 0u);
  };
  check(*store);
  {
    // A read-only store reads it while the read-write one is open (resharding).
    auto ro = SnapshotStore::Open(dir_, /*read_only=*/true);
    ASSERT_TRUE(ro.ok()) << ro.status();
    check(**ro);
  }
  // And it survives closing and reopening.
  store.reset();
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  check(*store);
  auto list = store->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  // created_unix_micros and all: the listed manifest is the one Write returned.
  EXPECT_TRUE(MessageDifferencer::Equals((*list)[0], *manifest));
}

TEST_F(SnapshotStoreTest, EmptySparseTableRoundTrips) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::vector<std::unique_ptr<TableImage>> images;
  images.push_back(SparseImage(2, 0, 5, 2, 1));
  images.push_back(DenseImage(1, 0, 1, 0, 2));
  ASSERT_TRUE(store->Write(3, images, {}).ok());
  RebuildVisitor v;
  ASSERT_TRUE(store->Read(3, &v).ok());
  ASSERT_EQ(v.images.size(), 2u);
  ExpectSameImage(*images[1], *v.images[1]);
  ExpectSameImage(*images[0], *v.images[2]);
}

TEST_F(SnapshotStoreTest, SnapshotWithoutTablesLeavesNothingInStaging) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(2, Images(DenseImage(1, 0, 100, 1, 1)), {}).ok());
  EXPECT_TRUE(fs::is_empty(fs::path(dir_) / "staging"));
  auto m = store->Write(1, {}, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tables_size(), 0);
  EXPECT_TRUE(fs::is_empty(fs::path(dir_) / "staging"));
  RebuildVisitor v;
  EXPECT_TRUE(store->Read(1, &v).ok());
  EXPECT_TRUE(v.images.empty());
  EXPECT_THAT(Steps(*store), ElementsAre(1, 2));
}

TEST_F(SnapshotStoreTest, ListReturnsCompleteSnapshotsAscending) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Steps(*store), IsEmpty());

  std::map<int64_t, SnapshotManifest> written;
  for (int64_t step : {30, 4, 17}) {
    SnapshotStore::WriteOptions o;
    o.shard_id = 2;
    o.num_shards = 5;
    o.has_metric = step != 17;
    o.metric = step * 0.5;
    std::vector<std::unique_ptr<TableImage>> images;
    images.push_back(DenseImage(1, 0, 1000 + step, 1, 3));
    images.push_back(SparseImage(2, 10 + step, 2, 0, 4));
    auto m = store->Write(step, images, o);
    ASSERT_TRUE(m.ok()) << m.status();
    written[step] = *m;
  }
  auto list = store->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  std::vector<int64_t> steps;
  for (const SnapshotManifest& m : *list) {
    steps.push_back(m.step());
    const SnapshotManifest& w = written[m.step()];
    EXPECT_EQ(m.bytes(), w.bytes());
    EXPECT_GT(m.bytes(), static_cast<uint64_t>(1000 + m.step()) * 8);
    EXPECT_EQ(m.has_metric(), m.step() != 17);
    EXPECT_EQ(m.metric(), m.step() * 0.5);
    EXPECT_EQ(m.shard_id(), 2u);
    EXPECT_EQ(m.num_shards(), 5u);
    EXPECT_EQ(m.format_version(), kSnapshotFormatVersion);
    EXPECT_TRUE(MessageDifferencer::Equals(m, w));
  }
  EXPECT_THAT(steps, ElementsAre(4, 17, 30));
}

TEST_F(SnapshotStoreTest, PartialSnapshotIsInvisibleAndRemovedOnOpen) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 1);
  store.reset();

  // A crash mid-write: data keys of step 7 without a manifest, and a stray staging file.
  RawPut(dir_, HeaderKey(7, 1), "garbage header");
  RawPut(dir_, BlockKey(7, 1, 0), std::string(400, 'x'));
  RawPut(dir_, BlockKey(7, 2, 3), "more garbage");
  const fs::path stray = fs::path(dir_) / "staging" / "7.sst";
  ASSERT_TRUE(fs::is_directory(stray.parent_path()));
  { std::ofstream(stray) << "half an sst file"; }
  ASSERT_TRUE(fs::exists(stray));
  ASSERT_EQ(CountWithPrefix(RawKeys(dir_), StepPrefix(7)), 3);

  // A read-only open (another shard reading it) neither shows nor touches it.
  {
    auto ro = SnapshotStore::Open(dir_, /*read_only=*/true);
    ASSERT_TRUE(ro.ok()) << ro.status();
    EXPECT_THAT(Steps(**ro), ElementsAre(1));
  }
  EXPECT_TRUE(fs::exists(stray));

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Steps(*store), ElementsAre(1));
  RebuildVisitor v;
  EXPECT_EQ(store->Read(7, &v).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_TRUE(fs::is_empty(fs::path(dir_) / "staging"));
  RebuildVisitor v1;
  EXPECT_TRUE(store->Read(1, &v1).ok());
  store.reset();

  std::vector<std::string> keys = RawKeys(dir_);
  EXPECT_EQ(CountWithPrefix(keys, StepPrefix(7)), 0) << "partial snapshot's data left behind";
  EXPECT_EQ(CountWithPrefix(keys, StepPrefix(1)), 2);  // header + one block
  EXPECT_EQ(CountWithPrefix(keys, ManifestKey(1)), 1);

  // The step can be written again afterwards.
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::vector<std::unique_ptr<TableImage>> images;
  images.push_back(DenseImage(1, 0, 300, 0, 99));
  ASSERT_TRUE(store->Write(7, images, {}).ok());
  RebuildVisitor v7;
  ASSERT_TRUE(store->Read(7, &v7).ok());
  ASSERT_EQ(v7.images.size(), 1u);
  ExpectSameImage(*images[0], *v7.images[1]);
  EXPECT_THAT(Steps(*store), ElementsAre(1, 7));
}

TEST_F(SnapshotStoreTest, ChangedBlockIsChecksumMismatch) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(5, Images(DenseImage(1, 0, kDenseBlockValues + 10, 1, 5)), {}).ok());
  store.reset();

  std::string block = RawGet(dir_, BlockKey(5, 1, 1));
  ASSERT_EQ(block.size(), 10u * 2 * sizeof(float));
  block[17] = static_cast<char>(block[17] ^ 0x40);
  RawPut(dir_, BlockKey(5, 1, 1), block);

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  absl::Status s = store->Read(5, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(s.message(), HasSubstr("table 1"));
}

TEST_F(SnapshotStoreTest, ChangedSparseBlockIsChecksumMismatch) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(5, Images(SparseImage(3, 100, 2, 1, 5)), {}).ok());
  store.reset();

  std::string block = RawGet(dir_, BlockKey(5, 3, 0));
  ASSERT_EQ(block.size(), 100u * (16 + 4 * sizeof(float)));
  block[3] = static_cast<char>(block[3] ^ 0x01);  // a key
  RawPut(dir_, BlockKey(5, 3, 0), block);

  store = OpenStore(/*read_only=*/true);
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  absl::Status s = store->Read(5, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("checksum mismatch"));
}

TEST_F(SnapshotStoreTest, ChangedHeaderIsDataLoss) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto image = DenseImage(1, 0, 50, 1, 5);
  ASSERT_TRUE(store->Write(5, Images(std::move(image)), {}).ok());
  store.reset();

  TableSnapshotHeader h;
  ASSERT_TRUE(h.ParseFromString(RawGet(dir_, HeaderKey(5, 1))));
  h.set_applied_steps(h.applied_steps() + 1);  // still parses, same layout
  RawPut(dir_, HeaderKey(5, 1), h.SerializeAsString());

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  absl::Status s = store->Read(5, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("checksum mismatch"));
}

TEST_F(SnapshotStoreTest, BlockOfTheWrongSizeIsDataLoss) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(5, Images(DenseImage(1, 0, kDenseBlockValues + 10, 1, 5)), {}).ok());
  ASSERT_TRUE(store->Write(6, Images(SparseImage(2, 10, 2, 1, 6)), {}).ok());
  store.reset();

  std::string block = RawGet(dir_, BlockKey(5, 1, 0));
  block.resize(block.size() - sizeof(float));
  RawPut(dir_, BlockKey(5, 1, 0), block);
  std::string sparse = RawGet(dir_, BlockKey(6, 2, 0));
  sparse.push_back('\0');
  RawPut(dir_, BlockKey(6, 2, 0), sparse);

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  absl::Status s = store->Read(5, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("wrong size"));
  RebuildVisitor v6;
  s = store->Read(6, &v6);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("wrong size"));
}

TEST_F(SnapshotStoreTest, MissingOrExtraDenseBlockIsDataLoss) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(5, Images(DenseImage(1, 0, kDenseBlockValues + 10, 0, 5)), {}).ok());
  ASSERT_TRUE(store->Write(6, Images(DenseImage(1, 0, 10, 0, 6)), {}).ok());
  store.reset();
  {
    std::unique_ptr<rocksdb::DB> db = RawOpen(dir_, false);
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(db->Delete(rocksdb::WriteOptions(), BlockKey(5, 1, 1)).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), BlockKey(6, 1, 1), std::string(40, 'y')).ok());
  }
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v5, v6;
  absl::Status s = store->Read(5, &v5);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  s = store->Read(6, &v6);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(SnapshotStoreTest, UnknownStepIsNotFound) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  EXPECT_EQ(store->Read(3, &v).code(), absl::StatusCode::kNotFound);
  WriteSmall(*store, 2);
  absl::Status s = store->Read(3, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("step 3"));
  EXPECT_TRUE(v.images.empty());
}

TEST_F(SnapshotStoreTest, OtherFormatVersionIsFailedPrecondition) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 8);
  store.reset();

  SnapshotManifest m;
  ASSERT_TRUE(m.ParseFromString(RawGet(dir_, ManifestKey(8))));
  EXPECT_EQ(m.format_version(), kSnapshotFormatVersion);
  m.set_format_version(kSnapshotFormatVersion + 41);
  RawPut(dir_, ManifestKey(8), m.SerializeAsString());

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  absl::Status s = store->Read(8, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("format version ", kSnapshotFormatVersion + 41)));
  EXPECT_TRUE(v.images.empty());
}

TEST_F(SnapshotStoreTest, RetentionKeepsNewestAndLowestMetric) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const double metrics[] = {3, 1, 4, 5, 9};
  for (int64_t step = 1; step <= 5; ++step) WriteSmall(*store, step, true, metrics[step - 1]);
  auto deleted = store->ApplyRetention(2, /*lower_is_better=*/true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, UnorderedElementsAre(1, 3));
  EXPECT_THAT(Steps(*store), ElementsAre(2, 4, 5));
  // Idempotent.
  deleted = store->ApplyRetention(2, true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, IsEmpty());
  store.reset();

  std::vector<std::string> keys = RawKeys(dir_);
  for (int64_t step : {1, 3}) {
    EXPECT_EQ(CountWithPrefix(keys, StepPrefix(step)), 0) << step;
    EXPECT_EQ(CountWithPrefix(keys, ManifestKey(step)), 0) << step;
  }
  for (int64_t step : {2, 4, 5}) {
    EXPECT_EQ(CountWithPrefix(keys, StepPrefix(step)), 2) << step;
    EXPECT_EQ(CountWithPrefix(keys, ManifestKey(step)), 1) << step;
  }
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (int64_t step : {2, 4, 5}) {
    RebuildVisitor v;
    EXPECT_TRUE(store->Read(step, &v).ok()) << step;
  }
}

TEST_F(SnapshotStoreTest, RetentionKeepsHighestMetricWhenHigherIsBetter) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const double metrics[] = {3, 10, 4, 5, 9};
  for (int64_t step = 1; step <= 5; ++step) WriteSmall(*store, step, true, metrics[step - 1]);
  auto deleted = store->ApplyRetention(2, /*lower_is_better=*/false);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, UnorderedElementsAre(1, 3));
  EXPECT_THAT(Steps(*store), ElementsAre(2, 4, 5));
}

TEST_F(SnapshotStoreTest, RetentionWhenTheBestIsAmongTheNewest) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const double metrics[] = {3, 1, 4, 5, 9};
  for (int64_t step = 1; step <= 5; ++step) WriteSmall(*store, step, true, metrics[step - 1]);
  auto deleted = store->ApplyRetention(2, /*lower_is_better=*/false);  // best: 9, step 5
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, UnorderedElementsAre(1, 2, 3));
  EXPECT_THAT(Steps(*store), ElementsAre(4, 5));
  store.reset();
  std::vector<std::string> keys = RawKeys(dir_);
  for (int64_t step : {1, 2, 3}) EXPECT_EQ(CountWithPrefix(keys, StepPrefix(step)), 0) << step;
}

TEST_F(SnapshotStoreTest, RetentionWithoutMetricsKeepsTheNewest) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (int64_t step = 1; step <= 4; ++step) WriteSmall(*store, step * 10);
  auto deleted = store->ApplyRetention(3, true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(10));
  EXPECT_THAT(Steps(*store), ElementsAre(20, 30, 40));
}

TEST_F(SnapshotStoreTest, DeleteMakesSnapshotInvisible) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 1);
  WriteSmall(*store, 2);
  ASSERT_TRUE(store->Delete(1).ok());
  EXPECT_THAT(Steps(*store), ElementsAre(2));
  RebuildVisitor v;
  EXPECT_EQ(store->Read(1, &v).code(), absl::StatusCode::kNotFound);
  RebuildVisitor v2;
  EXPECT_TRUE(store->Read(2, &v2).ok());
  // Deleting an absent step is harmless.
  EXPECT_TRUE(store->Delete(99).ok());
  store.reset();
  std::vector<std::string> keys = RawKeys(dir_);
  EXPECT_EQ(CountWithPrefix(keys, StepPrefix(1)), 0);
  EXPECT_EQ(CountWithPrefix(keys, ManifestKey(1)), 0);
  EXPECT_EQ(CountWithPrefix(keys, StepPrefix(2)), 2);
}

TEST_F(SnapshotStoreTest, OpenFailsCleanlyWhereNoDirectoryCanBeMade) {
  const std::string file = tmp_ + "/regular_file";
  { std::ofstream(file) << "not a directory"; }
  auto store = SnapshotStore::Open(file + "/db");
  EXPECT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr(file));
  auto ro = SnapshotStore::Open(file + "/db", /*read_only=*/true);
  EXPECT_FALSE(ro.ok());
  auto missing = SnapshotStore::Open(tmp_ + "/does/not/exist", /*read_only=*/true);
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace pscluster::ps
