#include "server/ps/export/table_export.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"
#include "rocksdb/db.h"
#include "server/ps/snapshot/snapshotter.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;
constexpr size_t kRowsPerBatch = 4096;

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(message);
  return absl::UnavailableError(message);
}

absl::StatusOr<Table*> FindTable(const Shard& shard, const std::string& wanted, int64_t step) {
  uint32_t id = 0;
  const bool numeric = absl::SimpleAtoi(wanted, &id);
  std::vector<std::string> known;
  for (Table* t : shard.Tables()) {
    if ((numeric && t->id() == id) || t->spec().name() == wanted) return t;
    known.push_back(absl::StrCat(t->id(), " (", t->spec().name(), ")"));
  }
  return absl::NotFoundError(absl::StrCat("no table '", wanted, "' in the snapshot of step ", step,
                                          "; it holds: ", absl::StrJoin(known, ", ")));
}

// Room for the rows and RocksDB's own files, checked before anything is written: Debian's
// RocksDB aborts when a write meets a full disk.
absl::Status CheckRoom(const std::string& out, uint64_t bytes) {
  const uint64_t needed = bytes + bytes / 4 + (uint64_t{64} << 20);
  std::error_code ec;
  fs::path parent = fs::absolute(out, ec).parent_path();
  const fs::space_info space = fs::space(parent, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("cannot stat ", parent.string(), ": ", ec.message()));
  if (space.available < needed) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the export needs about ", needed / 1000000, " MB in ", parent.string(), " but ",
        space.available / 1000000, " MB are available; free space or export elsewhere"));
  }
  return absl::OkStatus();
}

std::string BigEndian(uint64_t key) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, key >>= 8) out[i] = static_cast<char>(key & 0xff);
  return out;
}

// The rows (values only) and the meta column family, written without a log and flushed.
absl::Status WriteRows(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* meta, const TableImage& image,
                       int64_t step) {
  const uint32_t dim = image.header.spec().dim();
  const size_t row_len = dim * (1 + image.header.num_slots());
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // flushed below, and a failed export is removed whole
  for (size_t at = 0; at < image.keys.size(); at += kRowsPerBatch) {
    rocksdb::WriteBatch batch;
    for (size_t r = at; r < std::min(image.keys.size(), at + kRowsPerBatch); ++r) {
      const char* values = reinterpret_cast<const char*>(image.row_data.data() + r * row_len);
      batch.Put(BigEndian(image.keys[r]), rocksdb::Slice(values, dim * sizeof(float)));
    }
    RETURN_IF_ERROR(FromRocks(db->Write(wo, &batch), "writing rows"));
  }
  std::string spec;
  google::protobuf::TextFormat::PrintToString(image.header.spec(), &spec);
  rocksdb::WriteBatch batch;
  batch.Put(meta, "spec", spec);
  batch.Put(meta, "step", std::to_string(step));
  batch.Put(meta, "rows", std::to_string(image.keys.size()));
  RETURN_IF_ERROR(FromRocks(db->Write(wo, &batch), "writing the meta column family"));
  return FromRocks(db->Flush(rocksdb::FlushOptions(), {db->DefaultColumnFamily(), meta}),
                   "flushing");
}

absl::Status WriteDatabase(const std::string& dir, const TableImage& image, int64_t step) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.error_if_exists = true;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {"meta", rocksdb::ColumnFamilyOptions()}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(options, dir, families, &handles, &db),
                            absl::StrCat("creating the database ", dir)));
  absl::Status written = WriteRows(db, handles[1], image, step);
  for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
  absl::Status closed = FromRocks(db->Close(), "closing the database");
  delete db;
  return written.ok() ? closed : written;
}

uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec))
    bytes += f.is_regular_file() ? f.file_size() : 0;
  return bytes;
}

}  // namespace

absl::StatusOr<ExportResult> ExportTable(const ExportRequest& request) {
  std::error_code ec;
  if (fs::exists(request.out, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat(request.out, " exists; export to a new directory"));
  }
  ShardOptions one;  // every old shard's rows into one
  one.max_table_bytes = UINT64_MAX;
  Shard staging(one);
  SnapshotterOptions options;
  options.root = request.root;
  options.read_only = true;  // the checkpoint may belong to a running cluster
  ASSIGN_OR_RETURN(std::unique_ptr<Snapshotter> snapshotter,
                   Snapshotter::Create(&staging, options));
  ASSIGN_OR_RETURN(Snapshotter::Loaded loaded, snapshotter->Load(request.which));
  if (loaded.step < 0) {
    return absl::NotFoundError(absl::StrCat("no snapshot under ", request.root));
  }
  ASSIGN_OR_RETURN(Table * table, FindTable(*loaded.shard, request.table, loaded.step));
  if (table->spec().kind() != TableSpec::SPARSE) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table->id(), " is dense: export takes sparse (embedding) tables"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TableImage> image, table->CaptureNow());
  RETURN_IF_ERROR(CheckRoom(request.out, image->keys.size() * (8 + table->spec().dim() * 4)));
  const std::string partial = request.out + ".partial";
  fs::remove_all(partial, ec);  // an earlier export that did not finish
  absl::Status written = WriteDatabase(partial, *image, loaded.step);
  if (written.ok()) fs::rename(partial, request.out, ec);
  if (!written.ok() || ec) {
    fs::remove_all(partial, ec);
    return written.ok()
               ? absl::UnavailableError(absl::StrCat("renaming ", partial, ": ", ec.message()))
               : written;
  }
  ExportResult result;
  result.step = loaded.step;
  result.table_id = table->id();
  result.rows = image->keys.size();
  result.dim = table->spec().dim();
  result.bytes = DirectoryBytes(request.out);
  return result;
}

}  // namespace pscluster::ps
