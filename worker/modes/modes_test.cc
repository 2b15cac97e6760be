// The collective modes against the single-process reference, with ranks as threads (real
// Gloo over loopback, in-memory rendezvous): from the same initial state and the same
// global batches, 1 and 10 steps of ALLREDUCE, FSDP and PIPELINE give the reference's
// parameters within float tolerance; a switch round trip keeps the whole state (optimizer
// slots and update count included) bitwise; and a run that switches between modes every
// few steps matches the reference too. (PS mode and switches through the shards:
// tests/modes_switch_test.cc, with real ps_server processes.)
#include <map>

#include "common/cluster_view.h"
#include "worker/modes/mode_testing.h"

namespace pscluster::modes {
namespace {

using testing::Data;
using testing::ExpectNear;
using testing::ExpectOneAndTenStepsMatch;
using testing::kBatch;
using testing::OnRanks;
using testing::Options;
using testing::Reference;

struct Case {
  Mode mode;
  int world;
};

class ModeEquivalenceTest : public ::testing::TestWithParam<Case> {};

// Momentum SGD: a linear update, so summation-order rounding stays at float epsilon.
TEST_P(ModeEquivalenceTest, OneAndTenStepsMatchTheSingleProcessReference) {
  const Case c = GetParam();
  auto options = [&](int r) { return Options(c.mode, r, c.world, ps::OptimizerConfig::MOMENTUM); };
  const ModelState one = Reference(options(0), 1), ten = Reference(options(0), 10);
  OnRanks(c.world, options, [&](int r, Trainer& t) {
    ASSERT_EQ(t.mode(), c.mode);
    ExpectOneAndTenStepsMatch(t, r, one, ten);
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, ModeEquivalenceTest,
                         ::testing::Values(Case{coord::ALLREDUCE, 2}, Case{coord::FSDP, 2},
                                           Case{coord::FSDP, 3}, Case{coord::PIPELINE, 1},
                                           Case{coord::PIPELINE, 2}, Case{coord::PIPELINE, 3}),
                         [](const auto& info) {
                           return absl::StrCat(ModeName(info.param.mode), "_", info.param.world,
                                               "_workers");
                         });

// The GPT (a tied embedding whose gradient is complete only after the embedding's
// backward; in PIPELINE the head's stage holds a copy of it) in the collective modes.
class GptModeEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(GptModeEquivalenceTest, OneAndTenStepsMatchTheSingleProcessReference) {
  const Case c = GetParam();
  auto options = [&](int r) {
    TrainerOptions o = testing::GptOptions(c.mode, r, c.world, ps::OptimizerConfig::MOMENTUM);
    o.bucket_bytes = 300 * sizeof(float);  // ALLREDUCE: several buckets, the tied one last
    return o;
  };
  const ModelState one = Reference(options(0), 1), ten = Reference(options(0), 10);
  OnRanks(c.world, options, [&](int r, Trainer& t) {
    ASSERT_EQ(t.mode(), c.mode);
    ExpectOneAndTenStepsMatch(t, r, one, ten, /*with_slots=*/true, /*ten_tolerance=*/1e-5f);
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, GptModeEquivalenceTest,
                         ::testing::Values(Case{coord::ALLREDUCE, 2}, Case{coord::ALLREDUCE, 3},
                                           Case{coord::FSDP, 2}, Case{coord::FSDP, 3},
                                           Case{coord::PIPELINE, 1}, Case{coord::PIPELINE, 2},
                                           Case{coord::PIPELINE, 3}, Case{coord::PIPELINE, 4},
                                           Case{coord::TENSOR, 1}, Case{coord::TENSOR, 2}),
                         [](const auto& info) {
                           return absl::StrCat(ModeName(info.param.mode), "_", info.param.world,
                                               "_workers");
                         });

// TENSOR over 4 workers (4 heads of 2: one each, 256 / 4 tokens of the vocabulary each),
// with Adam; a worker holds a quarter of every split tensor and its slots.
TEST(GptTensorModeTest, FourWorkersWithAdamMatchTheReference) {
  auto options = [](int r) {
    TrainerOptions o = testing::GptOptions(coord::TENSOR, r, 4, ps::OptimizerConfig::ADAM);
    o.model.gpt.heads = 4;
    return o;
  };
  const ModelState ten = Reference(options(0), 10);
  OnRanks(4, options, [&](int r, Trainer& t) {
    for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(t.Step(step).ok()) << step;
    auto state = t.State(10);
    ASSERT_TRUE(state.ok()) << state.status();
    ExpectNear(*state, ten, 2e-4f, absl::StrCat("rank ", r));
    const auto list = t.Figures();
    std::map<std::string, double> figures(list.begin(), list.end());
    EXPECT_LT(figures["tensor_state_bytes"], 0.5 * figures["replica_state_bytes"]);
  });
}

// Straight through the placement (a refusal comes before any collective): the MLP has no
// tensor-parallel layers, and the test GPT's 2 heads do not split 3 ways.
TEST(GptTensorModeTest, ModelsWithoutTensorSplitsOrTooManyWorkersAreRefused) {
  for (bool gpt : {false, true}) {
    TrainerOptions o = gpt ? testing::GptOptions(coord::TENSOR, 0, 3, ps::OptimizerConfig::SGD)
                           : Options(coord::TENSOR, 0, 3, ps::OptimizerConfig::SGD);
    auto def = *model::MakeModelDef(o.model, o.seed);
    collective::MemoryRendezvous store;
    auto comm = *collective::CreateGlooCommunicator(&store, collective::GlooOptions{0, 1});
    auto backend = compute::MakeCpuBackend(1);
    auto opt = *core::MakeOptimizer(o.optimizer);
    PlacementContext ctx;
    ctx.model = def.get();
    ctx.world = 3;
    ctx.batch_size = kBatch;
    ctx.train = &testing::DataFor(o);
    ctx.backend = backend.get();
    ctx.optimizer = opt.get();
    ctx.comm = comm.get();
    auto p = MakePlacement(coord::TENSOR, ctx);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << p.status();
    EXPECT_NE(p.status().message().find(gpt ? "splits over worker counts dividing 2"
                                            : "needs a model with tensor-parallel layers"),
              std::string::npos)
        << p.status();
  }
}

// ALLREDUCE in small buckets, each all-reduced as the backward pass fills it (a 160-float
// cap cuts the tensors, last layer first, into 3 buckets), matches the reference too.
TEST(ModeEquivalenceTest, AllReduceInSmallBucketsMatchesTheReference) {
  auto options = [](int r) {
    TrainerOptions o = Options(coord::ALLREDUCE, r, 3, ps::OptimizerConfig::MOMENTUM);
    o.bucket_bytes = 160 * sizeof(float);
    return o;
  };
  const ModelState ten = Reference(options(0), 10);
  OnRanks(3, options, [&](int r, Trainer& t) {
    for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(t.Step(step).ok());
    auto figures = t.Figures();
    ASSERT_EQ(figures.size(), 1u);
    EXPECT_GT(figures[0].second, 2) << "expected several buckets";
    auto state = t.State(10);
    ASSERT_TRUE(state.ok());
    ExpectNear(*state, ten, 2e-6f, absl::StrCat("rank ", r));
  });
}

// FSDP without resharding after the forward (PyTorch's SHARD_GRAD_OP) gathers each layer
// once a step instead of twice: the same values, so the same bits as with it, for the MLP
// and the GPT (a tied embedding), with Adam, on 2 and 3 workers; and it says it holds more.
TEST(FsdpReshardTest, KeepingTheGatheredLayersGivesTheSameBits) {
  for (bool gpt : {false, true}) {
    for (int world : {2, 3}) {
      std::vector<ModelState> states[2];
      double held[2][3] = {};
      for (bool reshard : {true, false}) {
        states[reshard].resize(world);
        auto options = [&](int r) {
          TrainerOptions o =
              gpt ? testing::GptOptions(coord::FSDP, r, world, ps::OptimizerConfig::ADAM)
                  : Options(coord::FSDP, r, world, ps::OptimizerConfig::ADAM);
          o.fsdp_reshard_after_forward = reshard;
          return o;
        };
        OnRanks(world, options, [&](int r, Trainer& t) {
          for (int64_t step = 0; step < 6; ++step) ASSERT_TRUE(t.Step(step).ok()) << step;
          auto state = t.State(6);
          ASSERT_TRUE(state.ok()) << state.status();
          states[reshard][r] = *std::move(state);
          for (const auto& [name, value] : t.Figures()) {
            if (name == "fsdp_held_bytes") held[reshard][r] = value;
          }
        });
      }
      const std::string what = absl::StrCat(gpt ? "gpt" : "mlp", ", ", world, " workers");
      for (int r = 0; r < world; ++r) {
        ExpectNear(states[false][r], states[true][r], 0.0f, absl::StrCat(what, ", rank ", r));
        EXPECT_GT(held[false][r], held[true][r]) << what;
      }
    }
  }
}

// Small layers are gathered and reduce-scattered as one unit: the test MLP's layers 1 and 2
// (136 and 27 parameters, under layer 0's 208) make one, so a step makes 2 all-gathers and
// 2 reduce-scatters with resharding or without (one layer at a time: 4 + 3, or 3 + 3). So do
// the GPT's: its two blocks and its head (together under the embedding's size) make one.
TEST(FsdpUnitsTest, SmallLayersMakeOneUnitGatheredOnceAndReduceScatteredOnce) {
  for (bool gpt : {false, true}) {
    for (bool reshard : {true, false}) {
      auto options = [&](int r) {
        TrainerOptions o = gpt ? testing::GptOptions(coord::FSDP, r, 2, ps::OptimizerConfig::ADAM)
                               : Options(coord::FSDP, r, 2, ps::OptimizerConfig::ADAM);
        o.fsdp_reshard_after_forward = reshard;
        return o;
      };
      OnRanks(2, options, [&](int r, Trainer& t) {
        for (int64_t step = 0; step < 2; ++step) ASSERT_TRUE(t.Step(step).ok()) << step;
        double collectives = -1;
        for (const auto& [name, value] : t.Figures()) {
          if (name == "fsdp_collectives_per_step") collectives = value;
        }
        EXPECT_EQ(collectives, 4) << (gpt ? "gpt" : "mlp") << ", reshard " << reshard;
      });
    }
  }
}

// A pipeline stage's figures account for its step: M forwards and backwards, the update and
// the time in messages are parts of it, disjoint, each measured (the last stage's loss and
// the first's batch loading are the rest).
TEST(PipelineFiguresTest, TheStagesTimesArePartsOfTheirStep) {
  auto options = [](int r) { return Options(coord::PIPELINE, r, 2, ps::OptimizerConfig::ADAM); };
  OnRanks(2, options, [&](int r, Trainer& t) {
    for (int64_t step = 0; step < 4; ++step) ASSERT_TRUE(t.Step(step).ok()) << step;
    const auto list = t.Figures();
    std::map<std::string, double> f(list.begin(), list.end());
    for (const char* k : {"pipeline_forward_ms", "pipeline_backward_ms", "pipeline_update_ms",
                          "pipeline_step_ms"}) {
      EXPECT_GT(f[k], 0) << k << ", rank " << r;
    }
    const double parts =
        f["pipeline_micro_batches"] * (f["pipeline_forward_ms"] + f["pipeline_backward_ms"]) +
        f["pipeline_update_ms"] + f["pipeline_bubble"] * f["pipeline_step_ms"];
    EXPECT_LE(parts, f["pipeline_step_ms"] * (1 + 1e-9)) << "rank " << r;
  });
}

TEST(ModeSwitchTest, RoundTripThroughEveryCollectiveModeKeepsTheStateBitwise) {
  auto options = [](int r) { return Options(coord::ALLREDUCE, r, 2, ps::OptimizerConfig::ADAM); };
  OnRanks(2, options, [&](int r, Trainer& t) {
    for (int64_t step = 0; step < 3; ++step) ASSERT_TRUE(t.Step(step).ok());
    auto before = t.State(3);
    ASSERT_TRUE(before.ok());
    ASSERT_EQ(before->slots[0].size(), 2u);  // Adam's m and v
    for (Mode m : {coord::FSDP, coord::PIPELINE, coord::ALLREDUCE}) {
      absl::Status s = t.SwitchTo(m, 3);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(t.mode(), m);
      auto now = t.State(3);
      ASSERT_TRUE(now.ok()) << now.status();
      ExpectNear(*now, *before, 0.0f, absl::StrCat("rank ", r, " in ", ModeName(m)));
    }
  });
}

TEST(ModeSwitchTest, RunSwitchingEveryThreeStepsMatchesTheReference) {
  auto options = [](int r) {
    return Options(coord::ALLREDUCE, r, 2, ps::OptimizerConfig::MOMENTUM);
  };
  const ModelState want = Reference(options(0), 12);
  OnRanks(2, options, [&](int r, Trainer& t) {
    const Mode order[] = {coord::ALLREDUCE, coord::FSDP, coord::PIPELINE, coord::ALLREDUCE};
    for (int64_t step = 0; step < 12; ++step) {
      if (step % 3 == 0 && step > 0) ASSERT_TRUE(t.SwitchTo(order[step / 3], step).ok());
      ASSERT_TRUE(t.Step(step).ok()) << "step " << step;
    }
    auto got = t.State(12);
    ASSERT_TRUE(got.ok());
    ExpectNear(*got, want, 2e-6f, absl::StrCat("rank ", r));
  });
}

TEST(ModeSwitchTest, AdamRunsAgreeAcrossModesWithinTolerance) {
  for (Mode m : {coord::FSDP, coord::PIPELINE}) {
    auto options = [m](int r) { return Options(m, r, 2, ps::OptimizerConfig::ADAM); };
    const ModelState want = Reference(options(0), 10);
    OnRanks(2, options, [&](int r, Trainer& t) {
      for (int64_t step = 0; step < 10; ++step) ASSERT_TRUE(t.Step(step).ok());
      auto got = t.State(10);
      ASSERT_TRUE(got.ok());
      // Adam divides by sqrt(v): rounding of near-zero gradients moves an element by up
      // to a fraction of the learning rate, so the bound is looser than for momentum.
      ExpectNear(*got, want, 2e-4f, absl::StrCat(ModeName(m), " rank ", r));
    });
  }
}

TEST(ModeSwitchTest, PipelineRefusesMoreWorkersThanLayersAndUnevenMicroBatches) {
  collective::MemoryRendezvous store;
  TrainerOptions o = Options(coord::PIPELINE, 0, 1, ps::OptimizerConfig::SGD);
  o.micro_batches = 3;  // does not divide 8
  o.connect = [&](const std::string&) -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
    return collective::CreateGlooCommunicator(&store, collective::GlooOptions{0, 1});
  };
  auto t = Trainer::Create(o, &Data(), nullptr, compute::MakeCpuBackend(1));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("micro_batches"), std::string::npos) << t.status();
  // Two stages of a one-layer model, straight through the placement.
  o.model.mlp.layers = {12, 3};
  collective::MemoryRendezvous store2;
  auto def = *model::MakeMlpDef(o.model.mlp, o.seed);
  PlacementContext ctx;
  ctx.model = def.get();
  ctx.world = 2;
  ctx.batch_size = kBatch;
  ctx.train = &Data();
  auto backend = compute::MakeCpuBackend(1);
  ctx.backend = backend.get();
  auto opt = *core::MakeOptimizer(o.optimizer);
  ctx.optimizer = opt.get();
  auto comm = *collective::CreateGlooCommunicator(&store2, collective::GlooOptions{0, 1});
  ctx.comm = comm.get();
  auto p = MakePlacement(coord::PIPELINE, ctx);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("at least one layer per worker"), std::string::npos)
      << p.status();
  EXPECT_EQ(MakePlacement(coord::PS, ctx).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakePlacement(coord::TRAINING_MODE_UNSPECIFIED, ctx).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The embedding test model: ALLREDUCE holds the table whole, steps only the rows some
// worker touched (each with its own update count), and matches the reference.
TEST(EmbeddingModelTest, AllReduceMatchesTheSingleProcessReference) {
  for (auto kind : {ps::OptimizerConfig::MOMENTUM, ps::OptimizerConfig::ADAM}) {
    auto options = [&](int r) { return testing::EmbeddingOptions(coord::ALLREDUCE, r, 2, kind); };
    const ModelState one = Reference(options(0), 1), ten = Reference(options(0), 10);
    ASSERT_EQ(ten.embeddings.size(), 1u);
    OnRanks(2, options, [&](int r, Trainer& t) { ExpectOneAndTenStepsMatch(t, r, one, ten); });
  }
}

TEST(EmbeddingModelTest, ModesThatCannotHoldEmbeddingsRefuseNamingTheReason) {
  for (Mode mode : {coord::FSDP, coord::PIPELINE}) {
    collective::MemoryRendezvous store;
    TrainerOptions o = testing::EmbeddingOptions(mode, 0, 1, ps::OptimizerConfig::SGD);
    o.connect =
        [&](const std::string&) -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
      return collective::CreateGlooCommunicator(&store, collective::GlooOptions{0, 1});
    };
    auto t = Trainer::Create(o, &Data(), nullptr, compute::MakeCpuBackend(1));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << coord::ModeName(mode);
    EXPECT_NE(t.status().message().find("embedding"), std::string::npos) << t.status();
  }
}

TEST(RollbackModeTest, ACheckpointLoadsIntoTheModeBeforeItsStepAndTheSwitchThereIsReplayed) {
  coord::ClusterView v;
  v.set_initial_mode(coord::FSDP);
  v.set_mode(coord::ALLREDUCE);  // after the done switch below
  auto add = [](auto* list, int64_t at, coord::TrainingMode to) {
    coord::SwitchRecord* r = list->Add();
    r->set_at_step(at);
    r->set_to_mode(to);
  };
  EXPECT_EQ(RollbackMode(v, 0), coord::FSDP) << "no switches: the initial mode";
  add(v.mutable_switches(), 100, coord::ALLREDUCE);
  add(v.mutable_pending_switches(), 200, coord::PIPELINE);  // nobody has reported it yet
  EXPECT_EQ(RollbackMode(v, 100), coord::FSDP) << "the switch at the step is taken again";
  EXPECT_EQ(RollbackMode(v, 101), coord::ALLREDUCE);
  EXPECT_EQ(RollbackMode(v, 250), coord::PIPELINE);
}

TEST(RollbackModeTest, ASwitchReplayedAfterARollbackIsListedOnce) {
  std::vector<SwitchDone> done;
  RecordSwitch(&done, {100, "ps", "allreduce", 0.5});
  RecordSwitch(&done, {200, "allreduce", "fsdp", 0.25});
  // Rolled back to the checkpoint of step 150: the switch at 200 is made again.
  RecordSwitch(&done, {200, "allreduce", "fsdp", 0.75});
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].step, 100);
  EXPECT_EQ(done[1].step, 200);
  EXPECT_EQ(done[1].seconds, 0.75) << "the hand-over of the replay";
  // Rolled back to the checkpoint of step 50: both are made again, the first as before.
  RecordSwitch(&done, {100, "ps", "allreduce", 0.125});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].seconds, 0.125);
}

// After an import each head stands alone until its live backups copied the state back; a
// backup that died is not waited for (it would stall every checkpoint by rpc_timeout).
TEST(ShortChainsTest, AChainIsShortWhileALiveReplicaOfItsShardIsOutOfIt) {
  coord::ClusterView v;
  v.set_replicas(2);
  auto chain = [&](int32_t shard, std::vector<int32_t> replicas) {
    coord::Chain* c = v.add_chains();
    c->set_shard(shard);
    for (int32_t r : replicas) c->add_replicas(r);
  };
  auto member = [&](int32_t shard, int32_t replica, bool alive) {
    coord::Member* m = v.add_members();
    m->set_role(coord::SHARD);
    m->set_id(shard);
    m->set_replica(replica);
    m->set_alive(alive);
  };
  chain(0, {1});  // the head alone: replica 0 copies the state back
  chain(1, {0});  // alone too, but its other replica died
  chain(2, {0, 1});
  for (int32_t s = 0; s < 3; ++s) member(s, 0, true);
  member(0, 1, true);
  member(1, 1, false);
  member(2, 1, true);
  coord::Member* worker = v.add_members();
  worker->set_role(coord::WORKER);
  worker->set_id(0);
  worker->set_alive(true);
  EXPECT_EQ(coord::ShortChains(v), std::vector<int32_t>({0}));
  v.mutable_chains(0)->add_replicas(0);
  EXPECT_TRUE(coord::ShortChains(v).empty());
}

}  // namespace
}  // namespace pscluster::modes
