// PS mode with the parameter store in this process (server/ps/testing: a real shard's tables,
// clocks and optimizers, no gRPC), ranks as threads: the MLP, the GPT and the embedding test model
// match the single-process reference after 1 and 10 BSP steps, as through real ps_server
// processes (tests/modes_switch_test.cc); with overlap_push, the one-step-stale reference.
#include "server/ps/testing/in_process_parameter_store.h"
#include "worker/modes/mode_testing.h"
#include "worker/modes/model_tables.h"

namespace pscluster::modes {
namespace {

using testing::ExpectNear;
using testing::Reference;

// `world` PS placements over one in-process shard; checks 1 and 10 steps against the
// reference (parameters and embedding rows: a PS gather carries no optimizer slots).
void ExpectPsMatchesReference(const TrainerOptions& o, int world, float ten_tolerance = 2e-6f,
                              bool overlap_push = false) {
  std::vector<std::vector<float>> grads;
  const ModelState one = Reference(o, 1, overlap_push, &grads),
                   ten = Reference(o, 10, overlap_push);
  const testing::Slack slack_one = testing::OptimizerSlack(o, grads, 1),
                       slack_ten = testing::OptimizerSlack(o, grads, 10);
  auto def = *model::MakeModelDef(o.model, o.seed);
  auto opt = *core::MakeOptimizer(o.optimizer);
  ps::Shard shard({});
  for (const ps::TableSpec& spec : ModelTables(def->spec()).Specs(o.optimizer, o.consistency)) {
    ASSERT_TRUE(shard.CreateTable(spec).ok());
  }
  std::vector<std::unique_ptr<ParameterStore>> stores;
  for (int r = 0; r < world; ++r) {  // every worker registered before anyone steps (BSP)
    stores.push_back(std::make_unique<pscluster::testing::InProcessParameterStore>(&shard, r));
  }
  collective::MemoryRendezvous hash;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = collective::CreateGlooCommunicator(&hash, collective::GlooOptions{r, world});
      ASSERT_TRUE(comm.ok()) << comm.status();
      auto backend = compute::MakeCpuBackend(1);
      PlacementContext ctx;
      ctx.model = def.get();
      ctx.rank = r;
      ctx.world = world;
      ctx.batch_size = o.batch_size;
      ctx.seed = o.seed;
      ctx.train = &testing::DataFor(o);
      ctx.backend = backend.get();
      ctx.comm = comm->get();
      ctx.ps = stores[r].get();
      ctx.optimizer = opt.get();
      ctx.overlap_push = overlap_push;
      auto p = MakePlacement(coord::PS, ctx);
      ASSERT_TRUE(p.ok()) << p.status();
      ASSERT_TRUE((*p)->Load(InitialState(def->spec(), *opt), 0).ok());
      for (int64_t step = 0; step < 10; ++step) {
        auto loss = (*p)->Step(step);
        ASSERT_TRUE(loss.ok()) << "rank " << r << " step " << step << ": " << loss.status();
        // (A Gather drains the push/pull in flight: the next step would not be stale.)
        if ((step == 0 && !overlap_push) || step == 9) {
          auto got = (*p)->Gather(step + 1, /*with_slots=*/false);
          ASSERT_TRUE(got.ok()) << got.status();
          ExpectNear(*got, step == 0 ? one : ten, step == 0 ? 1e-6f : ten_tolerance,
                     absl::StrCat("rank ", r, " after ", step + 1, " steps"), false,
                     step == 0 ? slack_one : slack_ten);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(PsInProcessTest, MlpMatchesTheSingleProcessReference) {
  ExpectPsMatchesReference(testing::Options(coord::PS, 0, 2, ps::OptimizerConfig::MOMENTUM), 2);
}

TEST(PsInProcessTest, GptMatchesTheSingleProcessReference) {
  for (auto kind : {ps::OptimizerConfig::MOMENTUM, ps::OptimizerConfig::ADAM}) {
    ExpectPsMatchesReference(testing::GptOptions(coord::PS, 0, 2, kind), 2,
                             kind == ps::OptimizerConfig::ADAM ? 2e-4f : 1e-5f);
  }
}

TEST(PsInProcessTest, EmbeddingModelMatchesTheSingleProcessReference) {
  for (auto kind : {ps::OptimizerConfig::MOMENTUM, ps::OptimizerConfig::ADAM}) {
    ExpectPsMatchesReference(testing::EmbeddingOptions(coord::PS, 0, 2, kind), 2);
  }
}

// One worker on an ASP table (each push applied as it arrives, so the run is the same
// whatever the timing): step S computes while step S-1's push/pull is in flight, on the
// parameters before step S-1's update.
TEST(PsInProcessTest, OverlappedPushTrainsOnParametersOneStepOld) {
  for (auto kind : {ps::OptimizerConfig::MOMENTUM, ps::OptimizerConfig::ADAM}) {
    for (auto make : {testing::Options, testing::GptOptions}) {
      TrainerOptions o = make(coord::PS, 0, 1, kind);
      o.consistency.set_mode(ps::ConsistencyConfig::ASP);
      ExpectPsMatchesReference(o, 1, 2e-5f, /*overlap_push=*/true);
    }
  }
}

// The stale reference is another run: overlap_push is not a no-op.
TEST(PsInProcessTest, TheOneStepOldRunDiffersFromTheSynchronousOne) {
  const TrainerOptions o = testing::Options(coord::PS, 0, 1, ps::OptimizerConfig::ADAM);
  const ModelState now = Reference(o, 10), stale = Reference(o, 10, /*stale=*/true);
  float most = 0;
  for (size_t i = 0; i < now.params.size(); ++i) {
    for (size_t k = 0; k < now.params[i].size(); ++k) {
      most = std::max(most, std::abs(now.params[i][k] - stale.params[i][k]));
    }
  }
  EXPECT_GT(most, 1e-3f);
}

}  // namespace
}  // namespace pscluster::modes
