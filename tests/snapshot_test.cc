// Snapshots across real ps_server processes: crash and restore reproduce the state and the
// next steps bitwise (optimizer state included), a crash mid-write leaves the previous
// snapshot restorable and the partial one invisible, checkpoints reshard 2 -> 3 and 2 -> 1
// shards, and pushes go on during a background write without leaking into it.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "tests/ps_cluster_fixture.h"
#include "tests/test_tables.h"

namespace pscluster {
namespace {

constexpr uint32_t kDim = 4;

class SnapshotTest : public PsClusterTest {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    PsClusterTest::SetUp();
  }

  std::vector<std::string> ServerArgs() override { return Args({}); }
  std::vector<std::string> Args(std::vector<std::string> more) {
    more.push_back("--data_dir=" + root_);
    if (delay_ms_ > 0) more.push_back(absl::StrCat("--snapshot_test_delay_ms=", delay_ms_));
    if (full_every_ > 1) more.push_back(absl::StrCat("--snapshot_full_every=", full_every_));
    return more;
  }

  // A dense and a sparse table per optimizer, all BSP.
  void CreateTables(uint64_t dense_size) {
    uint32_t id = 1;
    for (const OptimizerConfig& opt : AllOptimizers()) {
      TableSpec dense = Spec(id++, TableSpec::DENSE, opt);
      dense.set_size(dense_size);
      TableSpec sparse = Spec(id++, TableSpec::SPARSE, opt);
      sparse.set_dim(kDim);
      for (const TableSpec& s : {dense, sparse}) {
        ASSERT_TRUE(clients_[0]->CreateTable(s).ok());
        tables_.push_back(s);
      }
    }
  }

  static std::vector<uint64_t> KeysOf(int w, int t) {
    std::vector<uint64_t> k;
    for (uint64_t i = 0; i < 30; ++i) k.push_back(i + 15 * w + (t % 3) * 7);
    return k;
  }

  // Steps [from, to) on every table from both workers.
  void Train(int from, int to) {
    for (int t = from; t < to; ++t) {
      OnAllWorkers([&](int w) {
        for (const TableSpec& spec : tables_) {
          absl::Status s;
          if (spec.kind() == TableSpec::DENSE) {
            std::vector<float> g(spec.size());
            for (uint64_t i = 0; i < g.size(); ++i) g[i] = Grad(w, t, i);
            s = clients_[w]->PushDense(spec.table_id(), t, g);
          } else {
            std::vector<uint64_t> keys = KeysOf(w, t);
            std::vector<float> g(keys.size() * kDim);
            for (uint64_t i = 0; i < g.size(); ++i) g[i] = Grad(w, t, i);
            s = clients_[w]->PushSparse(spec.table_id(), t, keys, g);
          }
          ASSERT_TRUE(s.ok()) << "step " << t << " table " << spec.table_id() << ": " << s;
        }
      });
    }
  }

  // Every table's values as pulled at `step`: dense whole, sparse rows 0..59 and 1000.
  std::vector<std::vector<float>> State(int step) {
    std::vector<std::vector<float>> out;
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 60; ++k) keys.push_back(k);
    keys.push_back(1000);
    for (const TableSpec& spec : tables_) {
      absl::Status s;
      if (spec.kind() == TableSpec::DENSE) {
        out.emplace_back(spec.size());
        s = clients_[0]->PullDense(spec.table_id(), step, absl::MakeSpan(out.back()));
      } else {
        out.emplace_back(keys.size() * kDim);
        s = clients_[1]->PullSparse(spec.table_id(), step, keys, absl::MakeSpan(out.back()));
      }
      EXPECT_TRUE(s.ok()) << "table " << spec.table_id() << ": " << s;
    }
    return out;
  }

  void SnapshotAndWait(int step) {
    absl::Status s = clients_[0]->Snapshot(step);
    ASSERT_TRUE(s.ok()) << s;
    auto status = clients_[0]->SnapshotStatus(/*wait_until_idle=*/true);
    ASSERT_TRUE(status.ok()) << status.status();
    for (const auto& st : *status) {
      ASSERT_EQ(st.last_complete_step(), step) << st.last_error();
    }
  }

  void Restart(int num_shards, const std::string& restore, int kill_signal) {
    StopServers(kill_signal);
    StartServers(num_shards, Args({"--restore=" + restore}));
    ASSERT_FALSE(HasFatalFailure());
    ConnectClients();
  }

  // Servers whose snapshot writes sleep `delay_ms` per block, and one dense SGD table.
  void RestartWithSlowWritesAndOneSgdTable(int delay_ms, uint64_t size) {
    StopServers(SIGTERM);
    delay_ms_ = delay_ms;
    StartServers(kShards, Args({}));
    ASSERT_FALSE(HasFatalFailure());
    ConnectClients();
    OptimizerConfig sgd;
    sgd.set_kind(OptimizerConfig::SGD);
    sgd.set_learning_rate(0.5f);
    TableSpec spec = Spec(1, TableSpec::DENSE, sgd);
    spec.set_size(size);
    ASSERT_TRUE(clients_[0]->CreateTable(spec).ok());
    tables_ = {spec};
  }

  int64_t RestoredStep() {
    auto status = clients_[0]->SnapshotStatus(false);
    EXPECT_TRUE(status.ok()) << status.status();
    int64_t step = (*status)[0].restored_step();
    for (const auto& st : *status) EXPECT_EQ(st.restored_step(), step);
    return step;
  }

  std::string root_;
  int delay_ms_ = 0;
  int full_every_ = 1;
  std::vector<TableSpec> tables_;
};

TEST_F(SnapshotTest, KilledClusterRestoresStateAndRepeatsTheNextStepsBitwise) {
  CreateTables(20011);
  Train(0, 3);
  SnapshotAndWait(3);
  auto at3 = State(3);
  Train(3, 5);
  auto at5 = State(5);

  Restart(kShards, "latest", SIGKILL);
  EXPECT_EQ(RestoredStep(), 3);
  EXPECT_EQ(State(3), at3);
  Train(3, 5);  // same gradients: optimizer state and step counts must have survived
  EXPECT_EQ(State(5), at5);
}

TEST_F(SnapshotTest, CrashDuringWriteRestoresThePreviousCompleteSnapshot) {
  RestartWithSlowWritesAndOneSgdTable(
      20, 8 << 20);  // 16 blocks of 1 MiB per shard: >= 320 ms of writing to crash into
  ASSERT_FALSE(HasFatalFailure());
  Train(0, 1);
  SnapshotAndWait(1);
  auto at1 = State(1);
  Train(1, 2);
  ASSERT_TRUE(clients_[0]->Snapshot(2).ok());
  for (auto& server : servers_) {  // both are writing step 2: crash now
    ASSERT_TRUE(server.WaitForLine("snapshot of step 2: writing", absl::Seconds(60)).ok());
  }

  Restart(kShards, "latest", SIGKILL);
  EXPECT_EQ(RestoredStep(), 1);
  EXPECT_EQ(State(1), at1);
  auto lists = clients_[0]->ListSnapshots();
  ASSERT_TRUE(lists.ok()) << lists.status();
  for (const auto& list : *lists) {
    ASSERT_EQ(list.snapshots_size(), 1) << "the partial snapshot of step 2 is visible";
    EXPECT_EQ(list.snapshots(0).step(), 1);
    EXPECT_TRUE(list.snapshots(0).complete());
  }
  for (int s = 0; s < kShards; ++s) {
    auto staging = std::filesystem::path(root_) / absl::StrCat("shard-", s) / "staging";
    EXPECT_TRUE(std::filesystem::is_empty(staging)) << staging << " holds a partial file";
  }
}

TEST_F(SnapshotTest, CrashDuringAnIncrementalWriteRestoresTheLastCompleteChain) {
  StopServers(SIGTERM);
  delay_ms_ = 40;  // per block: a few hundred ms of writing to crash into
  full_every_ = 4;
  StartServers(kShards, Args({}));
  ASSERT_FALSE(HasFatalFailure());
  ConnectClients();
  CreateTables(20011);
  Train(0, 1);
  SnapshotAndWait(1);
  Train(1, 2);
  SnapshotAndWait(2);  // the changes since step 1
  auto at2 = State(2);
  Train(2, 3);
  auto at3 = State(3);
  ASSERT_TRUE(clients_[0]->Snapshot(3).ok());
  for (auto& server : servers_) {
    ASSERT_TRUE(server.WaitForLine("snapshot of step 3: writing", absl::Seconds(60)).ok());
  }

  Restart(kShards, "latest", SIGKILL);
  EXPECT_EQ(RestoredStep(), 2);
  EXPECT_EQ(State(2), at2);
  Train(2, 3);
  EXPECT_EQ(State(3), at3);
  SnapshotAndWait(3);  // the first after a restore is full
  auto lists = clients_[0]->ListSnapshots();
  ASSERT_TRUE(lists.ok()) << lists.status();
  for (const auto& list : *lists) {
    ASSERT_EQ(list.snapshots_size(), 3);
    EXPECT_FALSE(list.snapshots(0).has_base());
    EXPECT_TRUE(list.snapshots(1).has_base());
    EXPECT_EQ(list.snapshots(1).base_step(), 1);
    EXPECT_FALSE(list.snapshots(2).has_base());
  }
}

TEST_F(SnapshotTest, CheckpointOfTwoShardsRestoresIntoThreeAndIntoOne) {
  CreateTables(30011);
  Train(0, 3);
  SnapshotAndWait(3);
  auto at3 = State(3);
  Train(3, 4);
  auto at4 = State(4);

  Restart(3, "latest", SIGTERM);
  EXPECT_EQ(RestoredStep(), 3);
  EXPECT_EQ(State(3), at3);
  Train(3, 4);
  EXPECT_EQ(State(4), at4);

  Restart(1, "3", SIGTERM);
  EXPECT_EQ(RestoredStep(), 3);
  EXPECT_EQ(State(3), at3);
  Train(3, 4);
  EXPECT_EQ(State(4), at4);
}

TEST_F(SnapshotTest, PushesContinueDuringBackgroundWriteAndDoNotLeakIntoIt) {
  RestartWithSlowWritesAndOneSgdTable(250, 4 << 20);  // 8 blocks per shard: the write takes >= 2 s
  ASSERT_FALSE(HasFatalFailure());
  Train(0, 2);
  auto at2 = State(2);
  ASSERT_TRUE(clients_[0]->Snapshot(2).ok());
  absl::Status again = clients_[0]->Snapshot(3);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(std::string(again.message()), ::testing::HasSubstr("still being written"));

  Train(2, 6);  // four more steps while the snapshot is written
  auto during = clients_[0]->SnapshotStatus(false);
  ASSERT_TRUE(during.ok());
  bool writing = false;
  for (const auto& st : *during) writing |= st.in_progress();
  EXPECT_TRUE(writing) << "the pushes did not overlap the write; raise the test delay";
  auto at6 = State(6);
  std::vector<float> expected = at2[0];  // SGD: w -= 0.5 * (g0 + g1) per step
  for (int t = 2; t < 6; ++t) {
    for (uint64_t i = 0; i < expected.size(); ++i)
      expected[i] -= 0.5f * (Grad(0, t, i) + Grad(1, t, i));
  }
  EXPECT_EQ(at6[0], expected) << "a push during the snapshot was lost";
  ASSERT_TRUE(clients_[0]->SnapshotStatus(true).ok());

  Restart(kShards, "latest", SIGKILL);
  EXPECT_EQ(RestoredStep(), 2);
  EXPECT_EQ(State(2), at2) << "the snapshot holds state from after step 2";
}

// Starts ps_server with `flags` and expects it to refuse: exit status 2, never serving.
void ExpectRefusesToStart(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "server/ps/ps_server");
  auto p = testing::Subprocess::Start(flags);
  ASSERT_TRUE(p.ok());
  auto line = p->WaitForLine("listening on", absl::Seconds(60));
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition) << "it served";
  auto status = p->Stop(SIGKILL, absl::Seconds(20));
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << "wait status " << *status;
}

TEST_F(SnapshotTest, UnknownStepOrUnusableDirectoryRefusesToStart) {
  CreateTables(101);
  Train(0, 1);
  SnapshotAndWait(1);
  ExpectRefusesToStart({"--port=0", "--data_dir=" + root_, "--restore=77"});
  ExpectRefusesToStart({"--port=0", "--data_dir=" + root_, "--restore=yesterday"});
  std::string file = root_ + "/not_a_dir";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  ExpectRefusesToStart({"--port=0", "--data_dir=" + file});
  ExpectRefusesToStart({"--port=0", "--restore=latest"});  // no --data_dir
}

// Flips one byte of shard `shard`'s snapshot file of `step`, `from_end` bytes before its end
// (0: the middle); returns the file's path.
std::string FlipByte(const std::string& root, int shard, int64_t step, int64_t from_end) {
  const std::string path =
      absl::StrCat(root, "/shard-", shard, "/snapshots/", absl::StrFormat("%020d", step), ".psnap");
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  const int64_t size = static_cast<int64_t>(std::filesystem::file_size(path));
  const int64_t at = from_end == 0 ? size / 2 : size - from_end;
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Regression: an in-place Restore of a step that does not exist answered NOT_FOUND but had
// already dropped every table and registered worker.
TEST_F(SnapshotTest, InPlaceRestoreOfAMissingStepChangesNothing) {
  CreateTables(101);
  Train(0, 1);
  SnapshotAndWait(1);
  Train(1, 3);
  auto at3 = State(3);
  absl::Status s = clients_[0]->Restore(7);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("unchanged"));
  EXPECT_EQ(State(3), at3);
  Train(3, 4);  // the workers are still registered, the clocks where they were
  EXPECT_EQ(clients_[0]->Restore(-1).code(), absl::StatusCode::kInvalidArgument);
}

// Regression: a Restore of a snapshot with a corrupted table answered DATA_LOSS and left a
// mix: some tables gone, one loaded with the corrupted values.
TEST_F(SnapshotTest, InPlaceRestoreOfACorruptedSnapshotChangesNothing) {
  CreateTables(101);
  Train(0, 1);
  SnapshotAndWait(1);
  auto at1 = State(1);
  Train(1, 2);
  SnapshotAndWait(2);
  Train(2, 3);
  auto at3 = State(3);
  const std::string damaged = FlipByte(root_, 1, 2, 0);
  absl::Status s = clients_[0]->Restore(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(damaged));
  EXPECT_EQ(State(3), at3);
  Train(3, 4);
  auto restored = clients_[0]->Restore(1);  // an intact one still restores
  ASSERT_TRUE(restored.ok()) << restored;
  EXPECT_EQ(State(1), at1);
}

// A restore that some shards took and another did not (it was killed) says which rolled
// back and that the tables are mixed until it is restored again (it named only the shard
// that failed).
TEST_F(SnapshotTest, APartialRestoreSaysWhichShardsRolledBack) {
  CreateTables(101);
  Train(0, 1);
  SnapshotAndWait(1);
  Train(1, 2);
  ASSERT_TRUE(servers_[1].Stop(SIGKILL, absl::Seconds(20)).ok());
  servers_.pop_back();  // (TearDown stops the one left)
  absl::Status s = clients_[0]->Restore(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("shard 1 ("));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("shard(s) 0 did roll back to step 1"));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("restore step 1 again"));
}

// Runs ps_server with `flags` to its exit (it must refuse to start); its stderr.
std::string RefusalOf(const std::vector<std::string>& flags) {
  std::string cmd = "exec server/ps/ps_server --port=0";
  for (const std::string& f : flags) cmd += " '" + f + "'";
  auto out = testing::OutputOf({"/bin/sh", "-c", cmd + " 2>&1"}, absl::Seconds(60));
  EXPECT_FALSE(out.ok()) << "it started: " << *out;
  return out.ok() ? "" : std::string(out.status().message());
}

// A shard with one handler thread answered nothing (that thread polls for calls): refused.
TEST(PsServerFlagsTest, FewerThanTwoThreadsAreRefused) {
  for (const char* threads : {"--threads=1", "--threads=0", "--threads=-4"}) {
    EXPECT_THAT(RefusalOf({threads}), ::testing::HasSubstr("must be >= 2")) << threads;
  }
}

// Regression: with bytes flipped where the snapshot manifests are kept, the shard treated
// intact snapshots as partial and deleted their data. Now the damage is named, nothing is
// deleted, and the shard starts only when told to, from the newest snapshot that verifies.
TEST_F(SnapshotTest, DamagedSnapshotIsNamedNeverDeletedAndSkippedOnlyWhenAsked) {
  CreateTables(101);
  Train(0, 1);
  SnapshotAndWait(1);
  auto at1 = State(1);
  Train(1, 2);
  SnapshotAndWait(2);
  Train(2, 3);
  SnapshotAndWait(3);
  StopServers(SIGKILL);
  const std::string manifest_hit = FlipByte(root_, 0, 3, 20);  // inside the manifest record
  const std::string block_hit = FlipByte(root_, 1, 2, 0);      // inside a table's data
  const std::string manifest_bytes = ReadAll(manifest_hit), block_bytes = ReadAll(block_hit);

  std::string refusal =
      RefusalOf({"--shard_id=0", "--num_shards=2", "--data_dir=" + root_, "--restore=latest"});
  EXPECT_THAT(refusal, ::testing::HasSubstr(manifest_hit));
  EXPECT_THAT(refusal, ::testing::HasSubstr("--restore_skip_damaged"));
  refusal = RefusalOf({"--shard_id=1", "--num_shards=2", "--data_dir=" + root_,
                       "--restore=latest"});  // its own files verify; shard 0's do not
  EXPECT_THAT(refusal, ::testing::HasSubstr(manifest_hit));

  // Told to: step 3 lacks shard 0's manifest, step 2 fails its checksum: step 1, saying so.
  StartServers(kShards, Args({"--restore=latest", "--restore_skip_damaged"}));
  ASSERT_FALSE(HasFatalFailure());
  ConnectClients();
  EXPECT_EQ(RestoredStep(), 1);
  EXPECT_EQ(State(1), at1);
  // Nor is step 2 offered again as the newest checkpoint complete on every shard.
  auto latest = clients_[0]->LatestCompleteSnapshot();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1) << "a snapshot the restore found damaged is still listed";
  StopServers(SIGTERM);
  EXPECT_EQ(ReadAll(manifest_hit), manifest_bytes) << "a damaged snapshot was changed";
  EXPECT_EQ(ReadAll(block_hit), block_bytes) << "a damaged snapshot was changed";
}

TEST_F(SnapshotTest, SnapshotRpcsWithoutDataDirFailClearly) {
  StopServers(SIGTERM);
  StartServers(kShards, {});
  ConnectClients();
  absl::Status s = clients_[0]->Snapshot(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("--data_dir"));
}

}  // namespace
}  // namespace pscluster
