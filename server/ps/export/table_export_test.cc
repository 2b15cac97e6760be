// psctl export's library: a checkpoint's sparse table, read back through RocksDB's own
// API, holds exactly the rows a pull returns; the wrong table, a dense one, an existing
// directory and an unknown step are refused, writing nothing.
#include "server/ps/export/table_export.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "server/ps/snapshot/snapshotter.h"
#include "server/ps/table/shard.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint32_t kDim = 8;

TableSpec Spec(uint32_t id, TableSpec::Kind kind) {
  TableSpec spec;
  spec.set_table_id(id);
  spec.set_name(kind == TableSpec::SPARSE ? "emb" : "dense");
  spec.set_kind(kind);
  if (kind == TableSpec::SPARSE) {
    spec.set_dim(kDim);
  } else {
    spec.set_size(16);
  }
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
  spec.mutable_initializer()->set_scale(0.5f);
  return spec;
}

uint64_t FromBigEndian(const rocksdb::Slice& s) {
  uint64_t key = 0;
  for (size_t i = 0; i < 8; ++i) key = key << 8 | static_cast<unsigned char>(s[i]);
  return key;
}

class TableExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<pscluster::testing::TempDir>("export");
    root_ = tmp_->path() + "/root";
    for (uint32_t i = 0; i < 2; ++i) {  // two shards' snapshots under one root
      ShardOptions o;
      o.shard_id = i;
      o.num_shards = 2;
      shards_.push_back(std::make_unique<Shard>(o));
      shards_[i]->RegisterWorker(0);
      ASSERT_TRUE(shards_[i]->CreateTable(Spec(1, TableSpec::SPARSE)).ok());
      ASSERT_TRUE(shards_[i]->CreateTable(Spec(2, TableSpec::DENSE)).ok());
      for (uint64_t k = 0; k < 500; ++k) {
        if (SparseShardOf(k * 13, 2) == i) keys_[i].push_back(k * 13);
      }
      std::vector<float> grads(keys_[i].size() * kDim);
      for (size_t j = 0; j < grads.size(); ++j) grads[j] = 0.001f * (j % 97) - 0.05f;
      bool skipped = false;
      ASSERT_TRUE((*shards_[i]->GetSparse(1, 0))->Push(0, 1, keys_[i], grads, &skipped).ok());
      SnapshotterOptions so;
      so.root = root_;
      auto s = Snapshotter::Create(shards_[i].get(), so);
      ASSERT_TRUE(s.ok()) << s.status();
      SnapshotRequest r;
      r.set_step(1);
      ASSERT_TRUE((*s)->Snapshot(r, absl::Now() + absl::Seconds(60)).ok());
      ASSERT_TRUE((*s)->AwaitIdle(absl::Now() + absl::Seconds(60)));
    }
  }

  ExportRequest Request(const std::string& table) const {
    ExportRequest r;
    r.root = root_;
    r.table = table;
    r.out = tmp_->path() + "/served";
    return r;
  }

  std::unique_ptr<pscluster::testing::TempDir> tmp_;
  std::string root_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<uint64_t> keys_[2];
};

TEST_F(TableExportTest, AStockRocksDbReaderSeesTheRowsAPullReturns) {
  auto result = ExportTable(Request("emb"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 1);
  EXPECT_EQ(result->rows, keys_[0].size() + keys_[1].size());
  EXPECT_FALSE(fs::exists(Request("emb").out + ".partial"));

  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {{rocksdb::kDefaultColumnFamilyName, {}},
                                                           {"meta", {}}};
  ASSERT_TRUE(
      rocksdb::DB::OpenForReadOnly(rocksdb::Options(), Request("emb").out, families, &handles, &raw)
          .ok());
  std::string step, spec;
  ASSERT_TRUE(raw->Get(rocksdb::ReadOptions(), handles[1], "step", &step).ok());
  ASSERT_TRUE(raw->Get(rocksdb::ReadOptions(), handles[1], "spec", &spec).ok());
  EXPECT_EQ(step, "1");
  EXPECT_THAT(spec, HasSubstr("dim: 8"));
  size_t seen = 0;
  uint64_t previous = 0;
  std::unique_ptr<rocksdb::Iterator> it(raw->NewIterator(rocksdb::ReadOptions(), handles[0]));
  for (it->SeekToFirst(); it->Valid(); it->Next(), ++seen) {
    const uint64_t key = FromBigEndian(it->key());
    EXPECT_TRUE(seen == 0 || key > previous) << "ids in order";
    previous = key;
    ASSERT_EQ(it->value().size(), kDim * sizeof(float));
    std::vector<float> pulled(kDim);
    const uint32_t shard = SparseShardOf(key, 2);
    ASSERT_TRUE((*shards_[shard]->GetSparse(1, 0))->Read({key}, absl::MakeSpan(pulled)).ok());
    EXPECT_EQ(std::memcmp(it->value().data(), pulled.data(), kDim * sizeof(float)), 0) << key;
  }
  EXPECT_EQ(seen, result->rows);
  it.reset();
  for (auto* h : handles) raw->DestroyColumnFamilyHandle(h);
  delete raw;
}

TEST_F(TableExportTest, WhatCannotBeExportedIsRefusedWritingNothing) {
  auto unknown = ExportTable(Request("nope"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("1 (emb)"));
  auto dense = ExportTable(Request("2"));
  EXPECT_EQ(dense.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dense.status().message(), HasSubstr("dense"));
  ExportRequest r = Request("emb");
  r.which = "7";
  EXPECT_EQ(ExportTable(r).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(r.out));
  fs::create_directories(r.out);
  r.which = "latest";
  EXPECT_EQ(ExportTable(r).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(fs::is_empty(r.out));
}

}  // namespace
}  // namespace pscluster::ps
