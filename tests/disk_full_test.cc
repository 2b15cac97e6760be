// A snapshot that runs out of disk fails with a clear error, leaves no partial snapshot, and
// the shard keeps serving. Needs a small file system: tests/run.sh mounts an 8 MiB tmpfs
// (as root) and passes it in PSCLUSTER_SMALL_FS; elsewhere the test skips, saying so.
#include <cstdlib>
#include <filesystem>

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
  std::vector<std::string> ServerArgs() override { return {"--data_dir=" + root_}; }

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

  // Still serving, state intact, training goes on.
  ASSERT_TRUE(clients_[0]->PullDense(1, 1, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);
  OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->PushDense(1, 1, g).ok()); });
}

}  // namespace
}  // namespace pscluster
