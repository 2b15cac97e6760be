// A snapshot that runs out of disk, up front or while it is written, fails with a clear
// error, leaves no partial snapshot, never aborts the process, and the shard keeps serving. Needs a
// small file system: tests/run.sh mounts an 8 MiB tmpfs (as root) and passes it in
// PSCLUSTER_SMALL_FS; elsewhere the test skips, saying so.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "tests/ps_cluster_fixture.h"

namespace pscluster {
namespace {

class DiskFullTest : public PsClusterTest {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("PSCLUSTER_SMALL_FS");
    if (dir == nullptr || *dir == '\0') {
      GTEST_SKIP() << "PSCLUSTER_SMALL_FS is not set: no small file system to fill "
                      "(tests/run.sh mounts one when run as root)";
    }
    root_ = std::string(dir) + "/disk_full_test";
    std::filesystem::remove_all(root_);
    PsClusterTest::SetUp();
  }
  void TearDown() override {
    if (!root_.empty()) {
      PsClusterTest::TearDown();
      std::filesystem::remove_all(root_);
    }
  }
  std::vector<std::string> ServerArgs() override {
    return {"--data_dir=" + root_, absl::StrCat("--snapshot_test_delay_ms=", delay_ms_)};
  }
  int delay_ms_ = 0;

  // Waits for the write to end: it failed on every shard, saying why, and lists nothing.
  void ExpectTheSnapshotFailedForLackOfSpace() {
    auto status = clients_[0]->SnapshotStatus(/*wait_until_idle=*/true);
    ASSERT_TRUE(status.ok()) << status.status();
    for (const auto& s : *status) {
      EXPECT_EQ(s.last_complete_step(), -1);
      EXPECT_THAT(s.last_error(), ::testing::HasSubstr("RESOURCE_EXHAUSTED"));
      EXPECT_THAT(s.last_error(), ::testing::HasSubstr("free disk space"));
    }
    auto lists = clients_[0]->ListSnapshots();
    ASSERT_TRUE(lists.ok());
    for (const auto& l : *lists) EXPECT_EQ(l.snapshots_size(), 0);
  }

  std::string root_;
};

TEST_F(DiskFullTest, SnapshotLargerThanTheDiskFailsClearlyAndTheShardKeepsServing) {
  ps::TableSpec spec;
  spec.set_table_id(1);
  spec.set_size(6 << 20);  // 24 MiB of values, 12 MiB per shard: more than the 8 MiB disk
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  ASSERT_TRUE(clients_[0]->CreateTable(spec).ok());
  std::vector<float> g(spec.size(), 1.0f), before(spec.size()), after(spec.size());
  OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->PushDense(1, 0, g).ok()); });
  ASSERT_TRUE(clients_[0]->PullDense(1, 1, absl::MakeSpan(before)).ok());

  ASSERT_TRUE(clients_[0]->Snapshot(1).ok());  // captured and acknowledged; the write fails
  ExpectTheSnapshotFailedForLackOfSpace();

  // Still serving, state intact, training goes on.
  ASSERT_TRUE(clients_[0]->PullDense(1, 1, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);
  OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->PushDense(1, 1, g).ok()); });
}

// Writes a file in `dir` until the file system is full; returns its path.
std::string FillDisk(const std::string& dir) {
  const std::string path = dir + "/filler";
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr);
  std::vector<char> mb(1 << 16, 'f');
  while (f != nullptr && std::fwrite(mb.data(), 1, mb.size(), f) == mb.size()) {
  }
  if (f != nullptr) std::fclose(f);
  return path;
}

// Regression: when the disk filled while a snapshot was being written (after the free-space
// check), Debian's RocksDB aborted the shard, sometimes seconds after the error.
TEST_F(DiskFullTest, DiskFillingDuringTheWriteFailsTheSnapshotAndTheShardKeepsServing) {
  PsClusterTest::TearDown();
  delay_ms_ = 300;  // per block: the write is under way when the disk fills
  PsClusterTest::SetUp();
  ps::TableSpec spec;
  spec.set_table_id(1);
  spec.set_size(1 << 20);  // 2 MiB per shard, two blocks: passes the free-space check
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  ASSERT_TRUE(clients_[0]->CreateTable(spec).ok());
  std::vector<float> g(spec.size(), 1.0f), before(spec.size()), after(spec.size());
  OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->PushDense(1, 0, g).ok()); });
  ASSERT_TRUE(clients_[0]->PullDense(1, 1, absl::MakeSpan(before)).ok());

  ASSERT_TRUE(clients_[0]->Snapshot(1).ok());
  // Bounded wait until both shards have started writing, then fill the disk.
  bool started = false;
  for (absl::Time end = absl::Now() + absl::Seconds(30); !started && absl::Now() < end;) {
    auto status = clients_[0]->SnapshotStatus(/*wait_until_idle=*/false);
    ASSERT_TRUE(status.ok()) << status.status();
    started = true;
    for (const auto& s : *status) started = started && s.in_progress() && s.bytes_written() > 0;
    if (!started) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(started) << "the snapshot write did not start within 30 s";
  const std::string filler = FillDisk(root_);

  ExpectTheSnapshotFailedForLackOfSpace();
  for (int shard = 0; shard < kShards; ++shard) {  // the partial files are gone
    const std::string dir = absl::StrCat(root_, "/shard-", shard);
    EXPECT_TRUE(std::filesystem::is_empty(dir + "/staging")) << dir;
    EXPECT_TRUE(std::filesystem::is_empty(dir + "/snapshots")) << dir;
  }

  // Still serving, state intact, training goes on; with space again, snapshots work.
  ASSERT_TRUE(clients_[0]->PullDense(1, 1, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);
  OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->PushDense(1, 1, g).ok()); });
  std::filesystem::remove(filler);
  ASSERT_TRUE(clients_[0]->Snapshot(2).ok());
  auto status = clients_[0]->SnapshotStatus(/*wait_until_idle=*/true);
  ASSERT_TRUE(status.ok()) << status.status();
  for (const auto& s : *status) EXPECT_EQ(s.last_complete_step(), 2) << s.last_error();
}

}  // namespace
}  // namespace pscluster
