#include "server/ps/table/disk_tier.h"

#include <sys/statvfs.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace pscluster::ps {
namespace {

// Written into the directory the tier owns: only such a directory (or an empty or new one)
// is wiped at open, never one an operator pointed at by mistake.
constexpr char kMarker[] = "PSCLUSTER_DISK_TIER";
constexpr size_t kHeaderBytes = 24;  // updates, step, version
// MultiGet in pieces: its key and value arrays stay small for a pull of millions of ids.
constexpr size_t kGetChunk = 4096;

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat("disk tier: ", what, ": ", s.ToString());
  if (s.IsIncomplete()) {  // no_slowdown: RocksDB would stall the write
    return absl::UnavailableError(msg + " (its compactions are behind; try again shortly)");
  }
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg + " (free disk space)");
  if (s.IsCorruption()) return absl::DataLossError(msg);
  return absl::InternalError(msg);
}

void EncodeKey(uint64_t key, char out[8]) {
  // Big-endian: RocksDB's byte order is the ids' order, so ForEach runs in key order.
  for (int i = 7; i >= 0; --i, key >>= 8) out[i] = static_cast<char>(key & 0xff);
}

uint64_t DecodeKey(const char* in) {
  uint64_t key = 0;
  for (int i = 0; i < 8; ++i) key = key << 8 | static_cast<unsigned char>(in[i]);
  return key;
}

bool DecodeRow(const rocksdb::Slice& value, size_t width, ColdRows::Row* row) {
  if (value.size() != kHeaderBytes + width * sizeof(float)) return false;
  std::memcpy(&row->updates, value.data(), 8);
  std::memcpy(&row->step, value.data() + 8, 8);
  std::memcpy(&row->version, value.data() + 16, 8);
  row->floats = value.data() + kHeaderBytes;
  return true;
}

absl::Status PrepareDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec) && !fs::exists(fs::path(dir) / kMarker, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: ", dir, " holds files that are not a disk tier's (no ", kMarker,
                     "); give --sparse_tier_dir an empty or new directory"));
  }
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("disk tier: creating ", dir, ": ", ec.message()));
  std::ofstream(fs::path(dir) / kMarker) << "the disk tier of a ps_server; wiped at its start\n";
  return absl::OkStatus();
}

// Sized from the reserve so that the memtables waiting for a flush and the largest
// compaction's output fit in it together (see the header).
rocksdb::Options TierOptions(uint64_t reserve) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kNoCompression;  // float rows barely compress
  o.write_buffer_size = std::max<uint64_t>(reserve / 8, 64 << 10);
  o.max_write_buffer_number = 2;
  o.level0_file_num_compaction_trigger = 2;
  o.target_file_size_base = std::max<uint64_t>(reserve / 16, 64 << 10);
  o.max_bytes_for_level_base = std::max<uint64_t>(reserve / 4, 256 << 10);
  o.max_compaction_bytes = o.max_bytes_for_level_base;
  o.max_background_flushes = 1;
  o.max_background_compactions = 1;
  o.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  o.keep_log_file_num = 1;
  // Most ids a push looks up on disk are not there (new rows): a Bloom filter over the
  // memtable answers them without a search of its skip list.
  o.memtable_prefix_bloom_size_ratio = 0.02;
  o.memtable_whole_key_filtering = true;
  // Reads stay preads, not mapped files: an I/O error under a mapping is a SIGBUS that
  // takes the shard down, and mapped pages of a table larger than RAM fill the RSS.
  rocksdb::BlockBasedTableOptions table;
  // Pulls of ids that were never stored ask the disk too: a Bloom filter answers them
  // without reading a block.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return o;
}

rocksdb::WriteOptions TierWrites() {
  rocksdb::WriteOptions w;
  w.disableWAL = true;   // nothing here must survive a restart
  w.no_slowdown = true;  // a stall is an error to retry, not an unbounded wait
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("disk tier: no directory (ps_server --sparse_tier_dir)");
  }
  if (auto s = PrepareDirectory(options.dir); !s.ok()) return s;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(TierOptions(options.reserve_bytes), options.dir, &db);
  if (!s.ok()) return FromRocks(s, "opening " + options.dir);
  return std::unique_ptr<DiskTier>(new DiskTier(options, std::unique_ptr<rocksdb::DB>(db)));
}

DiskTier::DiskTier(DiskTierOptions options, std::unique_ptr<rocksdb::DB> db)
    : options_(std::move(options)), db_(std::move(db)) {}

DiskTier::~DiskTier() = default;

absl::StatusOr<std::unique_ptr<ColdRows>> DiskTier::NewTable(uint32_t table_id, size_t width) {
  // Creating a column family writes the MANIFEST and an OPTIONS file.
  if (auto s = CheckRoom(64 << 10); !s.ok()) return s;
  rocksdb::ColumnFamilyHandle* family = nullptr;
  const std::string name = absl::StrCat("table-", table_id, "-", next_family_++);
  rocksdb::Status s = db_->CreateColumnFamily(TierOptions(options_.reserve_bytes), name, &family);
  if (!s.ok()) return FromRocks(s, "creating the column family " + name);
  return std::unique_ptr<ColdRows>(new ColdRows(this, family, width));
}

absl::Status DiskTier::CheckRoom(uint64_t bytes) const {
  struct statvfs fs {};
  if (statvfs(options_.dir.c_str(), &fs) != 0) {
    return absl::UnavailableError(absl::StrCat("disk tier: cannot read the free space of ",
                                               options_.dir, ": ", std::strerror(errno)));
  }
  const uint64_t free = uint64_t{fs.f_bavail} * fs.f_frsize;
  if (free >= options_.reserve_bytes && free - options_.reserve_bytes >= bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "disk tier: ", options_.dir, " has ", free, " bytes free; writing ", bytes,
      " more would leave less than the reserve of ", options_.reserve_bytes,
      " (ps_server --sparse_tier_reserve_bytes). Free disk space there, or give the shard more "
      "RAM for rows (--sparse_memory_bytes)"));
}

ColdRows::Batch::Batch(const ColdRows& rows)
    : rows_(rows), batch_(std::make_unique<rocksdb::WriteBatch>()) {}
ColdRows::Batch::~Batch() = default;

void ColdRows::Batch::Put(uint64_t key, const Row& row) {
  const size_t width = rows_.width_;
  char k[8];
  EncodeKey(key, k);
  std::string value(kHeaderBytes + width * sizeof(float), '\0');
  std::memcpy(value.data(), &row.updates, 8);
  std::memcpy(value.data() + 8, &row.step, 8);
  std::memcpy(value.data() + 16, &row.version, 8);
  std::memcpy(value.data() + kHeaderBytes, row.floats, width * sizeof(float));
  batch_->Put(rows_.family_, rocksdb::Slice(k, 8), value);
  ++puts_;
}

void ColdRows::Batch::Delete(uint64_t key) {
  char k[8];
  EncodeKey(key, k);
  batch_->Delete(rows_.family_, rocksdb::Slice(k, 8));
  ++deletes_;
}

ColdRows::ColdRows(DiskTier* tier, rocksdb::ColumnFamilyHandle* family, size_t width)
    : tier_(tier), family_(family), width_(width) {}

ColdRows::~ColdRows() {
  rocksdb::DB* db = tier_->db();
  // Dropping writes the MANIFEST: without room the family stays until the tier is wiped.
  if (tier_->CheckRoom(64 << 10).ok()) {
    if (rocksdb::Status s = db->DropColumnFamily(family_); !s.ok()) {
      LogWarning("disk tier: dropping a table's rows: %s", s.ToString().c_str());
    }
  }
  db->DestroyColumnFamilyHandle(family_);
}

uint64_t ColdRows::bytes() const {
  uint64_t bytes = 0;
  tier_->db()->GetIntProperty(family_, "rocksdb.total-sst-files-size", &bytes);
  return bytes;
}

absl::Status ColdRows::Get(absl::Span<const uint64_t> keys,
                           const std::function<void(size_t, const Row&)>& fn) const {
  // Sized for the call: Contains and a restore's row-by-row look-ups ask for one key.
  const size_t chunk = std::min(kGetChunk, keys.size());
  std::vector<char> encoded(chunk * 8);
  std::vector<rocksdb::Slice> slices(chunk);
  std::vector<rocksdb::PinnableSlice> values(chunk);
  std::vector<rocksdb::Status> statuses(chunk);
  for (size_t at = 0; at < keys.size(); at += chunk) {
    const size_t n = std::min(chunk, keys.size() - at);
    for (size_t i = 0; i < n; ++i) {
      EncodeKey(keys[at + i], &encoded[i * 8]);
      slices[i] = rocksdb::Slice(&encoded[i * 8], 8);
      values[i].Reset();
    }
    tier_->db()->MultiGet(rocksdb::ReadOptions(), family_, n, slices.data(), values.data(),
                          statuses.data());
    for (size_t i = 0; i < n; ++i) {
      if (statuses[i].IsNotFound()) continue;
      if (!statuses[i].ok()) return FromRocks(statuses[i], "reading rows");
      Row row;
      if (!DecodeRow(values[i], width_, &row)) {
        return absl::DataLossError(absl::StrCat("disk tier: the row of key ", keys[at + i], " has ",
                                                values[i].size(), " bytes"));
      }
      fn(at + i, row);
    }
  }
  return absl::OkStatus();
}

bool ColdRows::Contains(uint64_t key) const {
  bool found = false;
  (void)Get(absl::MakeConstSpan(&key, 1), [&](size_t, const Row&) { found = true; });
  return found;
}

absl::Status ColdRows::Commit(Batch& batch) {
  if (batch.puts_ + batch.deletes_ == 0) return absl::OkStatus();
  if (auto s = tier_->CheckRoom(batch.batch_->GetDataSize()); !s.ok()) return s;
  if (auto s = tier_->db()->Write(TierWrites(), batch.batch_.get()); !s.ok()) {
    return FromRocks(s, "writing rows");
  }
  size_ += batch.puts_;
  size_ -= batch.deletes_;
  return absl::OkStatus();
}

absl::Status ColdRows::ForEach(const std::function<void(uint64_t, const Row&)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(tier_->db()->NewIterator(rocksdb::ReadOptions(), family_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    Row row;
    if (it->key().size() != 8 || !DecodeRow(it->value(), width_, &row)) {
      return absl::DataLossError("disk tier: a row of unexpected size");
    }
    fn(DecodeKey(it->key().data()), row);
  }
  return FromRocks(it->status(), "reading every row");
}

}  // namespace pscluster::ps
