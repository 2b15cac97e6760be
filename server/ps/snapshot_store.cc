#include "server/ps/snapshot_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "rocksdb/db.h"
#include "rocksdb/sst_file_writer.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;

// The one adapter from rocksdb::Status.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg + " (free disk space)");
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  if (s.IsIOError()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

std::string StepPrefix(int64_t step) { return absl::StrFormat("snap/%020d/", step); }
std::string ManifestKey(int64_t step) { return absl::StrFormat("manifest/%020d", step); }
std::string TablePrefix(int64_t step, uint32_t table) {
  return StepPrefix(step) + absl::StrFormat("t/%010u/", table);
}
std::string BlockKey(int64_t step, uint32_t table, uint64_t block) {
  return TablePrefix(step, table) + absl::StrFormat("x/%012u", block);
}

bool StartsWith(const rocksdb::Slice& s, const std::string& prefix) {
  return s.size() >= prefix.size() && std::memcmp(s.data(), prefix.data(), prefix.size()) == 0;
}

rocksdb::Options DbOptions() {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kNoCompression;  // float parameters do not compress
  o.max_open_files = 256;
  return o;
}

// Serialises one table's blocks, in key order, to `emit(key, bytes)`.
template <typename Emit>
absl::Status EmitBlocks(int64_t step, const TableImage& image, Emit emit) {
  const TableSnapshotHeader& h = image.header;
  const uint32_t id = h.spec().table_id();
  std::string buf;
  if (h.spec().kind() == TableSpec::DENSE) {
    const uint64_t size = h.shard_end() - h.shard_begin();
    for (uint64_t b = 0, at = 0; at < size; ++b, at += kDenseBlockValues) {
      const uint64_t n = std::min(kDenseBlockValues, size - at);
      buf.resize(n * sizeof(float) * image.arrays.size());
      char* out = buf.data();
      for (const auto& a : image.arrays) {
        std::memcpy(out, a.data() + at, n * sizeof(float));
        out += n * sizeof(float);
      }
      if (absl::Status s = emit(BlockKey(step, id, b), buf); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  const uint64_t rows = image.keys.size();
  const uint64_t row_len = h.spec().dim() * (1 + h.num_slots());
  for (uint64_t b = 0, at = 0; at < rows; ++b, at += kSparseBlockRows) {
    const uint64_t n = std::min(kSparseBlockRows, rows - at);
    buf.resize(n * (16 + row_len * sizeof(float)));
    char* out = buf.data();
    std::memcpy(out, image.keys.data() + at, n * 8);
    std::memcpy(out + n * 8, image.row_updates.data() + at, n * 8);
    std::memcpy(out + n * 16, image.row_data.data() + at * row_len, n * row_len * sizeof(float));
    if (absl::Status s = emit(BlockKey(step, id, b), buf); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SnapshotStore>> SnapshotStore::Open(const std::string& dir,
                                                                   bool read_only) {
  rocksdb::DB* db = nullptr;
  rocksdb::Status s;
  if (read_only) {
    s = rocksdb::DB::OpenForReadOnly(DbOptions(), dir, &db);
  } else {
    std::error_code ec;
    fs::create_directories(fs::path(dir) / "staging", ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create snapshot directory ", dir, ": ", ec.message()));
    }
    s = rocksdb::DB::Open(DbOptions(), dir, &db);
  }
  if (!s.ok()) return FromRocks(s, absl::StrCat("opening snapshot database ", dir));
  std::unique_ptr<SnapshotStore> store(new SnapshotStore(dir, db));
  if (!read_only) {
    if (absl::Status st = store->RemovePartial(); !st.ok()) return st;
  }
  return store;
}

SnapshotStore::SnapshotStore(std::string dir, rocksdb::DB* db) : dir_(std::move(dir)), db_(db) {}

SnapshotStore::~SnapshotStore() = default;

absl::Status SnapshotStore::RemovePartial() {
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(fs::path(dir_) / "staging", ec)) {
    fs::remove(f.path(), ec);
  }
  std::vector<int64_t> partial;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("snap/"); it->Valid() && StartsWith(it->key(), "snap/");) {
    int64_t step = std::stoll(it->key().ToString().substr(5, 20));
    std::string manifest;
    if (db_->Get(rocksdb::ReadOptions(), ManifestKey(step), &manifest).IsNotFound()) {
      partial.push_back(step);
    }
    it->Seek(StepPrefix(step + 1));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scanning snapshots");
  for (int64_t step : partial) {
    std::fprintf(stderr, "snapshot store %s: removing partial snapshot of step %lld\n",
                 dir_.c_str(), static_cast<long long>(step));
    if (absl::Status s = Delete(step); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<SnapshotManifest> SnapshotStore::Write(
    int64_t step, const std::vector<std::unique_ptr<TableImage>>& images,
    const WriteOptions& options) {
  SnapshotManifest manifest;
  manifest.set_format_version(kSnapshotFormatVersion);
  manifest.set_step(step);
  manifest.set_shard_id(options.shard_id);
  manifest.set_num_shards(options.num_shards);
  manifest.set_has_metric(options.has_metric);
  manifest.set_metric(options.metric);
  manifest.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));

  // Refuse up front when the disk cannot hold it: Debian's RocksDB is built with
  // assertions, and an SST writer that hits ENOSPC aborts the process when destroyed.
  uint64_t needed = 0;
  for (const auto& i : images) needed += i->bytes();
  needed += needed / 16 + (uint64_t{16} << 20);
  std::error_code ec;
  const fs::space_info space = fs::space(dir_, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot stat ", dir_, ": ", ec.message()));
  if (space.available < needed) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "snapshot of step %d needs about %.1f MB in %s but %.1f MB are available; free disk "
        "space or keep fewer snapshots (--snapshot_keep_last)",
        step, needed / 1e6, dir_, space.available / 1e6));
  }
  const std::string sst = (fs::path(dir_) / "staging" / absl::StrCat(step, ".sst")).string();
  rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), DbOptions());
  // No tables, no file: an opened writer that is never finished leaves it in staging.
  absl::Status s =
      images.empty() ? absl::OkStatus() : FromRocks(writer.Open(sst), "opening " + sst);
  uint64_t total = 0;
  std::vector<const TableImage*> sorted;
  for (const auto& i : images) sorted.push_back(i.get());
  std::sort(sorted.begin(), sorted.end(), [](const TableImage* a, const TableImage* b) {
    return a->header.spec().table_id() < b->header.spec().table_id();
  });
  for (const TableImage* image : sorted) {
    if (!s.ok()) break;
    const uint32_t id = image->header.spec().table_id();
    std::string header = image->header.SerializeAsString();
    uint32_t crc = crc32c::Value(header.data(), header.size());
    uint64_t bytes = header.size();
    s = FromRocks(writer.Put(TablePrefix(step, id) + "h", header), "writing " + sst);
    if (!s.ok()) break;
    s = EmitBlocks(step, *image, [&](const std::string& key, const std::string& value) {
      crc = crc32c::Extend(crc, value.data(), value.size());
      bytes += value.size();
      if (options.bytes_written) *options.bytes_written += value.size();
      if (options.test_delay_per_block > absl::ZeroDuration()) {
        std::this_thread::sleep_for(absl::ToChronoMicroseconds(options.test_delay_per_block));
      }
      return FromRocks(writer.Put(key, value), "writing " + sst);
    });
    TableChecksum* c = manifest.add_tables();
    c->set_table_id(id);
    c->set_crc32c(crc);
    c->set_bytes(bytes);
    total += bytes;
  }
  manifest.set_bytes(total);
  if (s.ok() && !sorted.empty()) s = FromRocks(writer.Finish(), "finishing " + sst);  // fsyncs
  if (s.ok() && !sorted.empty()) {
    rocksdb::IngestExternalFileOptions ingest;
    ingest.move_files = true;
    s = FromRocks(db_->IngestExternalFile({sst}, ingest), "ingesting " + sst);
  }
  if (s.ok()) {
    rocksdb::WriteOptions sync;
    sync.sync = true;
    s = FromRocks(db_->Put(sync, ManifestKey(step), manifest.SerializeAsString()),
                  "writing the manifest");
  }
  if (!s.ok()) {
    std::error_code ec;
    fs::remove(sst, ec);
    Delete(step).IgnoreError();  // best effort; Open() retries the cleanup
    return s;
  }
  return manifest;
}

absl::StatusOr<std::vector<SnapshotManifest>> SnapshotStore::List() const {
  std::vector<SnapshotManifest> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("manifest/"); it->Valid() && StartsWith(it->key(), "manifest/"); it->Next()) {
    SnapshotManifest m;
    if (!m.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(
          absl::StrCat("unreadable manifest ", it->key().ToString(), " in ", dir_));
    }
    out.push_back(std::move(m));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "listing snapshots");
  return out;
}

absl::Status SnapshotStore::Delete(int64_t step) {
  rocksdb::WriteOptions sync;
  sync.sync = true;
  if (absl::Status s = FromRocks(db_->Delete(sync, ManifestKey(step)), "deleting a manifest");
      !s.ok()) {
    return s;
  }
  std::string begin = StepPrefix(step), end = StepPrefix(step + 1);
  if (absl::Status s = FromRocks(
          db_->DeleteRange(rocksdb::WriteOptions(), db_->DefaultColumnFamily(), begin, end),
          "deleting snapshot data");
      !s.ok()) {
    return s;
  }
  rocksdb::Slice b(begin), e(end);
  return FromRocks(db_->CompactRange(rocksdb::CompactRangeOptions(), &b, &e), "reclaiming space");
}

absl::StatusOr<std::vector<int64_t>> SnapshotStore::ApplyRetention(int keep_last,
                                                                   bool lower_is_better) {
  auto list = List();
  if (!list.ok()) return list.status();
  const SnapshotManifest* best = nullptr;
  for (const auto& m : *list) {
    if (!m.has_metric()) continue;
    if (!best || (lower_is_better ? m.metric() <= best->metric() : m.metric() >= best->metric())) {
      best = &m;
    }
  }
  std::vector<int64_t> deleted;
  for (size_t i = 0; i + keep_last < list->size(); ++i) {
    const SnapshotManifest& m = (*list)[i];
    if (best && m.step() == best->step()) continue;
    if (absl::Status s = Delete(m.step()); !s.ok()) return s;
    deleted.push_back(m.step());
  }
  return deleted;
}

absl::StatusOr<std::vector<int64_t>> SnapshotStore::RetainOnly(const std::vector<int64_t>& keep) {
  auto list = List();
  if (!list.ok()) return list.status();
  std::vector<int64_t> deleted;
  for (const SnapshotManifest& m : *list) {
    if (std::find(keep.begin(), keep.end(), m.step()) != keep.end()) continue;
    if (absl::Status s = Delete(m.step()); !s.ok()) return s;
    deleted.push_back(m.step());
  }
  return deleted;
}

absl::Status SnapshotStore::Read(int64_t step, Visitor* visitor) const {
  std::string raw;
  rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), ManifestKey(step), &raw);
  if (rs.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("no complete snapshot of step ", step, " in ", dir_));
  }
  if (!rs.ok()) return FromRocks(rs, "reading a manifest");
  SnapshotManifest manifest;
  if (!manifest.ParseFromString(raw)) return absl::DataLossError("unreadable manifest in " + dir_);
  if (manifest.format_version() != kSnapshotFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot ", step, " in ", dir_, " has format version ", manifest.format_version(),
        "; this ps_server reads version ", kSnapshotFormatVersion));
  }
  auto corrupt = [&](uint32_t table, absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("snapshot ", step, " in ", dir_, ", table ", table, ": ", what));
  };
  for (const TableChecksum& expected : manifest.tables()) {
    const uint32_t id = expected.table_id();
    const std::string prefix = TablePrefix(step, id);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    it->Seek(prefix + "h");
    TableSnapshotHeader h;
    if (!it->Valid() || it->key() != prefix + "h" ||
        !h.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return corrupt(id, "header missing or unreadable");
    }
    uint32_t crc = crc32c::Value(it->value().data(), it->value().size());
    if (absl::Status s = visitor->Header(h); !s.ok()) return s;
    const bool dense = h.spec().kind() == TableSpec::DENSE;
    const uint64_t arrays = 1 + h.num_slots();
    const uint64_t row_len = h.spec().dim() * arrays;
    uint64_t at = 0;  // dense: values read so far
    for (it->Next(); it->Valid() && StartsWith(it->key(), prefix); it->Next()) {
      const rocksdb::Slice v = it->value();
      crc = crc32c::Extend(crc, v.data(), v.size());
      // Copy: RocksDB does not promise float alignment of value bytes.
      std::vector<char> block(v.data(), v.data() + v.size());
      absl::Status s;
      if (dense) {
        const uint64_t n = std::min(kDenseBlockValues, h.shard_end() - h.shard_begin() - at);
        if (v.size() != n * arrays * sizeof(float))
          return corrupt(id, "dense block of the wrong size");
        s = visitor->DenseBlock(h, h.shard_begin() + at, n,
                                reinterpret_cast<const float*>(block.data()));
        at += n;
      } else {
        const uint64_t row_bytes = 16 + row_len * sizeof(float);
        if (v.size() % row_bytes != 0) return corrupt(id, "sparse block of the wrong size");
        const uint64_t n = v.size() / row_bytes;
        const char* p = block.data();
        for (uint64_t r = 0; r < n && s.ok(); ++r) {
          uint64_t key;
          int64_t updates;
          std::memcpy(&key, p + r * 8, 8);
          std::memcpy(&updates, p + n * 8 + r * 8, 8);
          s = visitor->SparseRow(
              h, key, updates,
              reinterpret_cast<const float*>(p + n * 16 + r * row_len * sizeof(float)));
        }
      }
      if (!s.ok()) return s;
    }
    if (!it->status().ok()) return FromRocks(it->status(), "reading a snapshot");
    if (dense && at != h.shard_end() - h.shard_begin()) return corrupt(id, "dense blocks missing");
    if (crc != expected.crc32c()) {
      return corrupt(id, absl::StrFormat("checksum mismatch (manifest %08x, data %08x)",
                                         expected.crc32c(), crc));
    }
  }
  return absl::OkStatus();
}

}  // namespace pscluster::ps
