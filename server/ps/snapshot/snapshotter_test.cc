#include "server/ps/snapshot/snapshotter.h"

#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/sharding.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "server/ps/service/shard_services.h"
#include "server/ps/snapshot/file_snapshot_store.h"
#include "server/ps/snapshot/memory_snapshot_store.h"
#include "server/ps/snapshot/snapshot_store.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::Time Generous() { return absl::Now() + absl::Seconds(120); }

::testing::AssertionResult BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at " << i << " of " << a.size() << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Deterministic, varied, finite gradients.
float Grad(uint64_t i, int salt) {
  uint64_t x = Mix64(i * 7919 + static_cast<uint64_t>(salt) * 104729);
  return (static_cast<float>(x % 2001) - 1000.0f) / 1000.0f;
}

TableSpec DenseAdamSpec(uint32_t id, uint64_t size) {
  TableSpec spec;
  spec.set_table_id(id);
  spec.set_name("dense_adam");
  spec.set_kind(TableSpec::DENSE);
  spec.set_size(size);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(InitializerConfig::NORMAL);
  spec.mutable_initializer()->set_scale(0.1f);
  spec.mutable_initializer()->set_seed(3);
  return spec;
}

TableSpec SparseAdagradSpec(uint32_t id, uint32_t dim) {
  TableSpec spec;
  spec.set_table_id(id);
  spec.set_name("sparse_adagrad");
  spec.set_kind(TableSpec::SPARSE);
  spec.set_dim(dim);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(InitializerConfig::UNIFORM);
  spec.mutable_initializer()->set_scale(0.5f);
  spec.mutable_initializer()->set_seed(11);
  return spec;
}

TableSpec SgdSpec(uint32_t id, TableSpec::Kind kind, ConsistencyConfig::Mode mode) {
  TableSpec spec;
  spec.set_table_id(id);
  spec.set_name("sgd");
  spec.set_kind(kind);
  if (kind == TableSpec::DENSE) {
    spec.set_size(8);
  } else {
    spec.set_dim(2);
  }
  spec.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_initializer()->set_kind(InitializerConfig::CONSTANT);
  spec.mutable_initializer()->set_value(1.5f);
  return spec;
}

DenseTable* Dense(const Shard& shard, uint32_t id) {
  auto t = shard.GetTable(id);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  EXPECT_EQ((*t)->spec().kind(), TableSpec::DENSE);
  return static_cast<DenseTable*>(*t);
}

SparseTable* Sparse(const Shard& shard, uint32_t id) {
  auto t = shard.GetTable(id);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  EXPECT_EQ((*t)->spec().kind(), TableSpec::SPARSE);
  return static_cast<SparseTable*>(*t);
}

std::vector<float> ReadDense(const Shard& shard, uint32_t id) {
  DenseTable* t = Dense(shard, id);
  if (t == nullptr) return {};
  std::vector<float> out(t->range().size());
  absl::Status s = t->Read(t->range().begin, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<float> ReadSparse(const Shard& shard, uint32_t id, const std::vector<uint64_t>& keys) {
  SparseTable* t = Sparse(shard, id);
  if (t == nullptr) return {};
  std::vector<float> out(keys.size() * t->spec().dim());
  absl::Status s = t->Read(keys, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Pushes the whole global gradient `grad` slice that `shard` holds.
void PushDenseSlice(const Shard& shard, uint32_t id, int32_t worker, int64_t step,
                    const std::vector<float>& grad) {
  auto t = shard.GetDense(id, worker);
  ASSERT_TRUE(t.ok()) << t.status();
  Range r = (*t)->range();
  bool skipped = false;
  absl::Status s = (*t)->Push(worker, step, r.begin,
                              {absl::MakeConstSpan(grad.data() + r.begin, r.size())}, &skipped);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(skipped);
}

void PushSparse(const Shard& shard, uint32_t id, int32_t worker, int64_t step,
                const std::vector<uint64_t>& keys, const std::vector<float>& grads) {
  auto t = shard.GetSparse(id, worker);
  ASSERT_TRUE(t.ok()) << t.status();
  bool skipped = false;
  absl::Status s = (*t)->Push(worker, step, keys, grads, &skipped);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(skipped);
}

std::vector<float> SparseGrads(const std::vector<uint64_t>& keys, uint32_t dim, int salt) {
  std::vector<float> g(keys.size() * dim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(keys[i / dim] * dim + i % dim, salt);
  return g;
}

std::vector<float> DenseGrads(uint64_t size, int salt) {
  std::vector<float> g(size);
  for (uint64_t i = 0; i < size; ++i) g[i] = Grad(i, salt);
  return g;
}

// Keys of `keys` that shard `shard` of `num_shards` owns.
std::vector<uint64_t> Owned(const std::vector<uint64_t>& keys, uint32_t shard,
                            uint32_t num_shards) {
  std::vector<uint64_t> out;
  for (uint64_t k : keys) {
    if (SparseShardOf(k, num_shards) == shard) out.push_back(k);
  }
  return out;
}

SnapshotRequest Request(int64_t step) {
  SnapshotRequest r;
  r.set_step(step);
  return r;
}

SnapshotRequest Request(int64_t step, double metric) {
  SnapshotRequest r = Request(step);
  r.set_has_metric(true);
  r.set_metric(metric);
  return r;
}

// BSP tests (SgdSpec: 8 values from 1.5, lr 0.5): exactly representable gradients, so the
// SGD arithmetic below is exact.
std::vector<float> BspDenseGrad(int32_t w, int64_t step) {
  std::vector<float> g(8);
  for (int i = 0; i < 8; ++i) g[i] = 0.25f * static_cast<float>(i + 1 + w * 3 + step * 5);
  return g;
}

// Values after `steps` BSP steps of workers 0 and 1 (summed in worker-id order).
std::vector<float> ExpectedBspDense(int steps) {
  std::vector<float> v(8, 1.5f);
  for (int t = 0; t < steps; ++t) {
    std::vector<float> g0 = BspDenseGrad(0, t), g1 = BspDenseGrad(1, t);
    for (int i = 0; i < 8; ++i) v[i] -= 0.5f * (g0[i] + g1[i]);
  }
  return v;
}

class SnapshotterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_dir_ = std::make_unique<pscluster::testing::TempDir>("snapshotter_test");
    tmp_ = tmp_dir_->path();
    root_ = tmp_ + "/root";
  }
  void TearDown() override { tmp_dir_.reset(); }

  std::unique_ptr<pscluster::testing::TempDir> tmp_dir_;

  SnapshotterOptions Options() const {
    SnapshotterOptions o;
    o.root = root_;
    return o;
  }

  std::unique_ptr<Snapshotter> Make(Shard* shard, SnapshotterOptions options) {
    auto s = Snapshotter::Create(shard, std::move(options));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  std::unique_ptr<Snapshotter> Make(Shard* shard) { return Make(shard, Options()); }
  // Options whose snapshots go to `storage`, in memory.
  SnapshotterOptions InMemory(MemorySnapshotStorage* storage) const {
    SnapshotterOptions o = Options();
    o.storage = storage;
    return o;
  }

  // Snapshots `step` and waits for the write.
  void SnapshotAndWait(Snapshotter& s, const SnapshotRequest& request) {
    auto r = s.Snapshot(request, Generous());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step(), request.step());
    ASSERT_TRUE(s.AwaitIdle(Generous()));
    SnapshotStatusResponse st = s.Status();
    EXPECT_FALSE(st.in_progress());
    EXPECT_EQ(st.last_error(), "");
    EXPECT_EQ(st.last_complete_step(), request.step());
  }

  static std::vector<int64_t> ListedSteps(const Snapshotter& s) {
    auto list = s.List();
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<int64_t> out;
    if (!list.ok()) return out;
    for (const SnapshotInfo& i : list->snapshots()) {
      EXPECT_TRUE(i.complete()) << i.step();
      out.push_back(i.step());
    }
    return out;
  }

  std::string tmp_;   // removed in TearDown
  std::string root_;  // the checkpoint root, inside tmp_
};

// ---------------------------------------------------------------------------------------

TEST_F(SnapshotterTest, RestoreReproducesStateAndNextStepBitwise) {
  const uint64_t kSize = kDenseBlockValues + 1000;  // two blocks
  const uint32_t kDim = 4;
  const std::vector<uint64_t> keys = {1, 5, 99, 12345, uint64_t{1} << 40, 77, 3};

  Shard a(ShardOptions{0, 1});
  a.RegisterWorker(0);
  a.RegisterWorker(2);
  ASSERT_TRUE(a.CreateTable(DenseAdamSpec(1, kSize)).ok());
  ASSERT_TRUE(a.CreateTable(SparseAdagradSpec(2, kDim)).ok());
  TableSpec sparse_adam = SparseAdagradSpec(3, kDim);  // Adam: per-row counts matter
  sparse_adam.mutable_optimizer()->set_kind(OptimizerConfig::ADAM);
  sparse_adam.mutable_optimizer()->set_learning_rate(0.01f);
  ASSERT_TRUE(a.CreateTable(sparse_adam).ok());
  for (int step = 0; step < 3; ++step) {
    PushDenseSlice(a, 1, step % 2 == 0 ? 0 : 2, step, DenseGrads(kSize, step));
    // Rows touched unevenly, with a duplicate key, so per-row update counts differ.
    std::vector<uint64_t> k(keys.begin(), keys.begin() + 3 + step * 2);
    k.push_back(keys[0]);
    PushSparse(a, 2, 0, step, k, SparseGrads(k, kDim, step));
    PushSparse(a, 3, 2, step, k, SparseGrads(k, kDim, 10 + step));
  }

  auto snap_a = Make(&a);
  ASSERT_NE(snap_a, nullptr);
  EXPECT_EQ(snap_a->Status().last_complete_step(), -1);
  EXPECT_EQ(snap_a->Status().restored_step(), -1);
  auto response = snap_a->Snapshot(Request(3, 0.5), Generous());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->step(), 3);
  EXPECT_GT(response->bytes(), kSize * 3 * sizeof(float));
  ASSERT_TRUE(snap_a->AwaitIdle(Generous()));
  SnapshotStatusResponse st = snap_a->Status();
  EXPECT_FALSE(st.in_progress());
  EXPECT_EQ(st.last_complete_step(), 3);
  EXPECT_EQ(st.last_error(), "");
  auto list = snap_a->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->snapshots_size(), 1);
  EXPECT_EQ(list->snapshots(0).step(), 3);
  EXPECT_TRUE(list->snapshots(0).complete());
  EXPECT_TRUE(list->snapshots(0).has_metric());
  EXPECT_EQ(list->snapshots(0).metric(), 0.5);
  EXPECT_EQ(list->snapshots(0).shard_id(), 0u);
  EXPECT_EQ(list->snapshots(0).num_shards(), 1u);
  EXPECT_GT(list->snapshots(0).bytes(), kSize * 3 * sizeof(float));
  snap_a.reset();  // the restarted shard opens the same database read-write

  Shard b(ShardOptions{0, 1});
  auto snap_b = Make(&b);
  ASSERT_NE(snap_b, nullptr);
  EXPECT_EQ(snap_b->Status().last_complete_step(), 3);
  auto restored = snap_b->Restore("latest");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 3);
  EXPECT_EQ(snap_b->Status().restored_step(), 3);

  EXPECT_TRUE(BitwiseEqual(ReadDense(a, 1), ReadDense(b, 1)));
  ASSERT_NE(Sparse(b, 2), nullptr);
  EXPECT_EQ(Sparse(b, 2)->Info().num_rows(), Sparse(a, 2)->Info().num_rows());
  EXPECT_EQ(Sparse(b, 2)->Info().num_rows(), keys.size());
  EXPECT_TRUE(BitwiseEqual(ReadSparse(a, 2, keys), ReadSparse(b, 2, keys)));
  EXPECT_TRUE(BitwiseEqual(ReadSparse(a, 3, keys), ReadSparse(b, 3, keys)));
  for (uint32_t id : {1u, 2u, 3u}) {
    EXPECT_EQ((*b.GetTable(id))->Clocks(), (*a.GetTable(id))->Clocks()) << id;
    EXPECT_EQ((*b.GetTable(id))->Info().SerializeAsString(),
              (*a.GetTable(id))->Info().SerializeAsString())
        << id;
  }

  // Workers come back registered; the next identical steps agree bitwise (Adam moments,
  // Adam's update count, Adagrad accumulators and sparse per-row counts all restored).
  for (int step = 3; step < 5; ++step) {
    for (Shard* s : {&a, &b}) {
      PushDenseSlice(*s, 1, 2, step, DenseGrads(kSize, 100 + step));
      PushSparse(*s, 2, 0, step, keys, SparseGrads(keys, kDim, 100 + step));
      PushSparse(*s, 3, 0, step, keys, SparseGrads(keys, kDim, 200 + step));
    }
    EXPECT_TRUE(BitwiseEqual(ReadDense(a, 1), ReadDense(b, 1))) << "after step " << step;
    EXPECT_TRUE(BitwiseEqual(ReadSparse(a, 2, keys), ReadSparse(b, 2, keys)))
        << "after step " << step;
    EXPECT_TRUE(BitwiseEqual(ReadSparse(a, 3, keys), ReadSparse(b, 3, keys)))
        << "after step " << step;
  }
}

// The same protocol over the in-memory store (no RocksDB, no disk): snapshot, restore
// into a fresh shard, and a failed write (a full disk) reported while nothing changes.
TEST_F(SnapshotterTest, InMemoryStoreSnapshotsRestoresAndReportsAFailedWrite) {
  const uint64_t kSize = 1000;
  const std::vector<uint64_t> keys = {1, 5, 99};
  MemorySnapshotStorage storage;
  const SnapshotterOptions o = InMemory(&storage);
  Shard a(ShardOptions{0, 1});
  a.RegisterWorker(0);
  ASSERT_TRUE(a.CreateTable(DenseAdamSpec(1, kSize)).ok());
  ASSERT_TRUE(a.CreateTable(SparseAdagradSpec(2, 4)).ok());
  for (int step = 0; step < 2; ++step) {
    PushDenseSlice(a, 1, 0, step, DenseGrads(kSize, step));
    PushSparse(a, 2, 0, step, keys, SparseGrads(keys, 4, step));
  }
  auto snap_a = Make(&a, o);
  ASSERT_NE(snap_a, nullptr);
  SnapshotAndWait(*snap_a, Request(2, 0.5));

  storage.FailWrites(true);
  ASSERT_TRUE(snap_a->Snapshot(Request(3, 0.4), Generous()).ok());
  ASSERT_TRUE(snap_a->AwaitIdle(Generous()));
  EXPECT_NE(snap_a->Status().last_error().find("no space left"), std::string::npos)
      << snap_a->Status().last_error();
  EXPECT_EQ(snap_a->Status().last_complete_step(), 2);
  EXPECT_EQ(ListedSteps(*snap_a), std::vector<int64_t>({2}));
  storage.FailWrites(false);

  Shard b(ShardOptions{0, 1});
  auto snap_b = Make(&b, o);
  ASSERT_NE(snap_b, nullptr);
  auto restored = snap_b->Restore("latest");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 2);
  EXPECT_TRUE(BitwiseEqual(ReadDense(a, 1), ReadDense(b, 1)));
  EXPECT_TRUE(BitwiseEqual(ReadSparse(a, 2, keys), ReadSparse(b, 2, keys)));
  EXPECT_EQ((*b.GetTable(1))->Clocks(), (*a.GetTable(1))->Clocks());
}

// Restore with drop_later (a rollback, psctl restore) whose later snapshots cannot be
// deleted (a read-only disk) fails and changes nothing: kept, they would come back with a
// restart's --restore=latest. Once they can be deleted it goes through.
TEST_F(SnapshotterTest, ARestoreWhoseLaterSnapshotsCannotGoFailsAndChangesNothing) {
  const uint64_t kSize = 1000;
  MemorySnapshotStorage storage;
  Shard a(ShardOptions{0, 1});
  a.RegisterWorker(0);
  ASSERT_TRUE(a.CreateTable(DenseAdamSpec(1, kSize)).ok());
  auto snap = Make(&a, InMemory(&storage));
  ASSERT_NE(snap, nullptr);
  std::vector<float> at_step_2;
  for (int step = 0; step < 3; ++step) {
    PushDenseSlice(a, 1, 0, step, DenseGrads(kSize, step));
    if (step >= 1) SnapshotAndWait(*snap, Request(step + 1));
    if (step == 1) at_step_2 = ReadDense(a, 1);
  }
  const std::vector<float> before = ReadDense(a, 1);
  ShardServices services(&a, snap.get(), ServiceOptions());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  services.RegisterWith(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  auto service = ShardAdmin::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  auto restore = [&](const RestoreRequest& r, RestoreResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return service->Restore(&ctx, r, out);
  };
  RestoreRequest req;
  req.set_step(2);
  req.set_drop_later(true);
  RestoreResponse resp;
  storage.FailDeletes(true);
  grpc::Status s = restore(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("nothing was restored"));
  EXPECT_TRUE(BitwiseEqual(ReadDense(a, 1), before));
  EXPECT_EQ(ListedSteps(*snap), std::vector<int64_t>({2, 3}));
  storage.FailDeletes(false);
  s = restore(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.step(), 2);
  EXPECT_TRUE(BitwiseEqual(ReadDense(a, 1), at_step_2));
  EXPECT_EQ(ListedSteps(*snap), std::vector<int64_t>({2}));
}

TEST_F(SnapshotterTest, DestructorWaitsForTheWrite) {
  Shard a(ShardOptions{0, 1});
  a.RegisterWorker(0);
  ASSERT_TRUE(a.CreateTable(DenseAdamSpec(1, kDenseBlockValues * 3)).ok());
  SnapshotterOptions o = Options();
  o.test_delay_per_block = absl::Milliseconds(20);
  {
    auto s = Make(&a, o);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->Snapshot(Request(4), Generous()).ok());
  }  // joins the writer
  Shard b(ShardOptions{0, 1});
  auto s = Make(&b);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(ListedSteps(*s), ElementsAre(4));
  auto restored = s->Restore("4");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(BitwiseEqual(ReadDense(a, 1), ReadDense(b, 1)));
}

// A BSP snapshot of a step not reached yet waits for it, captures exactly the state before
// that step applies, and loses none of the pushes that arrive meanwhile.
TEST_F(SnapshotterTest, BspCaptureAtFutureStep) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::BSP)).ok());
  ASSERT_TRUE(shard.CreateTable(SgdSpec(2, TableSpec::SPARSE, ConsistencyConfig::BSP)).ok());
  const std::vector<uint64_t> keys = {4, 9};

  auto dense_grad = BspDenseGrad;
  auto expected_dense = ExpectedBspDense;
  auto sparse_grad = [](int32_t w, int64_t step) {
    return std::vector<float>{0.5f * (w + 1), 0.25f * (step + 1), -1.0f * w, 2.0f * step};
  };
  auto expected_sparse = [&](int steps) {  // rows of keys 4 and 9, concatenated
    std::vector<float> v(4, 1.5f);
    for (int t = 0; t < steps; ++t) {
      std::vector<float> g0 = sparse_grad(0, t), g1 = sparse_grad(1, t);
      for (int i = 0; i < 4; ++i) v[i] -= 0.5f * (g0[i] + g1[i]);
    }
    return v;
  };
  auto push = [&](Shard& s, int32_t w, int64_t step) {
    PushDenseSlice(s, 1, w, step, dense_grad(w, step));
    PushSparse(s, 2, w, step, keys, sparse_grad(w, step));
  };

  auto snapshotter = Make(&shard);
  ASSERT_NE(snapshotter, nullptr);
  push(shard, 0, 0);  // step 0 waits for worker 1

  absl::StatusOr<SnapshotResponse> response = absl::UnknownError("not run");
  std::thread snapshot([&] { response = snapshotter->Snapshot(Request(1), Generous()); });
  // The capture is underway (in practice waiting for step 1) before step 0 completes.
  while (!snapshotter->Status().in_progress()) std::this_thread::yield();

  push(shard, 1, 0);  // step 0 applies; step 1 is the captured one
  push(shard, 0, 1);  // staged: worker 1 has not pushed step 1
  snapshot.join();    // returns once both tables are captured at step 1
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->step(), 1);
  push(shard, 1, 1);  // pushes arriving after the capture: applied, not lost

  ASSERT_TRUE(snapshotter->AwaitIdle(Generous()));
  EXPECT_EQ(snapshotter->Status().last_complete_step(), 1);
  EXPECT_EQ(snapshotter->Status().last_error(), "");
  EXPECT_EQ(Dense(shard, 1)->Info().applied_steps(), 2);
  EXPECT_EQ(Sparse(shard, 2)->Info().applied_steps(), 2);
  EXPECT_TRUE(BitwiseEqual(ReadDense(shard, 1), expected_dense(2)));
  EXPECT_TRUE(BitwiseEqual(ReadSparse(shard, 2, keys), expected_sparse(2)));
  snapshotter.reset();

  Shard restored(ShardOptions{0, 1});
  auto snap2 = Make(&restored);
  ASSERT_NE(snap2, nullptr);
  auto step = snap2->Restore("1");
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  EXPECT_EQ(Dense(restored, 1)->Info().applied_steps(), 1);
  EXPECT_EQ(Sparse(restored, 2)->Info().applied_steps(), 1);
  EXPECT_TRUE(BitwiseEqual(ReadDense(restored, 1), expected_dense(1)));
  EXPECT_TRUE(BitwiseEqual(ReadSparse(restored, 2, keys), expected_sparse(1)));

  // Replaying step 1 on the restored shard reaches the original's state.
  push(restored, 0, 1);
  EXPECT_EQ(Dense(restored, 1)->Info().applied_steps(), 1);  // waits for worker 1
  push(restored, 1, 1);
  EXPECT_EQ(Dense(restored, 1)->Info().applied_steps(), 2);
  EXPECT_TRUE(BitwiseEqual(ReadDense(restored, 1), ReadDense(shard, 1)));
  EXPECT_TRUE(BitwiseEqual(ReadSparse(restored, 2, keys), ReadSparse(shard, 2, keys)));
}

// Pushes that complete the awaited step while the capture waits are held until the copy is
// taken, then applied. No test hook tells when the capture has registered, so if the
// scheduler delays it past those pushes the snapshot is refused as too late instead; in both
// cases no push is lost, and a snapshot that is taken holds exactly one step.
// A BSP step that completes while a snapshot holds it is applied only after the capture,
// so the image is exactly the state before it. Deterministic through the Table API.
TEST_F(SnapshotterTest, BspStepCompletedWhileHeldIsAppliedOnlyAfterTheCapture) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::BSP)).ok());
  DenseTable* table = Dense(shard, 1);
  PushDenseSlice(shard, 1, 0, 0, BspDenseGrad(0, 0));
  PushDenseSlice(shard, 1, 0, 1, BspDenseGrad(0, 1));
  PushDenseSlice(shard, 1, 1, 1, BspDenseGrad(1, 1));  // step 1 complete; step 0 is not
  ASSERT_TRUE(table->HoldStep(1).ok());
  PushDenseSlice(shard, 1, 1, 0, BspDenseGrad(1, 0));  // completes step 0; step 1 is held
  EXPECT_EQ(table->Info().applied_steps(), 1);

  absl::Duration pause;
  auto image = table->Capture(1, Generous(), &pause);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ((*image)->header.applied_steps(), 1);
  const StagingArray& captured = (*image)->arrays[0];
  EXPECT_TRUE(
      BitwiseEqual(std::vector<float>(captured.begin(), captured.end()), ExpectedBspDense(1)));
  EXPECT_EQ(table->Info().applied_steps(), 2) << "the held step was not applied after capture";
  EXPECT_TRUE(BitwiseEqual(ReadDense(shard, 1), ExpectedBspDense(2)));
}

TEST_F(SnapshotterTest, HoldOnAStepAlreadyAppliedIsRefusedAndReleaseResumes) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::BSP)).ok());
  DenseTable* table = Dense(shard, 1);
  PushDenseSlice(shard, 1, 0, 0, BspDenseGrad(0, 0));
  absl::Status s = table->HoldStep(0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_TRUE(table->HoldStep(2).ok());
  PushDenseSlice(shard, 1, 0, 1, BspDenseGrad(0, 1));
  PushDenseSlice(shard, 1, 0, 2, BspDenseGrad(0, 2));
  EXPECT_EQ(table->Info().applied_steps(), 2);
  table->ReleaseStep(2);
  EXPECT_EQ(table->Info().applied_steps(), 3);
}

TEST_F(SnapshotterTest, BspSnapshotTimesOutWhenTheStepIsNotReached) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::BSP)).ok());
  auto snapshotter = Make(&shard);
  ASSERT_NE(snapshotter, nullptr);
  PushDenseSlice(shard, 1, 0, 0, std::vector<float>(8, 1.0f));
  auto r = snapshotter->Snapshot(Request(1), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker 1"));
  EXPECT_FALSE(snapshotter->Status().in_progress());
  // The table is not left holding a step: worker 1's push completes step 0 as usual.
  PushDenseSlice(shard, 1, 1, 0, std::vector<float>(8, 1.0f));
  EXPECT_EQ(Dense(shard, 1)->Info().applied_steps(), 1);
  PushDenseSlice(shard, 1, 0, 1, std::vector<float>(8, 1.0f));
  PushDenseSlice(shard, 1, 1, 1, std::vector<float>(8, 1.0f));
  EXPECT_EQ(Dense(shard, 1)->Info().applied_steps(), 2);
  EXPECT_THAT(ListedSteps(*snapshotter), ElementsAre());
}

// A request for a step a BSP table has passed is part of the coordinator's protocol (it lands
// after the step; the coordinator asks again): refused and counted as such, not as a failed
// snapshot (which made an alert on failures fire once per shard on every healthy run), while
// a capture that waits in vain is a failure.
TEST_F(SnapshotterTest, ARequestForAPassedStepIsRefusedNotFailed) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::BSP)).ok());
  ASSERT_TRUE(shard.CreateTable(SgdSpec(2, TableSpec::DENSE, ConsistencyConfig::BSP)).ok());
  auto snapshotter = Make(&shard);
  ASSERT_NE(snapshotter, nullptr);
  for (int64_t step = 0; step < 3; ++step) {
    PushDenseSlice(shard, 1, 0, step, std::vector<float>(8, 1.0f));
    PushDenseSlice(shard, 2, 0, step, std::vector<float>(8, 1.0f));
  }
  auto passed = snapshotter->Snapshot(Request(1), Generous());
  EXPECT_EQ(passed.status().code(), absl::StatusCode::kFailedPrecondition) << passed.status();
  EXPECT_EQ(snapshotter->Counters().refused, 1u);
  EXPECT_EQ(snapshotter->Counters().failed, 0u);
  EXPECT_FALSE(snapshotter->Status().in_progress());
  // Nothing is left held: the next steps apply, and the step reached is taken as usual.
  PushDenseSlice(shard, 1, 0, 3, std::vector<float>(8, 1.0f));
  PushDenseSlice(shard, 2, 0, 3, std::vector<float>(8, 1.0f));
  EXPECT_EQ(Dense(shard, 2)->Info().applied_steps(), 4);
  ASSERT_TRUE(snapshotter->Snapshot(Request(4), Generous()).ok());
  ASSERT_TRUE(snapshotter->AwaitIdle(Generous()));
  EXPECT_EQ(snapshotter->Counters().completed, 1u);
  // A capture that waits for a step no one pushes is a failure.
  auto waited = snapshotter->Snapshot(Request(5), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded) << waited.status();
  EXPECT_EQ(snapshotter->Counters().failed, 1u);
  EXPECT_EQ(snapshotter->Counters().refused, 1u);
}

TEST_F(SnapshotterTest, SnapshotErrors) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  shard.RegisterWorker(1);
  ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::BSP)).ok());
  auto snapshotter = Make(&shard);
  ASSERT_NE(snapshotter, nullptr);
  for (int32_t w : {0, 1}) {
    for (int64_t step : {0, 1}) PushDenseSlice(shard, 1, w, step, std::vector<float>(8, 0.25f));
  }
  ASSERT_EQ(Dense(shard, 1)->Info().applied_steps(), 2);

  auto r = snapshotter->Snapshot(Request(1), Generous());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("already applied"));
  EXPECT_FALSE(snapshotter->Status().in_progress());

  r = snapshotter->Snapshot(Request(-1), Generous());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  SnapshotAndWait(*snapshotter, Request(2));  // the current step: captured at once
  r = snapshotter->Snapshot(Request(2), Generous());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
  EXPECT_THAT(ListedSteps(*snapshotter), ElementsAre(2));
  EXPECT_EQ(snapshotter->Status().last_complete_step(), 2);
}

TEST_F(SnapshotterTest, SecondSnapshotWhileWritingIsRefused) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  TableSpec spec = SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::ASP);
  spec.set_size(kDenseBlockValues * 8);  // 8 blocks: >= 160 ms of delay
  ASSERT_TRUE(shard.CreateTable(spec).ok());
  SnapshotterOptions o = Options();
  o.test_delay_per_block = absl::Milliseconds(20);
  auto snapshotter = Make(&shard, o);
  ASSERT_NE(snapshotter, nullptr);

  auto r = snapshotter->Snapshot(Request(1), Generous());
  ASSERT_TRUE(r.ok()) << r.status();
  SnapshotStatusResponse st = snapshotter->Status();
  EXPECT_TRUE(st.in_progress());
  EXPECT_EQ(st.step(), 1);
  EXPECT_EQ(st.bytes_total(), r->bytes());
  EXPECT_EQ(st.last_complete_step(), -1);
  auto listed = snapshotter->List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->snapshots_size(), 1);
  EXPECT_EQ(listed->snapshots(0).step(), 1);
  EXPECT_FALSE(listed->snapshots(0).complete());

  auto second = snapshotter->Snapshot(Request(2), Generous());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("still being written"));

  ASSERT_TRUE(snapshotter->AwaitIdle(Generous()));
  st = snapshotter->Status();
  EXPECT_FALSE(st.in_progress());
  EXPECT_EQ(st.last_complete_step(), 1);
  EXPECT_EQ(st.last_error(), "");
  EXPECT_EQ(st.bytes_written(), spec.size() * sizeof(float));
  EXPECT_THAT(ListedSteps(*snapshotter), ElementsAre(1));

  // Once idle, the next one goes ahead.
  SnapshotAndWait(*snapshotter, Request(2));
  EXPECT_THAT(ListedSteps(*snapshotter), ElementsAre(1, 2));
}

// ---------------------------------------------------------------------------------------
// Resharding.

class ReshardTest : public SnapshotterTest {
 protected:
  static constexpr uint64_t kSize = kDenseBlockValues * 2 + 77;
  static constexpr uint32_t kDim = 3;

  static std::vector<uint64_t> Keys() {
    std::vector<uint64_t> k;
    for (uint64_t i = 0; i < 300; ++i) k.push_back(i * 31 + 7);
    k.push_back(uint64_t{1} << 50);
    k.push_back(~uint64_t{0});
    return k;
  }

  // Creates the tables on `shard`, registers workers 0 and 1, runs two ASP steps.
  static void Train(Shard& shard) {
    shard.RegisterWorker(0);
    shard.RegisterWorker(1);
    ASSERT_TRUE(shard.CreateTable(DenseAdamSpec(1, kSize)).ok());
    ASSERT_TRUE(shard.CreateTable(SparseAdagradSpec(2, kDim)).ok());
    const uint32_t id = shard.options().shard_id, n = shard.options().num_shards;
    for (int step = 0; step < 2; ++step) {
      PushDenseSlice(shard, 1, step, step, DenseGrads(kSize, step));
      std::vector<uint64_t> keys = Owned(Keys(), id, n);
      // Every other key only in step 0: per-row update counts differ.
      if (step == 1) keys.resize(keys.size() / 2);
      PushSparse(shard, 2, step, step, keys, SparseGrads(keys, kDim, step));
    }
  }

  // The concatenation of the dense slices of `shards` (ascending ids).
  static std::vector<float> DenseWhole(const std::vector<Shard*>& shards) {
    std::vector<float> out;
    for (Shard* s : shards) {
      std::vector<float> part = ReadDense(*s, 1);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  // key -> row, each read from its owner; also checks each shard holds exactly its keys.
  static std::map<uint64_t, std::vector<float>> SparseRows(const std::vector<Shard*>& shards) {
    std::map<uint64_t, std::vector<float>> rows;
    const uint32_t n = static_cast<uint32_t>(shards.size());
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; ++i) {
      EXPECT_EQ(shards[i]->options().num_shards, n);
      std::vector<uint64_t> owned = Owned(Keys(), i, n);
      SparseTable* t = Sparse(*shards[i], 2);
      if (t == nullptr) continue;
      // Before reading (a read creates missing rows): exactly the owned rows are there.
      EXPECT_EQ(t->Info().num_rows(), owned.size()) << "shard " << i << " of " << n;
      total += t->Info().num_rows();
      std::vector<float> v = ReadSparse(*shards[i], 2, owned);
      for (size_t r = 0; r < owned.size(); ++r) {
        rows[owned[r]].assign(v.begin() + r * kDim, v.begin() + (r + 1) * kDim);
      }
    }
    EXPECT_EQ(total, Keys().size());
    return rows;
  }

  // The same next step on any layout: whole dense gradient, every key.
  static void NextStep(const std::vector<Shard*>& shards) {
    const uint32_t n = static_cast<uint32_t>(shards.size());
    for (uint32_t i = 0; i < n; ++i) {
      PushDenseSlice(*shards[i], 1, 1, 7, DenseGrads(kSize, 50));
      std::vector<uint64_t> keys = Owned(Keys(), i, n);
      PushSparse(*shards[i], 2, 0, 7, keys, SparseGrads(keys, kDim, 50));
    }
  }

  static void ExpectSameRows(const std::map<uint64_t, std::vector<float>>& want,
                             const std::map<uint64_t, std::vector<float>>& got) {
    ASSERT_EQ(want.size(), got.size());
    for (const auto& [key, row] : want) {
      auto it = got.find(key);
      ASSERT_NE(it, got.end()) << key;
      EXPECT_TRUE(BitwiseEqual(row, it->second)) << "key " << key;
    }
  }

  // Shards 0 and 1 of 2 train and snapshot `step`; their snapshotters are then closed.
  void OldCluster(Shard& s0, Shard& s1, std::vector<int64_t> steps) {
    Train(s0);
    Train(s1);
    auto snap0 = Make(&s0), snap1 = Make(&s1);
    ASSERT_NE(snap0, nullptr);
    ASSERT_NE(snap1, nullptr);
    for (int64_t step : steps) {
      SnapshotAndWait(*snap0, Request(step));
      SnapshotAndWait(*snap1, Request(step));
    }
  }
};

TEST_F(ReshardTest, TwoShardsRestoreIntoThreeAndIntoOne) {
  Shard old0(ShardOptions{0, 2}), old1(ShardOptions{1, 2});
  OldCluster(old0, old1, {5});
  const std::vector<Shard*> old = {&old0, &old1};
  const std::vector<float> dense = DenseWhole(old);
  ASSERT_EQ(dense.size(), kSize);
  const auto rows = SparseRows(old);

  // 2 -> 3. New shards 0 and 1 own the old directories; new shard 2 starts an empty one.
  std::vector<std::unique_ptr<Shard>> three;
  std::vector<std::unique_ptr<Snapshotter>> three_snap;
  for (uint32_t i = 0; i < 3; ++i) {
    three.push_back(std::make_unique<Shard>(ShardOptions{i, 3}));
    three_snap.push_back(Make(three.back().get()));
    ASSERT_NE(three_snap.back(), nullptr);
  }
  std::vector<Shard*> new3;
  for (uint32_t i = 0; i < 3; ++i) {
    auto step = three_snap[i]->Restore("latest");
    ASSERT_TRUE(step.ok()) << "shard " << i << ": " << step.status();
    EXPECT_EQ(*step, 5);
    EXPECT_EQ(three_snap[i]->Status().restored_step(), 5);
    new3.push_back(three[i].get());
    const Range r = Dense(*three[i], 1)->range();
    EXPECT_TRUE(r == DenseShardRange(kSize, i, 3));
    EXPECT_TRUE(BitwiseEqual(ReadDense(*three[i], 1),
                             std::vector<float>(dense.begin() + r.begin, dense.begin() + r.end)))
        << "shard " << i;
    // Workers known from the snapshot can push at once.
    EXPECT_TRUE(three[i]->GetDense(1, 1).ok());
    EXPECT_TRUE(three[i]->GetSparse(2, 0).ok());
  }
  EXPECT_TRUE(BitwiseEqual(DenseWhole(new3), dense));
  ExpectSameRows(rows, SparseRows(new3));
  three_snap.clear();  // new shards 0/1 hold the old directories read-write

  // 2 -> 1.
  Shard one(ShardOptions{0, 1});
  {
    auto snap = Make(&one);
    ASSERT_NE(snap, nullptr);
    auto step = snap->Restore("5");
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 5);
  }
  EXPECT_TRUE(BitwiseEqual(ReadDense(one, 1), dense));
  ExpectSameRows(rows, SparseRows({&one}));

  // The next step agrees bitwise on every layout: optimizer state and counts moved too.
  NextStep(old);
  NextStep(new3);
  NextStep({&one});
  const std::vector<float> after = DenseWhole(old);
  EXPECT_FALSE(BitwiseEqual(after, dense));
  EXPECT_TRUE(BitwiseEqual(DenseWhole(new3), after));
  EXPECT_TRUE(BitwiseEqual(ReadDense(one, 1), after));
  const auto rows_after = SparseRows(old);
  ExpectSameRows(rows_after, SparseRows(new3));
  ExpectSameRows(rows_after, SparseRows({&one}));
}

TEST_F(ReshardTest, CheckpointMissingAShardIsNotRestorable) {
  {
    Shard old0(ShardOptions{0, 2}), old1(ShardOptions{1, 2});
    OldCluster(old0, old1, {5});
  }
  std::filesystem::remove_all(ShardSnapshotDir(root_, 1));

  for (uint32_t n : {1u, 2u}) {
    Shard shard(ShardOptions{0, n});
    auto snap = Make(&shard);
    ASSERT_NE(snap, nullptr);
    auto r = snap->Restore("5");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("restorable steps: []"));
    auto latest = snap->Restore("latest");
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(*latest, -1);
    EXPECT_TRUE(shard.Tables().empty());
    EXPECT_EQ(snap->Status().restored_step(), -1);
  }
}

TEST_F(ReshardTest, LatestIsTheNewestStepEveryOldShardHas) {
  Shard old0(ShardOptions{0, 2}), old1(ShardOptions{1, 2});
  OldCluster(old0, old1, {3, 5});
  const std::vector<float> dense = DenseWhole({&old0, &old1});
  {
    // Shard 1 lost step 5 (say it crashed while writing it).
    auto store = SnapshotStore::Open(ShardSnapshotDir(root_, 1));
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Delete(5).ok());
  }
  Shard shard(ShardOptions{0, 1});
  auto snap = Make(&shard);
  ASSERT_NE(snap, nullptr);
  auto r = snap->Restore("5");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("restorable steps: [3]"));
  auto latest = snap->Restore("latest");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 3);
  EXPECT_TRUE(BitwiseEqual(ReadDense(shard, 1), dense));  // no pushes between 3 and 5
}

// Regression: --restore_skip_damaged restored the newest snapshot that verifies, but the
// newer one whose data was damaged (its manifest verifies, so only reading it whole finds
// the damage) stayed listed as complete: ListSnapshots, and so PsClient's latest complete
// snapshot, kept offering it. Once a restore has found it damaged it is named as such, no
// longer listed or counted as the last complete step, and its file is neither deleted
// nor written over.
TEST_F(SnapshotterTest, SnapshotFoundDamagedByARestoreIsNoLongerListed) {
  Shard a(ShardOptions{0, 1});
  a.RegisterWorker(0);
  ASSERT_TRUE(a.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::ASP)).ok());
  auto writer = Make(&a);
  ASSERT_NE(writer, nullptr);
  PushDenseSlice(a, 1, 0, 0, DenseGrads(8, 0));
  SnapshotAndWait(*writer, Request(1));
  const std::vector<float> at1 = ReadDense(a, 1);
  PushDenseSlice(a, 1, 0, 1, DenseGrads(8, 1));
  SnapshotAndWait(*writer, Request(2));
  writer.reset();

  // A bit of step 2's last data record flipped: the record just before the manifest, whose
  // offset the footer holds (and whose own checksum takes the last 4 bytes before it).
  const std::string path = FileSnapshotStore::SnapshotPath(ShardSnapshotDir(root_, 0), 2);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 16u);
  uint64_t manifest_at = 0;
  std::memcpy(&manifest_at, bytes.data() + bytes.size() - 16, 8);
  ASSERT_GT(manifest_at, 8u + 4u);
  bytes[manifest_at - 5] ^= 0x10;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  Shard b(ShardOptions{0, 1});
  SnapshotterOptions options = Options();
  options.skip_damaged = true;
  auto restorer = Make(&b, options);
  ASSERT_NE(restorer, nullptr);
  auto restored = restorer->Restore("latest");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 1);
  EXPECT_EQ(ReadDense(b, 1), at1);

  EXPECT_THAT(ListedSteps(*restorer), ElementsAre(1)) << "the damaged snapshot is still offered";
  EXPECT_EQ(restorer->Status().last_complete_step(), 1);
  auto by_step = restorer->Load("2");
  EXPECT_EQ(by_step.status().code(), absl::StatusCode::kNotFound) << by_step.status();
  EXPECT_THAT(
      std::string(by_step.status().message()),
      AllOf(HasSubstr("restorable steps: [1]"), HasSubstr(path), HasSubstr("fails its checksum")));

  // A new snapshot of step 2 does not replace the damaged file; it says why.
  auto again = restorer->Snapshot(Request(2), Generous());
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(restorer->AwaitIdle(Generous()));
  EXPECT_THAT(restorer->Status().last_error(), AllOf(HasSubstr(path), HasSubstr("damaged")));
  EXPECT_THAT(ListedSteps(*restorer), ElementsAre(1));
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), bytes)
      << "the damaged snapshot file was changed";
}

TEST_F(SnapshotterTest, RestoreFromEmptyRoot) {
  Shard shard(ShardOptions{0, 1});
  auto snap = Make(&shard);
  ASSERT_NE(snap, nullptr);
  auto latest = snap->Restore("latest");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, -1);
  auto bad = snap->Restore("abc");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound) << bad.status();
  EXPECT_THAT(bad.status().message(), HasSubstr("abc"));
  auto missing = snap->Restore("7");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_EQ(snap->Status().restored_step(), -1);
  EXPECT_TRUE(shard.Tables().empty());
}

TEST_F(SnapshotterTest, RetentionKeepsLastAndBest) {
  for (bool lower_is_better : {true, false}) {
    SCOPED_TRACE(lower_is_better ? "lower is better" : "higher is better");
    Shard shard(ShardOptions{0, 1});
    shard.RegisterWorker(0);
    ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::ASP)).ok());
    SnapshotterOptions o = Options();
    o.root = root_ + (lower_is_better ? "/lower" : "/higher");
    o.keep_last = 2;
    o.lower_metric_is_better = lower_is_better;
    auto snap = Make(&shard, o);
    ASSERT_NE(snap, nullptr);
    const double metrics[] = {3, 1, 4, 5, 9};
    for (int64_t step = 1; step <= 5; ++step) {
      PushDenseSlice(shard, 1, 0, step, std::vector<float>(8, 0.5f));
      SnapshotAndWait(*snap, Request(step, metrics[step - 1]));
    }
    auto list = snap->List();
    ASSERT_TRUE(list.ok()) << list.status();
    std::vector<int64_t> steps;
    for (const SnapshotInfo& i : list->snapshots()) {
      steps.push_back(i.step());
      EXPECT_TRUE(i.complete());
      EXPECT_TRUE(i.has_metric());
      EXPECT_EQ(i.metric(), metrics[i.step() - 1]);
    }
    if (lower_is_better) {
      EXPECT_THAT(steps, ElementsAre(2, 4, 5));
    } else {
      EXPECT_THAT(steps, ElementsAre(4, 5));
    }
  }
}

TEST_F(SnapshotterTest, KeepStepsFromTheCoordinatorOverrideTheShardsOwnRetention) {
  Shard shard(ShardOptions{0, 1});
  shard.RegisterWorker(0);
  ASSERT_TRUE(shard.CreateTable(SgdSpec(1, TableSpec::DENSE, ConsistencyConfig::ASP)).ok());
  SnapshotterOptions o = Options();
  o.root = root_ + "/coordinated";
  o.keep_last = 1;  // the shard alone would keep only the newest
  auto snap = Make(&shard, o);
  ASSERT_NE(snap, nullptr);
  for (int64_t step = 1; step <= 4; ++step) {
    PushDenseSlice(shard, 1, 0, step, std::vector<float>(8, 0.5f));
    SnapshotRequest r = Request(step, 0);
    for (int64_t kept : {int64_t{1}, step - 1}) r.add_keep_steps(kept);  // this step is kept too
    SnapshotAndWait(*snap, r);
  }
  auto list = snap->List();
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<int64_t> steps;
  for (const SnapshotInfo& i : list->snapshots()) steps.push_back(i.step());
  EXPECT_THAT(steps, ElementsAre(1, 3, 4));
}

}  // namespace
}  // namespace pscluster::ps
