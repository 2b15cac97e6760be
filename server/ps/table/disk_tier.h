// The disk tier of sparse tables (ps_server --sparse_memory_bytes): the rows a shard's RAM
// budget has no room for, kept in one RocksDB database on local disk, a column family per
// table. A table keeps its recently updated rows in RAM (RowStore) and moves the coldest to
// its ColdRows when the shard's sparse rows pass the budget; a row lives in exactly one of
// the two. The tier holds no durable state (snapshots do): it is wiped when it opens.
//
// Debian's librocksdb aborts the process when any of its writes meets a full disk, even a
// background flush seconds later. So nothing is written unless the file system keeps
// `reserve_bytes` free after it, and RocksDB is sized from that reserve: its memtables and
// one compaction's output fit in it. A write the reserve forbids is RESOURCE_EXHAUSTED and
// writes nothing; the table refuses the push that needed it.
//
// Thread-safe: RocksDB is; each ColdRows is used under its table's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace pscluster::ps {

struct DiskTierOptions {
  std::string dir;
  uint64_t memory_bytes = 0;  // sparse rows in RAM, all tables of the shard together
  uint64_t reserve_bytes = uint64_t{1} << 30;
};

class ColdRows;

class DiskTier {
 public:
  // Wipes `options.dir` and opens an empty database there.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const DiskTierOptions& options() const { return options_; }
  // A new, empty column family for one table of rows of `width` floats.
  absl::StatusOr<std::unique_ptr<ColdRows>> NewTable(uint32_t table_id, size_t width);

  // The bytes of sparse rows in RAM over all tables: each table adds and takes back its own.
  void ChargeRam(int64_t bytes) { ram_bytes_ += bytes; }
  int64_t ram_bytes() const { return ram_bytes_.load(); }

  // OK when `bytes` more may be written with the reserve kept free; else RESOURCE_EXHAUSTED
  // saying how much is free and what to do.
  absl::Status CheckRoom(uint64_t bytes) const;
  rocksdb::DB* db() const { return db_.get(); }

 private:
  DiskTier(DiskTierOptions options, std::unique_ptr<rocksdb::DB> db);

  const DiskTierOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::atomic<int64_t> ram_bytes_{0};
  std::atomic<uint64_t> next_family_{0};
};

// One table's rows on disk. A row's record: its update count, last update's step and
// version (as RowStore keeps them), then its floats.
class ColdRows {
 public:
  struct Row {
    int64_t updates = 0;
    int64_t step = 0;
    uint64_t version = 0;
    const char* floats = nullptr;  // width floats, unaligned: copy them out
  };
  // Puts and deletes written at once (Commit) or not at all.
  class Batch {
   public:
    explicit Batch(const ColdRows& rows);
    ~Batch();
    void Put(uint64_t key, const Row& row);
    void Delete(uint64_t key);
    size_t puts() const { return puts_; }
    size_t deletes() const { return deletes_; }

   private:
    friend class ColdRows;
    const ColdRows& rows_;
    std::unique_ptr<rocksdb::WriteBatch> batch_;
    size_t puts_ = 0, deletes_ = 0;
  };

  ~ColdRows();  // drops the column family
  ColdRows(const ColdRows&) = delete;
  ColdRows& operator=(const ColdRows&) = delete;

  size_t width() const { return width_; }
  // Rows on disk (the tier counts what Commit put and deleted: the table puts only rows
  // that are not on disk and deletes only rows that are).
  uint64_t size() const { return size_; }
  DiskTier& tier() const { return *tier_; }
  // The bytes of this table's files on disk.
  uint64_t bytes() const;

  // fn(i, row) for each keys[i] that has a row on disk. `row` lives during the call.
  absl::Status Get(absl::Span<const uint64_t> keys,
                   const std::function<void(size_t, const Row&)>& fn) const;
  bool Contains(uint64_t key) const;
  // Writes the batch whole, or nothing (RESOURCE_EXHAUSTED when the disk has no room).
  absl::Status Commit(Batch& batch);
  // fn(key, row) for every row on disk, in key order.
  absl::Status ForEach(const std::function<void(uint64_t, const Row&)>& fn) const;

 private:
  friend class DiskTier;
  ColdRows(DiskTier* tier, rocksdb::ColumnFamilyHandle* family, size_t width);

  DiskTier* const tier_;
  rocksdb::ColumnFamilyHandle* const family_;
  const size_t width_;
  uint64_t size_ = 0;
};

}  // namespace pscluster::ps
