// ALLREDUCE mode against the single-process reference: two ranks (threads, real Gloo over
// loopback) take ten Adam steps on their own batches; their replicas equal a reference that
// averages the same two gradients and applies the same optimizer, and each other.
#include "worker/modes/allreduce_trainer.h"

#include <cmath>
#include <thread>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "server/ps/table.h"

namespace pscluster::modes {
namespace {

constexpr int kWorld = 2, kSteps = 10, kBatch = 16;

PsTrainerOptions Options(int rank) {
  PsTrainerOptions o;
  o.rank = rank;
  o.world = kWorld;
  o.batch_size = kBatch;
  o.epochs = 2;
  o.seed = 3;
  o.mlp.layers = {12, 16, 3};
  o.optimizer.set_kind(ps::OptimizerConfig::ADAM);
  o.optimizer.set_learning_rate(0.01f);
  o.evaluate = false;
  return o;
}

TEST(AllReduceTrainerTest, TenStepsMatchTheSingleProcessReference) {
  const data::Dataset data = data::MakeSynthetic(512, 12, 3, /*seed=*/5);
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> replicas[kWorld];
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto comm = collective::CreateGlooCommunicator(&store, collective::GlooOptions{r, kWorld});
      ASSERT_TRUE(comm.ok()) << comm.status();
      auto t = AllReduceTrainer::Create(Options(r), &data, nullptr, compute::MakeCpuBackend(1),
                                        *std::move(comm));
      ASSERT_TRUE(t.ok()) << t.status();
      auto batches = *data::BatchIterator::Create(&data, r, kWorld, kBatch, 3);
      data::Batch b;
      for (int s = 0; s < kSteps; ++s) {
        batches.Next(&b);
        ASSERT_TRUE((*t)->Step(b, s).ok());
      }
      replicas[r] = (*t)->params();
    });
  }
  for (auto& t : threads) t.join();

  // Reference: one model, both ranks' batches, mean gradient, the server's optimizer code.
  auto backend = compute::MakeCpuBackend(1);
  auto mlp = *model::Mlp::Create(backend.get(), Options(0).mlp, kBatch);
  auto params = AllReduceTrainer::InitialParams(Options(0).mlp, 3);
  auto optimizer = *ps::MakeOptimizer(Options(0).optimizer);
  std::vector<std::vector<float>> m, v;
  for (const auto& p : params) m.emplace_back(p.size()), v.emplace_back(p.size());
  std::vector<data::BatchIterator> its;
  for (int r = 0; r < kWorld; ++r)
    its.push_back(*data::BatchIterator::Create(&data, r, kWorld, kBatch, 3));
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::vector<float>> sum;
    for (int r = 0; r < kWorld; ++r) {
      data::Batch b;
      its[r].Next(&b);
      for (size_t i = 0; i < params.size(); ++i) mlp->SetParam(i, params[i].data());
      ASSERT_TRUE(mlp->ForwardBackward(b.x.data(), b.y.data(), b.size).ok());
      for (size_t i = 0; i < params.size(); ++i) {
        std::vector<float> g(params[i].size());
        mlp->GetGrad(i, g.data());
        if (r == 0)
          sum.push_back(g);
        else
          for (size_t j = 0; j < g.size(); ++j) sum[i][j] += g[j];
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      for (float& g : sum[i]) g *= 1.0f / kWorld;
      float* slots[] = {m[i].data(), v[i].data()};
      optimizer->Apply(params[i].data(), sum[i].data(), slots, params[i].size(), s + 1);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = 0; j < params[i].size(); ++j) {
      ASSERT_NEAR(replicas[0][i][j], params[i][j], 1e-6f) << "tensor " << i << " value " << j;
      ASSERT_EQ(replicas[0][i][j], replicas[1][i][j]) << "the replicas diverged";
    }
  }
}

TEST(AllReduceTrainerTest, TrainsASyntheticProblemToHighAccuracy) {
  const data::Dataset train = data::MakeSynthetic(4000, 12, 3, 5);
  const data::Dataset test = data::MakeSynthetic(1000, 12, 3, 5);  // same centroids (seed)
  gloo::rendezvous::HashStore store;
  double accuracy[kWorld] = {0, 0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      PsTrainerOptions o = Options(r);
      o.evaluate = true;
      auto comm = collective::CreateGlooCommunicator(&store, collective::GlooOptions{r, kWorld});
      ASSERT_TRUE(comm.ok());
      auto t =
          AllReduceTrainer::Create(o, &train, &test, compute::MakeCpuBackend(1), *std::move(comm));
      ASSERT_TRUE(t.ok()) << t.status();
      auto summary = (*t)->Run();
      ASSERT_TRUE(summary.ok()) << summary.status();
      accuracy[r] = summary->test_accuracy;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(accuracy[0], 0.9);
  EXPECT_EQ(accuracy[0], accuracy[1]);
}

}  // namespace
}  // namespace pscluster::modes
