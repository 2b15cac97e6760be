// Test helpers for the training modes: ranks as threads with Gloo communicators on an
// in-memory store, the single-process reference, and a state comparison.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/optimizer/optimizer_config.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gtest/gtest.h"
#include "worker/modes/trainer.h"

namespace pscluster::modes::testing {

constexpr int kBatch = 8;

// A small model (three layers: up to three pipeline stages) on synthetic data.
inline TrainerOptions Options(Mode mode, int rank, int world, ps::OptimizerConfig::Kind kind) {
  TrainerOptions o;
  o.mode = mode;
  o.rank = rank;
  o.world = world;
  o.batch_size = kBatch;
  o.epochs = 2;
  o.seed = 3;
  o.mlp.layers = {12, 16, 8, 3};  // three layers: up to three pipeline stages
  o.optimizer.set_kind(kind);
  o.optimizer.set_learning_rate(kind == ps::OptimizerConfig::ADAM ? 0.01f : 0.05f);
  if (kind == ps::OptimizerConfig::MOMENTUM) o.optimizer.set_momentum(0.9f);
  o.micro_batches = 4;
  o.evaluate = false;
  return o;
}

inline const data::Dataset& Data() {
  static const data::Dataset data = data::MakeSynthetic(480, 12, 3, /*seed=*/5);
  return data;
}

// Creates a trainer per rank on its own thread and runs fn(rank, trainer) there.
inline void OnRanks(int world, const std::function<TrainerOptions(int rank)>& options,
                    const std::function<void(int, Trainer&)>& fn) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      TrainerOptions o = options(r);
      o.connect =
          [&store, r, world](
              const std::string& gen) -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
        gloo::rendezvous::PrefixStore prefixed(gen, store);
        return collective::CreateGlooCommunicator(&prefixed, collective::GlooOptions{r, world});
      };
      auto t = Trainer::Create(o, &Data(), nullptr, compute::MakeCpuBackend(1));
      ASSERT_TRUE(t.ok()) << t.status();
      fn(r, **t);
    });
  }
  for (auto& t : threads) t.join();
}

// The single-process reference: the whole global batch of each step (the union of the
// ranks' batches) through one model, its mean gradient, the server's optimizer code.
inline ModelState Reference(const TrainerOptions& o, int64_t steps) {
  auto backend = compute::MakeCpuBackend(1);
  const int global = o.world * o.batch_size;
  auto mlp = *model::Mlp::Create(backend.get(), o.mlp, global);
  auto opt = *core::MakeOptimizer(o.optimizer);
  ModelState s = InitialState(o.mlp, o.seed, *opt);
  auto batches = *data::BatchIterator::Create(&Data(), 0, 1, global, o.seed);
  data::Batch b;
  for (int64_t step = 0; step < steps; ++step) {
    batches.Next(&b);
    for (size_t i = 0; i < s.params.size(); ++i) mlp->SetParam(i, s.params[i].data());
    EXPECT_TRUE(mlp->ForwardBackward(b.x.data(), b.y.data(), b.size).ok());
    ++s.updates;
    for (size_t i = 0; i < s.params.size(); ++i) {
      std::vector<float> g(s.params[i].size());
      mlp->GetGrad(i, g.data());
      std::vector<float*> slots;
      for (auto& v : s.slots[i]) slots.push_back(v.data());
      opt->Apply(s.params[i].data(), g.data(), slots.data(), g.size(), s.updates);
    }
  }
  return s;
}

inline void ExpectNear(const ModelState& got, const ModelState& want, float tolerance,
                       const std::string& what) {
  ASSERT_EQ(got.updates, want.updates) << what;
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (size_t i = 0; i < want.params.size(); ++i) {
    ASSERT_EQ(got.params[i].size(), want.params[i].size());
    for (size_t j = 0; j < want.params[i].size(); ++j) {
      ASSERT_NEAR(got.params[i][j], want.params[i][j], tolerance)
          << what << ": tensor " << i << " element " << j;
    }
    ASSERT_EQ(got.slots[i].size(), want.slots[i].size()) << what;
    for (size_t k = 0; k < want.slots[i].size(); ++k) {
      for (size_t j = 0; j < want.slots[i][k].size(); ++j) {
        ASSERT_NEAR(got.slots[i][k][j], want.slots[i][k][j], tolerance)
            << what << ": tensor " << i << " slot " << k << " element " << j;
      }
    }
  }
}

// Ten steps of `t` (rank r): after the first its state is `one` within 1e-6, after the
// tenth `ten` within 2e-6 (summation-order rounding of a linear optimizer).
inline void ExpectOneAndTenStepsMatch(Trainer& t, int r, const ModelState& one,
                                      const ModelState& ten) {
  for (int64_t step = 0; step < 10; ++step) {
    auto loss = t.Step(step);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(std::isfinite(*loss));
    if (step == 0) {
      auto state = t.State(1);
      ASSERT_TRUE(state.ok()) << state.status();
      ExpectNear(*state, one, 1e-6f, absl::StrCat("rank ", r, " after 1 step"));
    }
  }
  auto state = t.State(10);
  ASSERT_TRUE(state.ok()) << state.status();
  ExpectNear(*state, ten, 2e-6f, absl::StrCat("rank ", r, " after 10 steps"));
}

}  // namespace pscluster::modes::testing
