// PS mode and live switches through real ps_server processes: two shards, two workers as
// threads (Gloo on loopback). One and ten PS steps match the single-process reference; a
// run that switches PS -> ALLREDUCE -> FSDP -> PIPELINE -> PS matches it too; and a state
// handed to the shards and back (ALLREDUCE -> PS -> ALLREDUCE) keeps every optimizer slot
// and the update count bitwise.
#include <set>

#include "tests/ps_cluster_fixture.h"
#include "worker/modes/mode_testing.h"
#include "worker/modes/model_tables.h"

namespace pscluster {
namespace {

using modes::Mode;
using modes::ModelState;
using modes::Trainer;
using modes::TrainerOptions;
using modes::testing::ExpectNear;
using modes::testing::OnRanks;
using modes::testing::Options;
using modes::testing::Reference;

class ModesSwitchTest : public PsClusterTest {
 protected:
  std::function<TrainerOptions(int)> WithShards(Mode mode, ps::OptimizerConfig::Kind kind) {
    return [this, mode, kind](int r) {
      TrainerOptions o = Options(mode, r, kWorkers, kind);
      o.shards = addresses_;
      o.rpc_timeout = absl::Seconds(60);
      return o;
    };
  }
};

TEST_F(ModesSwitchTest, PsModeMatchesTheSingleProcessReference) {
  auto options = WithShards(coord::PS, ps::OptimizerConfig::MOMENTUM);
  const ModelState one = Reference(options(0), 1), ten = Reference(options(0), 10);
  OnRanks(kWorkers, options,
          [&](int r, Trainer& t) { modes::testing::ExpectOneAndTenStepsMatch(t, r, one, ten); });
}

// The embedding test model in PS mode: its table is a sparse table on the shards; each step
// pulls the rows the batch touches and pushes their gradients, and the run matches the
// single-process reference (which steps a row only when the global batch touches it).
TEST_F(ModesSwitchTest, EmbeddingModelInPsModeMatchesTheSingleProcessReference) {
  auto options = [this](int r) {
    TrainerOptions o =
        modes::testing::EmbeddingOptions(coord::PS, r, kWorkers, ps::OptimizerConfig::MOMENTUM);
    o.shards = addresses_;
    o.rpc_timeout = absl::Seconds(60);
    return o;
  };
  const ModelState one = Reference(options(0), 1), ten = Reference(options(0), 10);
  OnRanks(kWorkers, options, [&](int r, Trainer& t) {
    modes::testing::ExpectOneAndTenStepsMatch(t, r, one, ten, /*with_slots=*/false);
  });
}

// PS mode pulls only the rows a batch touches: the shards served exactly the rows of each
// worker's batches, step by step, and materialised only the rows some batch touched.
TEST_F(ModesSwitchTest, EmbeddingModelInPsModePullsOnlyTheRowsABatchTouches) {
  constexpr int kSteps = 10;
  auto options = [this](int r) {
    TrainerOptions o =
        modes::testing::EmbeddingOptions(coord::PS, r, kWorkers, ps::OptimizerConfig::ADAGRAD);
    o.model.embedding.buckets = 64;  // 256 rows: the tails stay untouched
    o.shards = addresses_;
    o.rpc_timeout = absl::Seconds(60);
    return o;
  };
  OnRanks(kWorkers, options, [&](int, Trainer& t) {
    for (int64_t step = 0; step < kSteps; ++step) ASSERT_TRUE(t.Step(step).ok());
  });
  // The rows each (worker, step) touches, from the model itself.
  const TrainerOptions o = options(0);
  auto def = *model::MakeModelDef(o.model, o.seed);
  auto backend = compute::MakeCpuBackend(1);
  auto m = *def->Create(backend.get(), model::WholeModel(o.batch_size));
  uint64_t rows_pulled = 0;
  std::set<uint64_t> touched;
  for (int r = 0; r < kWorkers; ++r) {
    auto it =
        *data::BatchIterator::Create(&modes::testing::Data(), r, kWorkers, o.batch_size, o.seed);
    data::Batch b;
    for (int step = 0; step < kSteps; ++step) {
      it.Next(&b);
      const std::vector<uint64_t> keys = m->Keys(0, b.x.data(), b.size);
      rows_pulled += keys.size();
      touched.insert(keys.begin(), keys.end());
    }
  }
  const model::EmbeddingSpec& emb = def->spec().embeddings[0];
  ASSERT_LT(touched.size(), emb.vocab) << "pick data whose batches leave some rows untouched";
  const uint32_t table = modes::ModelTables(def->spec()).sparse(0);
  auto stats = clients_[0]->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  uint64_t bytes = 0, rows = 0;
  for (const ps::StatsResponse& shard : *stats) {
    for (const ps::TableStats& ts : shard.tables()) {
      if (ts.info().spec().table_id() != table) continue;
      bytes += ts.bytes_pulled();
      rows += ts.info().num_rows();
    }
  }
  EXPECT_EQ(bytes, rows_pulled * emb.dim * sizeof(float));
  EXPECT_EQ(rows, touched.size());
}

TEST_F(ModesSwitchTest, SwitchingThroughEveryModeAndBackToPsMatchesTheReference) {
  auto options = WithShards(coord::PS, ps::OptimizerConfig::MOMENTUM);
  const ModelState want = Reference(options(0), 15);
  OnRanks(kWorkers, options, [&](int r, Trainer& t) {
    const Mode order[] = {coord::PS, coord::ALLREDUCE, coord::FSDP, coord::PIPELINE, coord::PS};
    for (int64_t step = 0; step < 15; ++step) {
      if (step % 3 == 0 && step > 0) {
        absl::Status s = t.SwitchTo(order[step / 3], step);
        ASSERT_TRUE(s.ok()) << "switch at step " << step << ": " << s;
      }
      auto loss = t.Step(step);
      ASSERT_TRUE(loss.ok()) << "step " << step << " in " << coord::ModeName(t.mode()) << ": "
                             << loss.status();
    }
    ASSERT_EQ(t.mode(), coord::PS);
    auto got = t.State(15);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectNear(*got, want, 2e-6f, absl::StrCat("rank ", r));
  });
}

// The GPT (its head's pipeline stage holds a copy of the tied embedding) through every
// mode: PS -> ALLREDUCE -> FSDP -> PIPELINE -> TENSOR -> PS every 3 steps matches the
// reference.
TEST_F(ModesSwitchTest, GptSwitchingThroughEveryModeMatchesTheReference) {
  auto options = [this](int r) {
    TrainerOptions o =
        modes::testing::GptOptions(coord::PS, r, kWorkers, ps::OptimizerConfig::MOMENTUM);
    o.shards = addresses_;
    o.rpc_timeout = absl::Seconds(60);
    return o;
  };
  const ModelState want = Reference(options(0), 18);
  OnRanks(kWorkers, options, [&](int r, Trainer& t) {
    const Mode order[] = {coord::PS,       coord::ALLREDUCE, coord::FSDP,
                          coord::PIPELINE, coord::TENSOR,    coord::PS};
    for (int64_t step = 0; step < 18; ++step) {
      if (step % 3 == 0 && step > 0) {
        absl::Status s = t.SwitchTo(order[step / 3], step);
        ASSERT_TRUE(s.ok()) << "switch at step " << step << ": " << s;
      }
      auto loss = t.Step(step);
      ASSERT_TRUE(loss.ok()) << "step " << step << ": " << loss.status();
    }
    auto got = t.State(18);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectNear(*got, want, 1e-5f, absl::StrCat("rank ", r));
  });
}

TEST_F(ModesSwitchTest, StateHandedToTheShardsAndBackIsBitwiseTheSame) {
  auto options = WithShards(coord::ALLREDUCE, ps::OptimizerConfig::ADAM);
  OnRanks(kWorkers, options, [&](int r, Trainer& t) {
    for (int64_t step = 0; step < 4; ++step) ASSERT_TRUE(t.Step(step).ok());
    auto before = t.State(4);
    ASSERT_TRUE(before.ok());
    ASSERT_TRUE(t.SwitchTo(coord::PS, 4).ok());
    auto in_ps = t.State(4);  // exported from the shards
    ASSERT_TRUE(in_ps.ok()) << in_ps.status();
    ExpectNear(*in_ps, *before, 0.0f, absl::StrCat("rank ", r, " in the shards"));
    ASSERT_TRUE(t.SwitchTo(coord::ALLREDUCE, 4).ok());
    auto back = t.State(4);
    ASSERT_TRUE(back.ok());
    ExpectNear(*back, *before, 0.0f, absl::StrCat("rank ", r, " back in allreduce"));
    // And training goes on from there in PS mode: the shards accept step 4.
    ASSERT_TRUE(t.SwitchTo(coord::PS, 4).ok());
    auto loss = t.Step(4);
    ASSERT_TRUE(loss.ok()) << loss.status();
  });
}

}  // namespace
}  // namespace pscluster
