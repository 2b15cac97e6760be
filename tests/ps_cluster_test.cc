// Two real ps_server processes on loopback, driven through PsClient from two concurrent
// workers: every optimizer on dense and sparse tables, checked exactly against a reference
// computed here; then every kind of bad request, checked for its error and for leaving the
// state unchanged.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps/ps_client.h"
#include "core/init/initializer.h"
#include "core/optimizer/optimizer_config.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/ps_cluster_fixture.h"
#include "tests/test_tables.h"

namespace pscluster {
namespace {

using ps::OptimizerConfig;
using ps::TableSpec;
using ::testing::HasSubstr;

// The reference: one optimizer over plain vectors, fed the BSP sum (worker-id order).
struct Reference {
  explicit Reference(const OptimizerConfig& c, size_t n) : values(n) {
    opt = *core::MakeOptimizer(c);
    for (int k = 0; k < opt->num_slots(); ++k) slots.emplace_back(n, opt->slot_initial_value(k));
  }
  void Apply(size_t at, const float* g, size_t n, int64_t step) {
    float* s[8];
    for (size_t k = 0; k < slots.size(); ++k) s[k] = slots[k].data() + at;
    opt->Apply(values.data() + at, g, s, n, step);
  }
  std::unique_ptr<core::Optimizer> opt;
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

TEST_F(PsClusterTest, DenseTablesMatchReferenceForEveryOptimizer) {
  uint32_t id = 1;
  for (const OptimizerConfig& opt : AllOptimizers()) {
    // 300001 values: streamed in 64 KiB chunks; the odd size splits unevenly across shards.
    for (uint64_t size : {uint64_t{37}, uint64_t{300001}}) {
      SCOPED_TRACE(absl::StrCat(OptimizerConfig::Kind_Name(opt.kind()), " size ", size));
      TableSpec spec = Spec(id++, TableSpec::DENSE, opt);
      spec.set_size(size);
      OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->CreateTable(spec).ok()); });
      Reference ref(opt, size);
      core::InitDense(spec.initializer(), 0, absl::MakeSpan(ref.values));
      for (int t = 0; t < kSteps; ++t) {
        std::vector<std::vector<float>> pulled(kWorkers, std::vector<float>(size));
        OnAllWorkers([&](int w) {
          ASSERT_TRUE(clients_[w]->PullDense(spec.table_id(), t, absl::MakeSpan(pulled[w])).ok());
          std::vector<float> g(size);
          for (uint64_t i = 0; i < size; ++i) g[i] = Grad(w, t, i);
          absl::Status s = clients_[w]->PushDense(spec.table_id(), t, g);
          ASSERT_TRUE(s.ok()) << s;
        });
        for (int w = 0; w < kWorkers; ++w) ASSERT_EQ(pulled[w], ref.values) << "step " << t;
        std::vector<float> sum(size);
        for (uint64_t i = 0; i < size; ++i) sum[i] = Grad(0, t, i) + Grad(1, t, i);
        ref.Apply(0, sum.data(), size, t + 1);
      }
      std::vector<float> final_values(size);
      ASSERT_TRUE(
          clients_[0]->PullDense(spec.table_id(), kSteps, absl::MakeSpan(final_values)).ok());
      EXPECT_EQ(final_values, ref.values);  // bitwise
    }
  }
}

// PullDenseMany/PushDenseMany/PushPullDenseMany: several tables per RPC (one per shard), and the
// per-table fallback for a share over the client's chunk size (64 KiB here), bitwise like the
// single-table calls. The 1-value table has nothing on shard 1, whose clock for it must move
// all the same: the single-table pulls at the end wait on every shard's clock.
TEST_F(PsClusterTest, ManyTablesPerCallMatchReference) {
  const OptimizerConfig opt = AllOptimizers()[3];  // Adam
  const std::vector<uint64_t> sizes = {37, 1001, 300001, 5, 1};
  std::vector<uint32_t> ids;
  std::vector<Reference> refs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    TableSpec spec = Spec(100 + k, TableSpec::DENSE, opt);
    spec.set_size(sizes[k]);
    OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->CreateTable(spec).ok()); });
    ids.push_back(spec.table_id());
    refs.emplace_back(opt, sizes[k]);
    core::InitDense(spec.initializer(), 0, absl::MakeSpan(refs.back().values));
  }
  for (int t = 0; t < kSteps; ++t) {
    OnAllWorkers([&](int w) {
      std::vector<std::vector<float>> pulled, grads;
      std::vector<absl::Span<float>> out;
      std::vector<absl::Span<const float>> in;
      for (uint64_t n : sizes) pulled.emplace_back(n), grads.emplace_back(n);
      for (size_t k = 0; k < sizes.size(); ++k) {
        out.emplace_back(absl::MakeSpan(pulled[k]));
        for (uint64_t i = 0; i < sizes[k]; ++i) grads[k][i] = Grad(w, t, i + k);
        in.emplace_back(grads[k]);
      }
      absl::Status s = clients_[w]->PullDenseMany(t, ids, out);
      ASSERT_TRUE(s.ok()) << s;
      for (size_t k = 0; k < sizes.size(); ++k) {
        ASSERT_EQ(pulled[k], refs[k].values) << "table " << ids[k] << " step " << t;
      }
      s = clients_[w]->PushDenseMany(t, ids, in);
      ASSERT_TRUE(s.ok()) << s;
    });
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> sum(sizes[k]);
      for (uint64_t i = 0; i < sizes[k]; ++i) sum[i] = Grad(0, t, i + k) + Grad(1, t, i + k);
      refs[k].Apply(0, sum.data(), sizes[k], t + 1);
    }
  }
  // PushPullDenseMany: step t's push and step t + 1's values in one call (in place).
  for (int t = kSteps; t < kSteps + 2; ++t) {
    std::vector<std::vector<std::vector<float>>> got(kWorkers);
    OnAllWorkers([&](int w) {
      std::vector<absl::Span<const float>> in;
      std::vector<absl::Span<float>> out;
      for (size_t k = 0; k < sizes.size(); ++k) {
        got[w].emplace_back(sizes[k]);
        for (uint64_t i = 0; i < sizes[k]; ++i) got[w][k][i] = Grad(w, t, i + k);
        in.emplace_back(got[w][k]);
        out.emplace_back(absl::MakeSpan(got[w][k]));
      }
      absl::Status s = clients_[w]->PushPullDenseMany(t, ids, in, out);
      ASSERT_TRUE(s.ok()) << s;
    });
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> sum(sizes[k]);
      for (uint64_t i = 0; i < sizes[k]; ++i) sum[i] = Grad(0, t, i + k) + Grad(1, t, i + k);
      refs[k].Apply(0, sum.data(), sizes[k], t + 1);
      for (int w = 0; w < kWorkers; ++w) {
        ASSERT_EQ(got[w][k], refs[k].values) << "table " << ids[k] << " after step " << t;
      }
    }
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> now(sizes[k]);
    absl::Status s = clients_[0]->PullDense(ids[k], kSteps + 2, absl::MakeSpan(now));
    ASSERT_TRUE(s.ok()) << "table " << ids[k] << ": " << s;
    EXPECT_EQ(now, refs[k].values) << "table " << ids[k];
  }
}

// A shard stopped for longer than a wait slice while a push/pull is on its way: the attempt
// whose slice ran out may have been dropped unread, so the next one pushes again; a shard
// that did take the first answers the repeat (same request id) with the pull alone. Either
// way the step is applied once. (Before, the later attempts only pulled: a push dropped with
// the first attempt was waited for until the deadline.) The wait check resumes the shard
// after the first slice ran out.
TEST_F(PsClusterTest, PushPullSurvivesAShardStoppedPastAWaitSlice) {
  const OptimizerConfig opt = AllOptimizers()[4];  // Adam
  constexpr uint64_t kSize = 10001;                // one batch message per shard
  TableSpec spec = Spec(300, TableSpec::DENSE, opt);
  spec.set_size(kSize);
  OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->CreateTable(spec).ok()); });
  Reference ref(opt, kSize);
  core::InitDense(spec.initializer(), 0, absl::MakeSpan(ref.values));
  std::vector<float> g0(kSize), g1(kSize), sum(kSize);
  for (uint64_t i = 0; i < kSize; ++i) {
    g0[i] = Grad(0, 0, i);
    g1[i] = Grad(1, 0, i);
    sum[i] = g0[i] + g1[i];
  }
  ref.Apply(0, sum.data(), kSize, 1);
  const std::vector<uint32_t> ids = {spec.table_id()};
  ASSERT_TRUE(clients_[1]->PushDenseMany(0, ids, {absl::MakeConstSpan(g1)}).ok());

  int checks = 0;
  PsClientOptions o;
  o.shard_addresses = addresses_;
  o.worker_id = 0;  // registered by the fixture's client of worker 0
  o.rpc_timeout = absl::Seconds(30);
  o.wait_slice = absl::Milliseconds(300);
  const pid_t stopped = servers_[1].pid();
  o.wait_check = [&checks, stopped] {
    if (checks++ == 0) kill(stopped, SIGCONT);
    return absl::OkStatus();
  };
  auto worker0 = PsClient::Create(o);
  ASSERT_TRUE(worker0.ok()) << worker0.status();
  // Stopped for good before the call (a bare kill() once let it answer first, under load).
  ASSERT_TRUE(servers_[1].Pause(absl::Seconds(30)).ok());
  std::vector<float> got = g0;
  absl::Status s =
      (*worker0)->PushPullDenseMany(0, ids, {absl::MakeConstSpan(g0)}, {absl::MakeSpan(got)});
  kill(stopped, SIGCONT);  // whatever happened
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GE(checks, 1);        // the stop outlasted a slice
  EXPECT_EQ(got, ref.values);  // bitwise: the step applied once, with both pushes
  std::vector<float> again(kSize);
  ASSERT_TRUE(clients_[1]->PullDense(spec.table_id(), 1, absl::MakeSpan(again)).ok());
  EXPECT_EQ(again, ref.values);
}

// A sparse push over what one message carries (160,000 rows of dim 16: ~5.8 MB a shard with
// their keys) goes to each shard in numbered parts, applied (ASP) or counted (BSP: both
// workers' rows summed once) at the last part. Before, gRPC refused the message on the way
// out, after the other shard had applied its part.
TEST_F(PsClusterTest, ASparsePushOverOneMessageGoesInParts) {
  const OptimizerConfig sgd = AllOptimizers()[0];  // lr 0.5
  std::vector<uint64_t> keys(160000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  const std::vector<float> grads(keys.size() * 16, 1.0f);
  TableSpec asp = Spec(320, TableSpec::SPARSE, sgd);
  asp.set_dim(16);
  asp.mutable_initializer()->set_kind(ps::InitializerConfig::ZEROS);
  asp.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  ASSERT_TRUE(clients_[0]->CreateTable(asp).ok());
  absl::Status s = clients_[0]->PushSparse(320, 0, keys, grads);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> rows(keys.size() * 16);
  ASSERT_TRUE(clients_[0]->PullSparse(320, 1, keys, absl::MakeSpan(rows)).ok());
  EXPECT_EQ(rows, std::vector<float>(rows.size(), -0.5f));

  TableSpec bsp = asp;
  bsp.set_table_id(321);
  bsp.set_name("t321");
  bsp.mutable_consistency()->set_mode(ps::ConsistencyConfig::BSP);
  OnAllWorkers([&](int w) {
    ASSERT_TRUE(clients_[w]->CreateTable(bsp).ok());
    absl::Status pushed = clients_[w]->PushSparse(321, 0, keys, grads);
    ASSERT_TRUE(pushed.ok()) << pushed;
  });
  ASSERT_TRUE(clients_[0]->PullSparse(321, 1, keys, absl::MakeSpan(rows)).ok());
  EXPECT_EQ(rows, std::vector<float>(rows.size(), -1.0f)) << "0.5 x (1 + 1), once";
}

// The same training with the shards' sparse rows in RAM and, with a RAM budget of about
// ten rows, mostly in their disk tier (ps_server --sparse_memory_bytes).
class SparseReferenceTest : public PsClusterTest, public ::testing::WithParamInterface<bool> {
 protected:
  std::vector<std::string> ServerArgs() override {
    if (!GetParam()) return {};
    const char* tmp = std::getenv("TEST_TMPDIR");
    return {"--sparse_memory_bytes=1024", "--sparse_tier_reserve_bytes=1048576",
            absl::StrCat("--sparse_tier_dir=", tmp != nullptr ? tmp : "/tmp", "/tier")};
  }
  void ExpectRowsWentToDiskAndBack(uint32_t table_id);
};
INSTANTIATE_TEST_SUITE_P(DiskTier, SparseReferenceTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "On" : "Off"; });

TEST_P(SparseReferenceTest, SparseTablesMatchReferenceForEveryOptimizer) {
  constexpr uint32_t kDim = 8;
  uint32_t id = 100;
  // Worker 0 touches keys 0..39 with a duplicate; worker 1 touches 20..59; overlap 20..39.
  auto keys_of = [](int w, int t) {
    std::vector<uint64_t> k;
    for (uint64_t i = 0; i < 40; ++i) k.push_back(i + 20 * w + (t % 2) * 1000003);
    k.push_back(k[3]);
    return k;
  };
  for (const OptimizerConfig& opt : AllOptimizers()) {
    SCOPED_TRACE(OptimizerConfig::Kind_Name(opt.kind()));
    TableSpec spec = Spec(id++, TableSpec::SPARSE, opt);
    spec.set_dim(kDim);
    OnAllWorkers([&](int w) { ASSERT_TRUE(clients_[w]->CreateTable(spec).ok()); });
    // Reference rows: each key has its own values, slots and update count.
    std::map<uint64_t, Reference> rows;
    std::map<uint64_t, int64_t> updates;
    auto row = [&](uint64_t key) -> Reference& {
      auto it = rows.find(key);
      if (it == rows.end()) {
        it = rows.emplace(key, Reference(opt, kDim)).first;
        core::InitSparseRow(spec.initializer(), key, absl::MakeSpan(it->second.values));
      }
      return it->second;
    };
    for (int t = 0; t < kSteps; ++t) {
      OnAllWorkers([&](int w) {
        std::vector<uint64_t> keys = keys_of(w, t);
        std::vector<float> g(keys.size() * kDim);
        for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(w, t, i);
        absl::Status s = clients_[w]->PushSparse(spec.table_id(), t, keys, g);
        ASSERT_TRUE(s.ok()) << s;
      });
      // Per key: each worker's duplicates summed in request order, then workers in id order.
      std::map<uint64_t, std::vector<float>> sum;
      for (int w = 0; w < kWorkers; ++w) {
        std::vector<uint64_t> keys = keys_of(w, t);
        std::map<uint64_t, std::vector<float>> mine;
        for (size_t i = 0; i < keys.size(); ++i) {
          auto& m = mine[keys[i]];
          if (m.empty()) m.assign(kDim, 0.0f);
          for (uint32_t j = 0; j < kDim; ++j) m[j] += Grad(w, t, i * kDim + j);
        }
        for (auto& [k, m] : mine) {
          auto [it, inserted] = sum.emplace(k, m);
          if (!inserted) {
            for (uint32_t j = 0; j < kDim; ++j) it->second[j] += m[j];
          }
        }
      }
      for (auto& [k, g] : sum) row(k).Apply(0, g.data(), kDim, ++updates[k]);
    }
    std::vector<uint64_t> all;
    for (auto& [k, r] : rows) all.push_back(k);
    all.push_back(777777777);  // never pushed: pulled as its initial value
    row(777777777);
    std::vector<float> got(all.size() * kDim);
    ASSERT_TRUE(clients_[1]->PullSparse(spec.table_id(), kSteps, all, absl::MakeSpan(got)).ok());
    for (size_t i = 0; i < all.size(); ++i) {
      std::vector<float> g(got.begin() + i * kDim, got.begin() + (i + 1) * kDim);
      EXPECT_EQ(g, rows.at(all[i]).values) << "key " << all[i];
    }
    if (GetParam()) ExpectRowsWentToDiskAndBack(spec.table_id());
  }
}

void SparseReferenceTest::ExpectRowsWentToDiskAndBack(uint32_t table_id) {
  auto stats = clients_[0]->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const ps::StatsResponse& shard : *stats) {
    for (const ps::TableStats& t : shard.tables()) {
      if (t.info().spec().table_id() != table_id) continue;
      EXPECT_GT(t.rows_on_disk(), 0u) << "shard " << shard.shard_id();
      EXPECT_GT(t.rows_from_disk(), 0u) << "shard " << shard.shard_id();
    }
  }
}

TEST_F(PsClusterTest, ConcurrentAsyncPushesLoseNoUpdate) {
  OptimizerConfig sgd;
  sgd.set_kind(OptimizerConfig::SGD);
  sgd.set_learning_rate(1.0f);
  TableSpec spec = Spec(200, TableSpec::DENSE, sgd);
  spec.set_size(50001);
  spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  spec.mutable_initializer()->set_kind(ps::InitializerConfig::ZEROS);
  ASSERT_TRUE(clients_[0]->CreateTable(spec).ok());
  constexpr int kThreadsPerWorker = 4, kPushes = 25;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    for (int k = 0; k < kThreadsPerWorker; ++k) {
      threads.emplace_back([&, w] {
        std::vector<float> g(spec.size(), -1.0f);
        for (int i = 0; i < kPushes; ++i) ASSERT_TRUE(clients_[w]->PushDense(200, i, g).ok());
      });
    }
  }
  for (auto& t : threads) t.join();
  std::vector<float> v(spec.size());
  ASSERT_TRUE(clients_[0]->PullDense(200, 0, absl::MakeSpan(v)).ok());
  EXPECT_EQ(v, std::vector<float>(spec.size(), float{kWorkers * kThreadsPerWorker * kPushes}));
}

}  // namespace
}  // namespace pscluster
