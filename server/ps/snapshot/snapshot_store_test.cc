// Tests of the shard snapshot store: the file layout of file_snapshot_store.h (what
// ps_server writes) and the read-only RocksDB layout of older snapshots
// (rocksdb_snapshot_store.h) as FileSnapshotStore lists and reads it.
//
// The on-disk formats are spelled out here independently of the implementation (record
// parsing, CRC-32C, the block encoding, the old key layout), so that a change to either
// format fails a test rather than passing silently.
#include "server/ps/snapshot/snapshot_store.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
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
#include "server/ps/snapshot/file_snapshot_store.h"
#include "server/ps/snapshot/rocksdb_snapshot_store.h"
#include "server/ps/table/table.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;

using ::google::protobuf::util::MessageDifferencer;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// ---------------------------------------------------------------------------------------
// The file layout (documented at the top of file_snapshot_store.h), spelled out here.

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: `crc` is the CRC of
// earlier bytes (0 to start), as crc32c::Extend.
uint32_t Crc32c(uint32_t crc, absl::string_view data) {
  crc = ~crc;
  for (unsigned char b : data) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

const std::string kMagic("PSNAP\0v2", 8);
const std::string kEndMagic("PSNAPEND", 8);
constexpr uint64_t kFooterBytes = 16;     // u64 manifest record offset, "PSNAPEND"
constexpr uint64_t kRecordOverhead = 16;  // u32 kind, u64 length, ..., u32 crc
constexpr uint32_t kHeaderRecord = 1;
constexpr uint32_t kBlockRecord = 2;
constexpr uint32_t kManifestRecord = 3;

std::string PsnapPath(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/snapshots/%020d.psnap", dir, step);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// Little-endian fixed-width integers (the test runs on little-endian machines only).
template <typename T>
T Load(const std::string& s, uint64_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(v));
  return v;
}
template <typename T>
void Append(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

struct RawRecord {
  uint64_t offset = 0;  // of the record's kind field in the file
  uint32_t kind = 0;
  std::string payload;
  uint32_t crc = 0;  // as stored
  bool crc_ok() const { return crc == Crc32c(0, payload); }
  uint64_t payload_offset() const { return offset + 12; }
};

struct RawSnapshot {
  std::vector<RawRecord> records;  // in file order
  uint64_t manifest_offset = 0;    // as the footer says
  std::vector<size_t> Of(uint32_t kind) const {
    std::vector<size_t> out;
    for (size_t i = 0; i < records.size(); ++i) {
      if (records[i].kind == kind) out.push_back(i);
    }
    return out;
  }
};

// Splits a .psnap file into its records, checking the framing strictly (magic, footer,
// lengths) but not the CRCs (RawRecord::crc_ok) or the payloads.
::testing::AssertionResult ParseSnapshot(const std::string& bytes, RawSnapshot* out) {
  *out = RawSnapshot();
  if (bytes.size() < kMagic.size() + kFooterBytes) {
    return ::testing::AssertionFailure() << "only " << bytes.size() << " bytes";
  }
  if (bytes.compare(0, kMagic.size(), kMagic) != 0) {
    return ::testing::AssertionFailure() << "no magic at the start";
  }
  if (bytes.compare(bytes.size() - 8, 8, kEndMagic) != 0) {
    return ::testing::AssertionFailure() << "no PSNAPEND at the end";
  }
  const uint64_t end = bytes.size() - kFooterBytes;
  out->manifest_offset = Load<uint64_t>(bytes, end);
  for (uint64_t at = kMagic.size(); at < end;) {
    if (end - at < kRecordOverhead) {
      return ::testing::AssertionFailure() << "record at " << at << " runs into the footer";
    }
    RawRecord r;
    r.offset = at;
    r.kind = Load<uint32_t>(bytes, at);
    const uint64_t len = Load<uint64_t>(bytes, at + 4);
    if (len > end - at - kRecordOverhead) {
      return ::testing::AssertionFailure() << "record at " << at << " claims " << len << " bytes";
    }
    r.payload = bytes.substr(at + 12, len);
    r.crc = Load<uint32_t>(bytes, at + 12 + len);
    out->records.push_back(std::move(r));
    at += kRecordOverhead + len;
  }
  return ::testing::AssertionSuccess();
}

RawSnapshot MustParse(const std::string& path) {
  RawSnapshot raw;
  EXPECT_TRUE(ParseSnapshot(ReadBytes(path), &raw)) << path;
  return raw;
}

// One record with a correct CRC.
std::string EncodeRecord(uint32_t kind, const std::string& payload) {
  std::string out;
  Append<uint32_t>(&out, kind);
  Append<uint64_t>(&out, payload.size());
  out += payload;
  Append<uint32_t>(&out, Crc32c(0, payload));
  return out;
}

// A whole file: magic, `records` (CRCs recomputed), a footer pointing at the last one.
std::string Assemble(const std::vector<RawRecord>& records) {
  std::string out = kMagic;
  uint64_t last = 0;
  for (const RawRecord& r : records) {
    last = out.size();
    out += EncodeRecord(r.kind, r.payload);
  }
  Append<uint64_t>(&out, last);
  out += kEndMagic;
  return out;
}

// Lets `edit` change the records of the file at `path`, then writes it back well framed and
// with every record CRC valid: what is wrong can only be found by the manifest's checksums.
void RewriteRecords(const std::string& path,
                    const std::function<void(std::vector<RawRecord>&)>& edit) {
  RawSnapshot raw;
  ASSERT_TRUE(ParseSnapshot(ReadBytes(path), &raw)) << path;
  edit(raw.records);
  WriteBytes(path, Assemble(raw.records));
  ASSERT_TRUE(ParseSnapshot(ReadBytes(path), &raw));
  for (const RawRecord& r : raw.records) ASSERT_TRUE(r.crc_ok());
}

void FlipByte(const std::string& path, uint64_t at, unsigned char mask) {
  std::string bytes = ReadBytes(path);
  ASSERT_LT(at, bytes.size()) << path;
  bytes[at] = static_cast<char>(bytes[at] ^ mask);
  WriteBytes(path, bytes);
}

// Every plain file under `dir` (relative path -> bytes).
std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file())
      out[fs::relative(e.path(), dir).string()] = ReadBytes(e.path().string());
  }
  return out;
}

// Every file of `before` is still there with the same bytes; RocksDB's info logs ("LOG",
// "LOG.old.*", which even a read-only open rotates) need only still exist.
void ExpectNothingRemovedOrChanged(const std::map<std::string, std::string>& before,
                                   const std::map<std::string, std::string>& after) {
  for (const auto& [name, bytes] : before) {
    auto it = after.find(name);
    if (it == after.end()) {
      ADD_FAILURE() << name << " was removed";
      continue;
    }
    if (name.rfind("LOG", 0) == 0) continue;
    EXPECT_TRUE(it->second == bytes) << name << " was changed";
  }
}

// ---------------------------------------------------------------------------------------
// The block encoding (snapshot_store.h), spelled out here. DENSE: one block per
// kDenseBlockValues indices, the values then each slot; SPARSE: up to kSparseBlockRows rows
// as keys (u64), update counts (i64), then the rows' floats.

std::vector<std::string> EncodeBlocks(const TableImage& image) {
  std::vector<std::string> blocks;
  const TableSnapshotHeader& h = image.header;
  if (h.spec().kind() == TableSpec::DENSE) {
    const uint64_t size = h.shard_end() - h.shard_begin();
    for (uint64_t at = 0; at < size; at += kDenseBlockValues) {
      const uint64_t n = std::min(kDenseBlockValues, size - at);
      std::string b;
      for (const auto& a : image.arrays) {
        b.append(reinterpret_cast<const char*>(a.data() + at), n * sizeof(float));
      }
      blocks.push_back(std::move(b));
    }
    return blocks;
  }
  const uint64_t row_len = h.spec().dim() * (1 + h.num_slots());
  for (uint64_t at = 0; at < image.keys.size(); at += kSparseBlockRows) {
    const uint64_t n = std::min<uint64_t>(kSparseBlockRows, image.keys.size() - at);
    std::string b;
    b.append(reinterpret_cast<const char*>(image.keys.data() + at), n * 8);
    b.append(reinterpret_cast<const char*>(image.row_updates.data() + at), n * 8);
    b.append(reinterpret_cast<const char*>(image.row_data.data() + at * row_len),
             n * row_len * sizeof(float));
    blocks.push_back(std::move(b));
  }
  return blocks;
}

// ---------------------------------------------------------------------------------------
// The older RocksDB layout (rocksdb_snapshot_store.h), written here with raw puts.

std::string LegacyManifestKey(int64_t step) { return absl::StrFormat("manifest/%020d", step); }
std::string LegacyStepPrefix(int64_t step) { return absl::StrFormat("snap/%020d/", step); }
std::string LegacyHeaderKey(int64_t step, uint32_t table) {
  return LegacyStepPrefix(step) + absl::StrFormat("t/%010u/h", table);
}
std::string LegacyBlockKey(int64_t step, uint32_t table, uint64_t block) {
  return LegacyStepPrefix(step) + absl::StrFormat("t/%010u/x/%012u", table, block);
}

struct LegacyOptions {
  bool has_metric = false;
  double metric = 0;
  bool flush = true;                // into an SST; else the data stays in the write-ahead log
  bool write_manifest = true;       // false: a partial snapshot of the old writer
  uint32_t crc_xor = 0;             // nonzero: the manifest's checksums are wrong
  bool shrink_first_block = false;  // the first block of each table one byte short
};

// Writes snapshot `step` in the older layout into the RocksDB database in `dir` (created if
// need be) and returns its manifest.
SnapshotManifest PutLegacySnapshot(const std::string& dir, int64_t step,
                                   const std::vector<std::unique_ptr<TableImage>>& images,
                                   const LegacyOptions& o = {}) {
  rocksdb::Options options;
  options.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  SnapshotManifest m;
  m.set_format_version(kRocksDbSnapshotFormatVersion);
  m.set_step(step);
  m.set_shard_id(0);
  m.set_num_shards(1);
  m.set_has_metric(o.has_metric);
  m.set_metric(o.metric);
  m.set_created_unix_micros(1600000000000000 + step);
  if (db == nullptr) return m;
  std::vector<const TableImage*> sorted;
  for (const auto& i : images) sorted.push_back(i.get());
  std::sort(sorted.begin(), sorted.end(), [](const TableImage* a, const TableImage* b) {
    return a->header.spec().table_id() < b->header.spec().table_id();
  });
  uint64_t total = 0;
  for (const TableImage* image : sorted) {
    const uint32_t id = image->header.spec().table_id();
    const std::string header = image->header.SerializeAsString();
    EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), LegacyHeaderKey(step, id), header).ok());
    uint32_t crc = Crc32c(0, header);
    uint64_t bytes = header.size();
    std::vector<std::string> blocks = EncodeBlocks(*image);
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (o.shrink_first_block && b == 0) blocks[b].pop_back();
      EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), LegacyBlockKey(step, id, b), blocks[b]).ok());
      crc = Crc32c(crc, blocks[b]);
      bytes += blocks[b].size();
    }
    TableChecksum* c = m.add_tables();
    c->set_table_id(id);
    c->set_crc32c(crc ^ o.crc_xor);
    c->set_bytes(bytes);
    total += bytes;
  }
  m.set_bytes(total);
  if (o.write_manifest) {
    rocksdb::WriteOptions sync;
    sync.sync = true;
    EXPECT_TRUE(db->Put(sync, LegacyManifestKey(step), m.SerializeAsString()).ok());
  }
  if (o.flush) {
    s = db->Flush(rocksdb::FlushOptions());
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  s = db->Close();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return m;
}

// The keys of the RocksDB database in `dir` (opened read-only).
std::vector<std::string> LegacyKeys(const std::string& dir) {
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir, &raw);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  std::vector<std::string> keys;
  if (db == nullptr) return keys;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) keys.push_back(it->key().ToString());
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
  return keys;
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
                         int64_t step, const float* data) override {
    TableImage& image = *images.at(header.spec().table_id());
    image.keys.push_back(key);
    image.row_updates.push_back(updates);
    if (header.row_steps()) image.row_steps.push_back(step);
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
  EXPECT_TRUE(BitwiseEqual(want.row_steps, got.row_steps));
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

  // The file of snapshot `step` in the store.
  std::string Path(int64_t step) const { return PsnapPath(dir_, step); }

  // Reads snapshot `step` and expects DATA_LOSS naming its file and `what`.
  void ExpectDataLoss(const SnapshotStore& store, int64_t step,
                      const std::vector<std::string>& what) {
    RebuildVisitor v;
    absl::Status s = store.Read(step, &v);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "step " << step << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(Path(step))) << "step " << step;
    for (const std::string& w : what) {
      EXPECT_THAT(std::string(s.message()), HasSubstr(w)) << "step " << step;
    }
  }

  std::string tmp_;  // removed in TearDown
  std::string dir_;  // the store, inside tmp_
};

TEST(SnapshotFormatTest, TheTestsCrc32cIsTheStandardOne) {
  EXPECT_EQ(Crc32c(0, "123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(Crc32c(0, "1234"), "56789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, B.4
  EXPECT_EQ(Crc32c(0, ""), 0u);
}

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
  EXPECT_TRUE(fs::is_regular_file(Path(12)));
  EXPECT_TRUE(fs::is_empty(fs::path(dir_) / "staging"));

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
  EXPECT_THAT(store->Damaged(), IsEmpty());
}

// A table with a SparseRowPolicy: its rows' last update steps (a third i64 per row in
// each block) and its admission counts (in the header) come back as written.
TEST_F(SnapshotStoreTest, RowStepsAndAdmissionCountsRoundTripBitwise) {
  std::vector<std::unique_ptr<TableImage>> images;
  images.push_back(SparseImage(9, kSparseBlockRows + 17, 3, 1, 13));
  TableImage& image = *images[0];
  image.header.mutable_spec()->mutable_rows()->set_admit_after_pushes(4);
  image.header.mutable_spec()->mutable_rows()->set_evict_after_steps(40);
  image.header.set_row_steps(true);
  image.header.set_admission_counts(std::string(4096, '\3'));
  for (size_t i = 0; i < image.keys.size(); ++i)
    image.row_steps.push_back(static_cast<int64_t>(3 * i) - 7);
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(3, images, {}).ok());
  RebuildVisitor v;
  ASSERT_TRUE(store->Read(3, &v).ok());
  ASSERT_EQ(v.images.count(9), 1u);
  ExpectSameImage(image, *v.images[9]);
  // A block that lacks the steps its header promises is refused, naming the table.
  image.row_steps.pop_back();
  EXPECT_FALSE(store->Write(4, images, {}).ok());
}

// The file is exactly as file_snapshot_store.h documents it, parsed by the test alone.
TEST_F(SnapshotStoreTest, FileIsAsDocumented) {
  std::vector<std::unique_ptr<TableImage>> images;
  images.push_back(SparseImage(9, kSparseBlockRows + 3, 2, 1, 31));
  images.push_back(DenseImage(4, 77, kDenseBlockValues * 2 + 5, 1, 32));
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto manifest = store->Write(12, images, {});
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_EQ(FileSnapshotStore::SnapshotPath(dir_, 12), Path(12));
  // snapshots/ holds that file alone.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(dir_) / "snapshots")) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_THAT(names, ElementsAre("00000000000000000012.psnap"));

  const std::string bytes = ReadBytes(Path(12));
  RawSnapshot raw;
  ASSERT_TRUE(ParseSnapshot(bytes, &raw));
  std::vector<uint32_t> kinds;
  uint64_t size = kMagic.size() + kFooterBytes;
  for (const RawRecord& r : raw.records) {
    kinds.push_back(r.kind);
    EXPECT_TRUE(r.crc_ok()) << "record at " << r.offset;
    size += kRecordOverhead + r.payload.size();
  }
  EXPECT_EQ(size, bytes.size());
  // Tables by id: dense 4 (header, 3 blocks), sparse 9 (header, 2 blocks), the manifest.
  EXPECT_THAT(kinds, ElementsAre(kHeaderRecord, kBlockRecord, kBlockRecord, kBlockRecord,
                                 kHeaderRecord, kBlockRecord, kBlockRecord, kManifestRecord));
  ASSERT_EQ(raw.records.size(), 8u);
  EXPECT_EQ(raw.manifest_offset, raw.records.back().offset);

  SnapshotManifest m;
  ASSERT_TRUE(m.ParseFromString(raw.records.back().payload));
  EXPECT_TRUE(MessageDifferencer::Equals(m, *manifest));
  EXPECT_EQ(m.format_version(), 2u);

  // Each table: the header as written, the blocks in the shared encoding, and the
  // manifest's CRC over the header's payload then the blocks' payloads.
  const std::vector<std::pair<const TableImage*, size_t>> tables = {{images[1].get(), 0},
                                                                    {images[0].get(), 4}};
  uint64_t total = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    const auto& [image, first] = tables[t];
    TableSnapshotHeader h;
    ASSERT_TRUE(h.ParseFromString(raw.records[first].payload));
    EXPECT_TRUE(MessageDifferencer::Equals(h, image->header));
    uint32_t crc = Crc32c(0, raw.records[first].payload);
    uint64_t bytes_of_table = raw.records[first].payload.size();
    const std::vector<std::string> blocks = EncodeBlocks(*image);
    for (size_t b = 0; b < blocks.size(); ++b) {
      const std::string& payload = raw.records[first + 1 + b].payload;
      EXPECT_TRUE(payload == blocks[b]) << "table " << t << " block " << b;
      crc = Crc32c(crc, payload);
      bytes_of_table += payload.size();
    }
    ASSERT_LT(t, static_cast<size_t>(m.tables_size()));
    EXPECT_EQ(m.tables(t).table_id(), image->header.spec().table_id());
    EXPECT_EQ(m.tables(t).crc32c(), crc) << "table " << t;
    EXPECT_EQ(m.tables(t).bytes(), bytes_of_table) << "table " << t;
    total += bytes_of_table;
  }
  EXPECT_EQ(m.bytes(), total);

  // A snapshot without tables: the magic, the manifest, the footer.
  ASSERT_TRUE(store->Write(13, {}, {}).ok());
  RawSnapshot empty = MustParse(Path(13));
  ASSERT_EQ(empty.records.size(), 1u);
  EXPECT_EQ(empty.records[0].kind, kManifestRecord);
  EXPECT_EQ(empty.records[0].offset, kMagic.size());
  EXPECT_EQ(empty.manifest_offset, kMagic.size());
  EXPECT_TRUE(empty.records[0].crc_ok());
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
  // The empty sparse table is a header without blocks.
  RawSnapshot raw = MustParse(Path(3));
  std::vector<uint32_t> kinds;
  for (const RawRecord& r : raw.records) kinds.push_back(r.kind);
  EXPECT_THAT(kinds, ElementsAre(kHeaderRecord, kBlockRecord, kHeaderRecord, kManifestRecord));
}

TEST_F(SnapshotStoreTest, SnapshotWithoutTablesLeavesNothingInStaging) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(2, Images(DenseImage(1, 0, 100, 1, 1)), {}).ok());
  EXPECT_TRUE(fs::is_empty(fs::path(dir_) / "staging"));
  auto m = store->Write(1, {}, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tables_size(), 0);
  EXPECT_EQ(m->bytes(), 0u);
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
  for (int64_t step : {int64_t{30}, int64_t{4}, int64_t{17}, int64_t{1234567890123}}) {
    SnapshotStore::WriteOptions o;
    o.shard_id = 2;
    o.num_shards = 5;
    o.has_metric = step != 17;
    o.metric = step * 0.5;
    std::vector<std::unique_ptr<TableImage>> images;
    images.push_back(DenseImage(1, 0, 1000 + step % 1000, 1, 3));
    images.push_back(SparseImage(2, 10 + step % 1000, 2, 0, 4));
    auto m = store->Write(step, images, o);
    ASSERT_TRUE(m.ok()) << m.status();
    written[step] = *m;
  }
  auto list = store->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 4u);
  std::vector<int64_t> steps;
  for (const SnapshotManifest& m : *list) {
    steps.push_back(m.step());
    const SnapshotManifest& w = written[m.step()];
    EXPECT_EQ(m.bytes(), w.bytes());
    EXPECT_GT(m.bytes(), static_cast<uint64_t>(1000 + m.step() % 1000) * 8);
    EXPECT_EQ(m.has_metric(), m.step() != 17);
    EXPECT_EQ(m.metric(), m.step() * 0.5);
    EXPECT_EQ(m.shard_id(), 2u);
    EXPECT_EQ(m.num_shards(), 5u);
    EXPECT_EQ(m.format_version(), kSnapshotFormatVersion);
    EXPECT_TRUE(MessageDifferencer::Equals(m, w));
  }
  EXPECT_THAT(steps, ElementsAre(4, 17, 30, 1234567890123));
  // A read-only store lists the same.
  auto ro = OpenStore(/*read_only=*/true);
  ASSERT_NE(ro, nullptr);
  EXPECT_THAT(Steps(*ro), ElementsAre(4, 17, 30, 1234567890123));
}

// While a write is under way its file is in staging/ only: neither listed nor readable.
TEST_F(SnapshotStoreTest, SnapshotIsInvisibleUntilComplete) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 1);
  auto images = Images(DenseImage(1, 0, kDenseBlockValues * 3 + 1, 0, 8));
  SnapshotStore::WriteOptions o;
  o.test_delay_per_block = absl::Milliseconds(150);
  absl::StatusOr<SnapshotManifest> result;
  std::thread writer([&] { result = store->Write(5, images, o); });
  const fs::path staging = fs::path(dir_) / "staging" / "5.tmp";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fs::exists(staging) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(fs::exists(staging));
  {
    auto ro = OpenStore(/*read_only=*/true);
    ASSERT_NE(ro, nullptr);
    EXPECT_THAT(Steps(*ro), ElementsAre(1));
    RebuildVisitor v;
    EXPECT_EQ(ro->Read(5, &v).code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(ro->Damaged(), IsEmpty());
  }
  EXPECT_THAT(Steps(*store), ElementsAre(1));
  EXPECT_FALSE(fs::exists(Path(5)));
  writer.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_THAT(Steps(*store), ElementsAre(1, 5));
  RebuildVisitor v;
  ASSERT_TRUE(store->Read(5, &v).ok());
  ExpectSameImage(*images[0], *v.images[1]);
}

TEST_F(SnapshotStoreTest, PartialSnapshotIsInvisibleAndRemovedOnOpen) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 1);
  store.reset();

  // A crash mid-write: the first half of a snapshot of step 7 in staging/; and a crash
  // after the fsync but before the rename: a whole file of step 9 there.
  std::string whole;
  {
    auto other = SnapshotStore::Open(tmp_ + "/other");
    ASSERT_TRUE(other.ok()) << other.status();
    WriteSmall(**other, 7);
    whole = ReadBytes(PsnapPath(tmp_ + "/other", 7));
  }
  const fs::path stray = fs::path(dir_) / "staging" / "7.tmp";
  const fs::path unrenamed = fs::path(dir_) / "staging" / "9.tmp";
  ASSERT_TRUE(fs::is_directory(stray.parent_path()));
  WriteBytes(stray.string(), whole.substr(0, whole.size() / 2));
  WriteBytes(unrenamed.string(), whole);

  // A read-only open (another shard reading it) neither shows nor touches them.
  {
    auto ro = SnapshotStore::Open(dir_, /*read_only=*/true);
    ASSERT_TRUE(ro.ok()) << ro.status();
    EXPECT_THAT(Steps(**ro), ElementsAre(1));
    RebuildVisitor v;
    EXPECT_EQ((*ro)->Read(7, &v).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ((*ro)->Read(9, &v).code(), absl::StatusCode::kNotFound);
    EXPECT_THAT((*ro)->Damaged(), IsEmpty());
  }
  EXPECT_EQ(ReadBytes(stray.string()), whole.substr(0, whole.size() / 2));
  EXPECT_EQ(ReadBytes(unrenamed.string()), whole);

  // A read-write open removes them.
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_FALSE(fs::exists(unrenamed));
  EXPECT_TRUE(fs::is_empty(fs::path(dir_) / "staging"));
  EXPECT_THAT(Steps(*store), ElementsAre(1));
  EXPECT_THAT(store->Damaged(), IsEmpty());
  RebuildVisitor v;
  absl::Status s = store->Read(7, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("step 7"));
  EXPECT_TRUE(v.images.empty());
  RebuildVisitor v1;
  EXPECT_TRUE(store->Read(1, &v1).ok());

  // The step can be written afterwards.
  auto images = Images(DenseImage(1, 0, 300, 0, 99));
  ASSERT_TRUE(store->Write(7, images, {}).ok());
  RebuildVisitor v7;
  ASSERT_TRUE(store->Read(7, &v7).ok());
  ASSERT_EQ(v7.images.size(), 1u);
  ExpectSameImage(*images[0], *v7.images[1]);
  EXPECT_THAT(Steps(*store), ElementsAre(1, 7));
  EXPECT_TRUE(fs::is_empty(fs::path(dir_) / "staging"));
}

// Bytes changed under a record: the record's own CRC catches it, naming the file.
TEST_F(SnapshotStoreTest, FlippedByteFailsTheRecordChecksum) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (int64_t step : {5, 6, 7, 8}) {
    ASSERT_TRUE(
        store->Write(step, Images(DenseImage(1, 0, kDenseBlockValues + 10, 1, step)), {}).ok());
  }
  ASSERT_TRUE(store->Write(9, Images(SparseImage(3, 100, 2, 1, 9)), {}).ok());
  ASSERT_TRUE(store->Write(10, Images(DenseImage(1, 0, 50, 0, 10)), {}).ok());
  store.reset();

  // 5: a byte of the second block; 6: of the header; 7: of a block's stored CRC;
  // 8: of a block's length; 9: of a sparse block (a key).
  RawSnapshot r5 = MustParse(Path(5));
  ASSERT_EQ(r5.records.size(), 4u);
  FlipByte(Path(5), r5.records[2].payload_offset() + 17, 0x40);
  RawSnapshot r6 = MustParse(Path(6));
  FlipByte(Path(6), r6.records[0].payload_offset() + 3, 0x01);
  RawSnapshot r7 = MustParse(Path(7));
  FlipByte(Path(7), r7.records[1].payload_offset() + r7.records[1].payload.size(), 0x80);
  RawSnapshot r8 = MustParse(Path(8));
  FlipByte(Path(8), r8.records[1].offset + 4 + 2, 0x10);
  RawSnapshot r9 = MustParse(Path(9));
  FlipByte(Path(9), r9.records[1].payload_offset() + 3, 0x01);

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectDataLoss(*store, 5, {"fails its checksum", absl::StrCat("offset ", r5.records[2].offset)});
  ExpectDataLoss(*store, 6, {"fails its checksum", absl::StrCat("offset ", r6.records[0].offset)});
  ExpectDataLoss(*store, 7, {"fails its checksum", absl::StrCat("offset ", r7.records[1].offset)});
  ExpectDataLoss(*store, 8, {absl::StrCat("offset ", r8.records[1].offset)});
  ExpectDataLoss(*store, 9, {"fails its checksum", absl::StrCat("offset ", r9.records[1].offset)});
  // The others read on.
  RebuildVisitor v;
  EXPECT_TRUE(store->Read(10, &v).ok());
}

// A block rewritten with a valid record CRC: the manifest's checksum of the table catches it.
TEST_F(SnapshotStoreTest, ChangedBlockIsChecksumMismatch) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(5, Images(DenseImage(1, 0, kDenseBlockValues + 10, 1, 5)), {}).ok());
  ASSERT_TRUE(store->Write(6, Images(SparseImage(3, 100, 2, 1, 6)), {}).ok());
  store.reset();

  RewriteRecords(Path(5), [](std::vector<RawRecord>& r) {
    ASSERT_EQ(r.size(), 4u);
    ASSERT_EQ(r[2].kind, kBlockRecord);
    ASSERT_EQ(r[2].payload.size(), 10u * 2 * sizeof(float));
    r[2].payload[17] = static_cast<char>(r[2].payload[17] ^ 0x40);
  });
  RewriteRecords(Path(6), [](std::vector<RawRecord>& r) {
    ASSERT_EQ(r.size(), 3u);
    ASSERT_EQ(r[1].payload.size(), 100u * (16 + 4 * sizeof(float)));
    r[1].payload[3] = static_cast<char>(r[1].payload[3] ^ 0x01);  // a key
  });

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectDataLoss(*store, 5, {"checksum mismatch", "table 1"});
  auto ro = OpenStore(/*read_only=*/true);
  ASSERT_NE(ro, nullptr);
  ExpectDataLoss(*ro, 6, {"checksum mismatch", "table 3"});
  // A listing checks manifests, a read checks data: a store lists a snapshot until it has
  // read it whole and found it damaged, then names it instead.
  EXPECT_THAT(Steps(*store), ElementsAre(6));
  EXPECT_THAT(Steps(*ro), ElementsAre(5));
  ASSERT_EQ(store->Damaged().size(), 1u);
  EXPECT_THAT(store->Damaged()[0], AllOf(HasSubstr(Path(5)), HasSubstr("checksum mismatch")));
}

// Fails every header it is shown, as a loader does for specs that disagree between shards.
class RefusingVisitor final : public SnapshotStore::Visitor {
 public:
  absl::Status Header(const TableSnapshotHeader&) override {
    return absl::DataLossError("specs differ");
  }
  absl::Status DenseBlock(const TableSnapshotHeader&, uint64_t, uint64_t, const float*) override {
    return absl::OkStatus();
  }
  absl::Status SparseRow(const TableSnapshotHeader&, uint64_t, int64_t, int64_t,
                         const float*) override {
    return absl::OkStatus();
  }
};

// Regression: a snapshot whose data a read found damaged stayed listed as complete (its
// manifest verifies), so a restore that skipped it still saw it offered. The store that read
// it names it instead of listing it, for as long as the file is the one it read; a visitor's
// own refusal says nothing of the file; a file put back in its place is listed again.
TEST_F(SnapshotStoreTest, SnapshotAReadFoundDamagedIsNamedNotListedWhileItsFileStays) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 1);
  WriteSmall(*store, 2);
  const std::string intact = ReadBytes(Path(2));
  RawSnapshot r2 = MustParse(Path(2));
  FlipByte(Path(2), r2.records[1].payload_offset() + 3, 0x01);
  const std::string damaged = ReadBytes(Path(2));
  EXPECT_THAT(Steps(*store), ElementsAre(1, 2)) << "its manifest verifies";

  RefusingVisitor refusing;
  EXPECT_EQ(store->Read(1, &refusing).code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Steps(*store), ElementsAre(1, 2)) << "the visitor's refusal marked a file";

  ExpectDataLoss(*store, 2, {"fails its checksum"});
  EXPECT_THAT(Steps(*store), ElementsAre(1));
  ASSERT_EQ(store->Damaged().size(), 1u);
  EXPECT_THAT(store->Damaged()[0], AllOf(HasSubstr(Path(2)), HasSubstr("fails its checksum")));
  auto deleted = store->RetainOnly({});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(1));
  absl::Status over = store->Write(2, Images(DenseImage(1, 0, 100, 1, 7)), {}).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kFailedPrecondition) << over;
  EXPECT_THAT(std::string(over.message()), HasSubstr(Path(2)));
  EXPECT_EQ(ReadBytes(Path(2)), damaged) << "the damaged file was changed";

  // Another file in its place (renamed there, as a copy put back is): read afresh.
  WriteBytes(Path(2) + ".new", intact);
  fs::rename(Path(2) + ".new", Path(2));
  EXPECT_THAT(Steps(*store), ElementsAre(2));
  EXPECT_THAT(store->Damaged(), IsEmpty());
  RebuildVisitor v;
  EXPECT_TRUE(store->Read(2, &v).ok());
}

TEST_F(SnapshotStoreTest, ChangedHeaderIsChecksumMismatch) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (int64_t step : {5, 6, 7}) {
    ASSERT_TRUE(store->Write(step, Images(DenseImage(1, 0, 50, 1, 5)), {}).ok());
  }
  store.reset();

  // 5: a header that still parses, with the same layout; 6: a header of another table;
  // 7: a header that does not parse.
  RewriteRecords(Path(5), [](std::vector<RawRecord>& r) {
    TableSnapshotHeader h;
    ASSERT_TRUE(h.ParseFromString(r[0].payload));
    h.set_applied_steps(h.applied_steps() + 1);
    r[0].payload = h.SerializeAsString();
  });
  RewriteRecords(Path(6), [](std::vector<RawRecord>& r) {
    TableSnapshotHeader h;
    ASSERT_TRUE(h.ParseFromString(r[0].payload));
    h.mutable_spec()->set_table_id(2);
    r[0].payload = h.SerializeAsString();
  });
  RewriteRecords(Path(7), [](std::vector<RawRecord>& r) { r[0].payload = "\xff\xff\xff\xff"; });

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectDataLoss(*store, 5, {"checksum mismatch", "table 1"});
  ExpectDataLoss(*store, 6, {"table 1"});
  ExpectDataLoss(*store, 7, {"table 1"});
}

TEST_F(SnapshotStoreTest, BlockOfTheWrongSizeIsDataLoss) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(5, Images(DenseImage(1, 0, kDenseBlockValues + 10, 1, 5)), {}).ok());
  ASSERT_TRUE(store->Write(6, Images(SparseImage(2, 10, 2, 1, 6)), {}).ok());
  ASSERT_TRUE(store->Write(7, Images(DenseImage(1, 0, kDenseBlockValues + 10, 1, 7)), {}).ok());
  store.reset();

  RewriteRecords(Path(5), [](std::vector<RawRecord>& r) {
    r[1].payload.resize(r[1].payload.size() - sizeof(float));
  });
  RewriteRecords(Path(6), [](std::vector<RawRecord>& r) { r[1].payload.push_back('\0'); });
  RewriteRecords(Path(7), [](std::vector<RawRecord>& r) {  // the last block one float long
    r[2].payload += std::string(sizeof(float), '\0');
  });

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectDataLoss(*store, 5, {"wrong size", "table 1"});
  ExpectDataLoss(*store, 6, {"wrong size", "table 2"});
  ExpectDataLoss(*store, 7, {"wrong size", "table 1"});
}

TEST_F(SnapshotStoreTest, MissingOrExtraRecordsAreDataLoss) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(5, Images(DenseImage(1, 0, kDenseBlockValues + 10, 0, 5)), {}).ok());
  for (int64_t step : {6, 7, 8, 9}) {
    ASSERT_TRUE(store->Write(step, Images(DenseImage(1, 0, 10, 0, 6)), {}).ok());
  }
  store.reset();

  // 5: the second dense block is gone; 6: an extra dense block; 7: the header is gone;
  // 8: the manifest lists no table; 9: the table's records twice.
  RewriteRecords(Path(5), [](std::vector<RawRecord>& r) { r.erase(r.begin() + 2); });
  RewriteRecords(Path(6), [](std::vector<RawRecord>& r) {
    RawRecord extra = r[1];
    r.insert(r.begin() + 2, extra);
  });
  RewriteRecords(Path(7), [](std::vector<RawRecord>& r) { r.erase(r.begin()); });
  RewriteRecords(Path(8), [](std::vector<RawRecord>& r) {
    SnapshotManifest m;
    ASSERT_TRUE(m.ParseFromString(r.back().payload));
    m.clear_tables();
    r.back().payload = m.SerializeAsString();
  });
  RewriteRecords(Path(9), [](std::vector<RawRecord>& r) {
    std::vector<RawRecord> twice = {r[0], r[1]};
    r.insert(r.begin() + 2, twice.begin(), twice.end());
  });

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  ExpectDataLoss(*store, 5, {"table 1", "missing"});
  ExpectDataLoss(*store, 6, {"table 1"});
  ExpectDataLoss(*store, 7, {});
  ExpectDataLoss(*store, 8, {});
  ExpectDataLoss(*store, 9, {});
}

// A file whose manifest or footer does not verify is damaged: named by Damaged(), never
// listed, never deleted, and the other snapshots are unaffected.
TEST_F(SnapshotStoreTest, DamagedFilesAreNamedButNeitherListedNorDeleted) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::map<int64_t, SnapshotManifest> good;
  for (int64_t step = 1; step <= 10; ++step) {
    SnapshotManifest m = WriteSmall(*store, step);
    if (step == 1 || step == 9) good[step] = m;
  }
  store.reset();

  // 2: a byte of the manifest (its record CRC fails); 3: the end magic; 4: the last 10
  // bytes cut off; 5: all but 10 bytes cut off; 6: the footer points at a block;
  // 7: a manifest that does not parse (valid CRC); 8: step 1's file under step 8's name;
  // 10: empty. And a file that is not named like a snapshot.
  RawSnapshot r2 = MustParse(Path(2));
  FlipByte(Path(2), r2.records.back().payload_offset() + 2, 0x04);
  FlipByte(Path(3), ReadBytes(Path(3)).size() - 1, 0x20);
  std::string b4 = ReadBytes(Path(4));
  WriteBytes(Path(4), b4.substr(0, b4.size() - 10));
  WriteBytes(Path(5), ReadBytes(Path(5)).substr(0, 10));
  {
    std::string b6 = ReadBytes(Path(6));
    RawSnapshot r6 = MustParse(Path(6));
    const uint64_t block_at = r6.records[1].offset;
    std::memcpy(&b6[b6.size() - kFooterBytes], &block_at, 8);
    WriteBytes(Path(6), b6);
  }
  RewriteRecords(Path(7), [](std::vector<RawRecord>& r) { r.back().payload = "\xff\xff\xff\xff"; });
  WriteBytes(Path(8), ReadBytes(Path(1)));
  WriteBytes(Path(10), "");
  const std::string stray = dir_ + "/snapshots/notes.txt";
  WriteBytes(stray, "what happened to step 4");

  const std::vector<int64_t> damaged_steps = {2, 3, 4, 5, 6, 7, 8, 10};
  std::map<std::string, std::string> damaged_bytes;
  for (int64_t step : damaged_steps) damaged_bytes[Path(step)] = ReadBytes(Path(step));
  damaged_bytes[stray] = ReadBytes(stray);
  auto expect_untouched = [&](const std::string& when) {
    for (const auto& [path, bytes] : damaged_bytes) {
      ASSERT_TRUE(fs::exists(path)) << path << " deleted " << when;
      EXPECT_TRUE(ReadBytes(path) == bytes) << path << " changed " << when;
    }
  };
  auto expect_named = [&](const SnapshotStore& s) {
    const std::vector<std::string> damaged = s.Damaged();
    EXPECT_EQ(damaged.size(), damaged_bytes.size()) << ::testing::PrintToString(damaged);
    for (const auto& [path, bytes] : damaged_bytes) {
      int named = 0;
      for (const std::string& d : damaged) named += d.find(path) != std::string::npos;
      EXPECT_EQ(named, 1) << path << " in " << ::testing::PrintToString(damaged);
    }
  };
  auto expect_good_readable = [&](const SnapshotStore& s) {
    for (const auto& [step, m] : good) {
      RebuildVisitor v;
      absl::Status st = s.Read(step, &v);
      EXPECT_TRUE(st.ok()) << step << ": " << st;
      auto image = DenseImage(1, 0, 100, 1, static_cast<uint32_t>(step));
      ASSERT_EQ(v.images.count(1), 1u);
      ExpectSameImage(*image, *v.images[1]);
    }
  };

  {
    auto ro = OpenStore(/*read_only=*/true);
    ASSERT_NE(ro, nullptr);
    EXPECT_THAT(Steps(*ro), ElementsAre(1, 9));
    expect_named(*ro);
  }
  expect_untouched("by a read-only open");

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  expect_untouched("by a read-write open");
  auto list = store->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_TRUE(MessageDifferencer::Equals((*list)[0], good[1]));
  EXPECT_TRUE(MessageDifferencer::Equals((*list)[1], good[9]));
  expect_named(*store);
  expect_good_readable(*store);
  for (int64_t step : {2, 3, 4, 5, 6, 7}) ExpectDataLoss(*store, step, {});
  {
    RebuildVisitor v;
    EXPECT_EQ(store->Read(10, &v).code(), absl::StatusCode::kDataLoss);
  }

  // Retention leaves them alone.
  auto deleted = store->ApplyRetention(1, /*lower_is_better=*/true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(1));
  expect_untouched("by ApplyRetention");
  EXPECT_THAT(Steps(*store), ElementsAre(9));
  deleted = store->RetainOnly({});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(9));
  expect_untouched("by RetainOnly");
  EXPECT_THAT(Steps(*store), IsEmpty());
  expect_named(*store);

  // New snapshots are written beside them.
  good.clear();
  good[11] = WriteSmall(*store, 11);
  EXPECT_THAT(Steps(*store), ElementsAre(11));
  expect_good_readable(*store);
  store.reset();
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  expect_untouched("by a second read-write open");
  EXPECT_THAT(Steps(*store), ElementsAre(11));
}

// The file of step 8 holding a valid snapshot of step 1 (copied, renamed): it is not
// snapshot 8, so reading step 8 must not return step 1's data.
TEST_F(SnapshotStoreTest, FileUnderAnotherStepsNameIsNotRead) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 1);
  WriteBytes(Path(8), ReadBytes(Path(1)));
  EXPECT_THAT(Steps(*store), ElementsAre(1));
  ASSERT_EQ(store->Damaged().size(), 1u);
  EXPECT_THAT(store->Damaged()[0], AllOf(HasSubstr(Path(8)), HasSubstr("step 1")));
  RebuildVisitor v;
  absl::Status s = store->Read(8, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(Path(8)));
  EXPECT_TRUE(v.images.empty()) << "step 1's tables were read as step 8's";
}

TEST_F(SnapshotStoreTest, UnknownStepIsNotFound) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  EXPECT_EQ(store->Read(3, &v).code(), absl::StatusCode::kNotFound);
  WriteSmall(*store, 2);
  absl::Status s = store->Read(3, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("step 3"));
  EXPECT_TRUE(v.images.empty());
}

TEST_F(SnapshotStoreTest, OtherFormatVersionIsFailedPrecondition) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  WriteSmall(*store, 8);
  store.reset();

  RewriteRecords(Path(8), [](std::vector<RawRecord>& r) {
    SnapshotManifest m;
    ASSERT_TRUE(m.ParseFromString(r.back().payload));
    EXPECT_EQ(m.format_version(), kSnapshotFormatVersion);
    m.set_format_version(kSnapshotFormatVersion + 41);
    r.back().payload = m.SerializeAsString();
  });
  const std::string bytes = ReadBytes(Path(8));

  store = OpenStore();
  ASSERT_NE(store, nullptr);
  RebuildVisitor v;
  absl::Status s = store->Read(8, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr(absl::StrCat("format version ", kSnapshotFormatVersion + 41)),
                    HasSubstr(Path(8))));
  EXPECT_TRUE(v.images.empty());
  // Not restorable here, so not listed; named, and kept for a server that reads it.
  EXPECT_THAT(Steps(*store), IsEmpty());
  ASSERT_EQ(store->Damaged().size(), 1u);
  EXPECT_THAT(store->Damaged()[0], HasSubstr(Path(8)));
  WriteSmall(*store, 9);
  WriteSmall(*store, 10);
  auto deleted = store->ApplyRetention(1, true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(9));
  deleted = store->RetainOnly({});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(10));
  EXPECT_EQ(ReadBytes(Path(8)), bytes);
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

  for (int64_t step : {1, 3}) EXPECT_FALSE(fs::exists(Path(step))) << step;
  for (int64_t step : {2, 4, 5}) EXPECT_TRUE(fs::exists(Path(step))) << step;
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
  for (int64_t step : {1, 2, 3}) EXPECT_FALSE(fs::exists(Path(step))) << step;
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
  EXPECT_FALSE(fs::exists(Path(1)));
  EXPECT_TRUE(fs::exists(Path(2)));
}

TEST_F(SnapshotStoreTest, OpenFailsCleanlyWhereNoDirectoryCanBeMade) {
  const std::string file = tmp_ + "/regular_file";
  { std::ofstream(file) << "not a directory"; }
  auto store = SnapshotStore::Open(file + "/db");
  EXPECT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(file));
  auto ro = SnapshotStore::Open(file + "/db", /*read_only=*/true);
  EXPECT_FALSE(ro.ok());
  EXPECT_THAT(std::string(ro.status().message()), HasSubstr(file));
  auto missing = SnapshotStore::Open(tmp_ + "/does/not/exist", /*read_only=*/true);
  EXPECT_FALSE(missing.ok());
  EXPECT_FALSE(fs::exists(tmp_ + "/does"));
  EXPECT_EQ(ReadBytes(file), "not a directory");
}

TEST_F(SnapshotStoreTest, ReadOnlyOpenCreatesNothing) {
  ASSERT_TRUE(fs::create_directories(dir_));
  auto ro = OpenStore(/*read_only=*/true);
  ASSERT_NE(ro, nullptr);
  EXPECT_THAT(Steps(*ro), IsEmpty());
  EXPECT_THAT(ro->Damaged(), IsEmpty());
  RebuildVisitor v;
  EXPECT_EQ(ro->Read(1, &v).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(fs::is_empty(dir_));
}

// "Read-only: touches nothing" (file_snapshot_store.h): a store opened to read another
// shard's snapshots must not write or delete any.
TEST_F(SnapshotStoreTest, ReadOnlyStoreNeitherWritesNorDeletes) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    WriteSmall(*store, 1);
    WriteSmall(*store, 2);
  }
  const auto before = DirContents(dir_);
  auto ro = OpenStore(/*read_only=*/true);
  ASSERT_NE(ro, nullptr);
  auto m = ro->Write(3, Images(DenseImage(1, 0, 10, 0, 3)), {});
  EXPECT_FALSE(m.ok()) << "a read-only store wrote step 3";
  EXPECT_FALSE(ro->Delete(1).ok()) << "a read-only store deleted step 1";
  auto deleted = ro->ApplyRetention(1, true);
  EXPECT_TRUE(!deleted.ok() || deleted->empty()) << "a read-only store applied retention";
  EXPECT_TRUE(DirContents(dir_) == before);
  EXPECT_THAT(Steps(*ro), ElementsAre(1, 2));
}

// ---------------------------------------------------------------------------------------
// Snapshots of the older RocksDB layout.

TEST_F(SnapshotStoreTest, OldLayoutIsListedReadAndNeverDeleted) {
  std::vector<std::unique_ptr<TableImage>> images10;
  images10.push_back(SparseImage(9, kSparseBlockRows + 5, 3, 1, 41));
  images10.push_back(DenseImage(4, 300, kDenseBlockValues * 2 + 7, 1, 42));
  LegacyOptions flushed;
  flushed.has_metric = true;
  flushed.metric = 0.5;
  const SnapshotManifest m10 = PutLegacySnapshot(dir_, 10, images10, flushed);
  // A partial snapshot of the old writer (no manifest): never visible.
  LegacyOptions partial;
  partial.write_manifest = false;
  PutLegacySnapshot(dir_, 25, Images(DenseImage(1, 0, 10, 0, 43)), partial);
  // The last one only in the write-ahead log.
  LegacyOptions in_wal;
  in_wal.flush = false;
  auto images20 = Images(DenseImage(1, 0, 1000, 2, 44));
  const SnapshotManifest m20 = PutLegacySnapshot(dir_, 20, images20, in_wal);
  ASSERT_TRUE(fs::exists(dir_ + "/CURRENT"));
  const auto before = DirContents(dir_);
  const std::vector<std::string> keys_before = LegacyKeys(dir_);

  auto check_old = [&](const SnapshotStore& s) {
    RebuildVisitor v;
    absl::Status st = s.Read(10, &v);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_THAT(v.order, ElementsAre(4u, 9u));
    ASSERT_EQ(v.images.count(4), 1u);
    ASSERT_EQ(v.images.count(9), 1u);
    ExpectSameImage(*images10[1], *v.images[4]);
    ExpectSameImage(*images10[0], *v.images[9]);
    ASSERT_EQ(v.dense_calls[4].size(), 3u);
    EXPECT_EQ(v.dense_calls[4][2].begin, 300 + 2 * kDenseBlockValues);
    EXPECT_EQ(v.dense_calls[4][2].n, 7u);
    RebuildVisitor v20;
    st = s.Read(20, &v20);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(v20.images.count(1), 1u);
    ExpectSameImage(*images20[0], *v20.images[1]);
    RebuildVisitor v25;
    EXPECT_EQ(s.Read(25, &v25).code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(v25.images.empty());
  };

  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  {
    auto list = store->List();
    ASSERT_TRUE(list.ok()) << list.status();
    ASSERT_EQ(list->size(), 2u);
    EXPECT_TRUE(MessageDifferencer::Equals((*list)[0], m10));
    EXPECT_TRUE(MessageDifferencer::Equals((*list)[1], m20));
    EXPECT_EQ((*list)[0].format_version(), kRocksDbSnapshotFormatVersion);
  }
  EXPECT_THAT(store->Damaged(), IsEmpty());
  check_old(*store);

  // New snapshots beside them, listed in one ascending order.
  auto images15 = Images(SparseImage(2, 50, 2, 0, 45));
  ASSERT_TRUE(store->Write(15, images15, {}).ok());
  WriteSmall(*store, 30);
  EXPECT_TRUE(fs::exists(Path(15)));
  EXPECT_THAT(Steps(*store), ElementsAre(10, 15, 20, 30));
  {
    RebuildVisitor v;
    ASSERT_TRUE(store->Read(15, &v).ok());
    ExpectSameImage(*images15[0], *v.images[2]);
  }
  {
    auto ro = OpenStore(/*read_only=*/true);
    ASSERT_NE(ro, nullptr);
    EXPECT_THAT(Steps(*ro), ElementsAre(10, 15, 20, 30));
    check_old(*ro);
  }

  // Retention counts and deletes only the new ones; the old ones stay readable.
  auto deleted = store->ApplyRetention(1, /*lower_is_better=*/true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(15));
  EXPECT_THAT(Steps(*store), ElementsAre(10, 20, 30));
  deleted = store->RetainOnly({});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre(30));
  EXPECT_THAT(Steps(*store), ElementsAre(10, 20));
  deleted = store->RetainOnly({});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, IsEmpty());
  check_old(*store);
  store.reset();

  // Reopened (read-write again), all the same.
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Steps(*store), ElementsAre(10, 20));
  check_old(*store);
  store.reset();

  ExpectNothingRemovedOrChanged(before, DirContents(dir_));
  EXPECT_EQ(LegacyKeys(dir_), keys_before);
}

TEST_F(SnapshotStoreTest, OldLayoutStoreRefusesWrites) {
  PutLegacySnapshot(dir_, 10, Images(DenseImage(1, 0, 100, 0, 1)));
  const auto before = DirContents(dir_);
  auto old = RocksDbSnapshotStore::OpenReadOnly(dir_);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_THAT(Steps(**old), ElementsAre(10));
  auto m = (*old)->Write(11, Images(DenseImage(1, 0, 100, 0, 1)), {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(dir_));
  absl::Status s = (*old)->Delete(10);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("step 10"), HasSubstr(dir_)));
  auto deleted = (*old)->ApplyRetention(0, true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, IsEmpty());
  deleted = (*old)->RetainOnly({});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, IsEmpty());
  EXPECT_THAT(Steps(**old), ElementsAre(10));
  old->reset();
  ExpectNothingRemovedOrChanged(before, DirContents(dir_));
}

// Delete of a step that is in the old layout cannot make it invisible: it must say so
// rather than succeed with the snapshot still listed.
TEST_F(SnapshotStoreTest, DeleteOfAnOldLayoutSnapshotIsRefused) {
  PutLegacySnapshot(dir_, 10, Images(DenseImage(1, 0, 100, 0, 1)));
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  absl::Status s = store->Delete(10);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Steps(*store), ElementsAre(10));
}

// Resharding reads another shard's directory read-only, which may hold only the old layout
// (no snapshots/ yet: nothing has opened it read-write since the upgrade).
TEST_F(SnapshotStoreTest, ReadOnlyOpenListsOldLayoutWithoutNewSnapshots) {
  auto images = Images(DenseImage(1, 0, 100, 1, 1));
  const SnapshotManifest m = PutLegacySnapshot(dir_, 10, images);
  ASSERT_FALSE(fs::exists(dir_ + "/snapshots"));
  auto ro = OpenStore(/*read_only=*/true);
  ASSERT_NE(ro, nullptr);
  auto list = ro->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u) << "the old layout's snapshots are not listed";
  EXPECT_TRUE(MessageDifferencer::Equals((*list)[0], m));
  RebuildVisitor v;
  ASSERT_TRUE(ro->Read(10, &v).ok());
  ExpectSameImage(*images[0], *v.images[1]);
  EXPECT_FALSE(fs::exists(dir_ + "/snapshots"));
  EXPECT_FALSE(fs::exists(dir_ + "/staging"));
}

TEST_F(SnapshotStoreTest, OldLayoutDataLossIsDetected) {
  LegacyOptions bad_crc;
  bad_crc.crc_xor = 0x10;
  PutLegacySnapshot(dir_, 10, Images(DenseImage(1, 0, kDenseBlockValues + 3, 1, 1)), bad_crc);
  LegacyOptions short_block;
  short_block.shrink_first_block = true;
  PutLegacySnapshot(dir_, 11, Images(SparseImage(2, 10, 2, 1, 2)), short_block);
  PutLegacySnapshot(dir_, 12, Images(DenseImage(3, 0, 10, 0, 3)), short_block);
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Steps(*store), ElementsAre(10, 11, 12));
  for (const auto& [step, what] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {10, {"checksum mismatch", "table 1"}},
           {11, {"wrong size", "table 2"}},
           {12, {"wrong size", "table 3"}}}) {
    RebuildVisitor v;
    absl::Status s = store->Read(step, &v);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << step << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(dir_)) << step;
    for (const std::string& w : what) EXPECT_THAT(std::string(s.message()), HasSubstr(w)) << step;
  }
  auto deleted = store->RetainOnly({});
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, IsEmpty());
}

// A damaged old database (its write-ahead log or a table file): whatever opening it does,
// nothing in the directory is removed or changed, new snapshots included.
TEST_F(SnapshotStoreTest, DamagedOldLayoutDeletesNothing) {
  for (const std::string kind : {".log", ".sst"}) {
    SCOPED_TRACE(kind);
    const std::string dir = tmp_ + "/damaged" + kind;
    PutLegacySnapshot(dir, 10, Images(DenseImage(1, 0, 5000, 1, 1)));
    LegacyOptions in_wal;
    in_wal.flush = false;
    PutLegacySnapshot(dir, 20, Images(DenseImage(1, 0, 5000, 1, 2)), in_wal);
    {
      auto store = SnapshotStore::Open(dir);
      ASSERT_TRUE(store.ok()) << store.status();
      WriteSmall(**store, 30);
      EXPECT_THAT(Steps(**store), ElementsAre(10, 20, 30));
    }
    // Flip a byte in the middle of the largest such file.
    std::string victim;
    uintmax_t largest = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == kind && e.file_size() > largest) {
        largest = e.file_size();
        victim = e.path().string();
      }
    }
    ASSERT_FALSE(victim.empty()) << "no " << kind << " file in " << dir;
    FlipByte(victim, largest / 2, 0x5a);
    const auto before = DirContents(dir);

    for (bool read_only : {true, false}) {
      // The damaged older store is named and does not block the new snapshots.
      auto store = SnapshotStore::Open(dir, read_only);
      ASSERT_TRUE(store.ok()) << store.status();
      std::vector<std::string> damaged = (*store)->Damaged();
      ASSERT_EQ(damaged.size(), 1u) << kind;
      EXPECT_THAT(damaged[0], HasSubstr(dir));
      auto list = (*store)->List();
      ASSERT_TRUE(list.ok()) << list.status();
      EXPECT_THAT(Steps(**store), ::testing::Contains(30));
      if (list.ok()) {
        for (const SnapshotManifest& m : *list) {
          RebuildVisitor v;
          (*store)->Read(m.step(), &v).IgnoreError();
        }
      }
      if (!read_only) {
        auto deleted = (*store)->ApplyRetention(10, true);
        if (deleted.ok()) {
          EXPECT_THAT(*deleted, IsEmpty());
        }
      }
    }
    ExpectNothingRemovedOrChanged(before, DirContents(dir));
    EXPECT_TRUE(fs::exists(PsnapPath(dir, 30)));
  }
}

}  // namespace
}  // namespace pscluster::ps
