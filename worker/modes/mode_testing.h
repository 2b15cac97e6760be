// Test helpers for the training modes: ranks as threads with Gloo communicators on an
// in-memory store, the single-process reference, and a state comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/optimizer/optimizer_config.h"
#include "gtest/gtest.h"
#include "worker/data/text.h"
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
  o.model.mlp.layers = {12, 16, 8, 3};  // three layers: up to three pipeline stages
  o.optimizer.set_kind(kind);
  o.optimizer.set_learning_rate(kind == ps::OptimizerConfig::ADAM ? 0.01f : 0.05f);
  if (kind == ps::OptimizerConfig::MOMENTUM) o.optimizer.set_momentum(0.9f);
  o.micro_batches = 4;
  o.evaluate = false;
  return o;
}

// Options() with the embedding test model (worker/model/embedding_mlp.h) on the same data.
inline TrainerOptions EmbeddingOptions(Mode mode, int rank, int world,
                                       ps::OptimizerConfig::Kind kind) {
  TrainerOptions o = Options(mode, rank, world, kind);
  o.model.name = "embedding";  // 12 features (4 bucketed into ids), 3 classes
  return o;
}

// Options() with a small GPT (worker/model/gpt.h: 2 blocks, 2 heads of 4, context 6) on
// GptData(): two layers beside the ends, so FSDP gathers three.
inline TrainerOptions GptOptions(Mode mode, int rank, int world, ps::OptimizerConfig::Kind kind) {
  TrainerOptions o = Options(mode, rank, world, kind);
  o.model.name = "gpt";
  o.model.gpt.layers = 2;
  o.model.gpt.heads = 2;
  o.model.gpt.width = 8;
  o.model.gpt.context = 6;
  return o;
}

inline const data::Dataset& Data() {
  static const data::Dataset data = data::MakeSynthetic(480, 12, 3, /*seed=*/5);
  return data;
}

// Byte-level windows of a fixed pseudo-random text of 8 letters (480 windows of 6).
inline const data::Dataset& GptData() {
  static const data::Dataset data = [] {
    std::string text;
    uint32_t x = 12345;
    for (int i = 0; i < 480 * 6 + 1; ++i) {
      x = x * 1103515245u + 12345u;
      text.push_back(static_cast<char>('a' + (x >> 16) % 8));
    }
    return *data::MakeLanguageModelData(text, 6);
  }();
  return data;
}

// The data a test model trains on.
inline const data::Dataset& DataFor(const TrainerOptions& o) {
  return o.model.name == "gpt" ? GptData() : Data();
}

// Creates a trainer per rank on its own thread and runs fn(rank, trainer) there.
inline void OnRanks(int world, const std::function<TrainerOptions(int rank)>& options,
                    const std::function<void(int, Trainer&)>& fn) {
  collective::MemoryRendezvous store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      TrainerOptions o = options(r);
      o.connect =
          [&store, r, world](
              const std::string& gen) -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
        collective::GlooOptions g{r, world};
        g.key_prefix = gen;
        return collective::CreateGlooCommunicator(&store, g);
      };
      auto t = Trainer::Create(o, &DataFor(o), nullptr, compute::MakeCpuBackend(1));
      ASSERT_TRUE(t.ok()) << t.status();
      fn(r, **t);
    });
  }
  for (auto& t : threads) t.join();
}

// The single-process reference: the whole global batch of each step (the union of the
// ranks' batches) through one model, its mean gradient, the server's optimizer code; an
// embedding row is stepped (with its own update count) only when the batch touches it,
// as the shards' sparse tables do. With `stale`, step S >= 1's dense gradients are taken
// at the parameters before step S-1's update (PS with overlap_push, one worker; embedding
// rows stay current: their pulls and pushes do not overlap).
// With `first_grads`, also the first step's mean gradient of every parameter tensor.
inline ModelState Reference(const TrainerOptions& o, int64_t steps, bool stale = false,
                            std::vector<std::vector<float>>* first_grads = nullptr) {
  auto backend = compute::MakeCpuBackend(1);
  const int global = o.world * o.batch_size;
  auto def = *model::MakeModelDef(o.model, o.seed);
  auto m = *def->Create(backend.get(), model::WholeModel(global));
  auto opt = *core::MakeOptimizer(o.optimizer);
  ModelState s = InitialState(def->spec(), *opt);
  auto batches = *data::BatchIterator::Create(&DataFor(o), 0, 1, global, o.seed);
  data::Batch b;
  auto apply = [&](float* w, const float* g, std::vector<float*> slots, size_t n, int64_t t) {
    opt->Apply(w, g, slots.empty() ? nullptr : slots.data(), n, t);
  };
  std::vector<std::vector<float>> before = s.params;  // before the last update
  for (int64_t step = 0; step < steps; ++step) {
    batches.Next(&b);
    EXPECT_TRUE(SetWholeState(m.get(), def->spec(), s).ok());
    if (stale) {
      for (size_t i = 0; i < before.size(); ++i) m->SetParam(i, before[i].data());
      before = s.params;
    }
    EXPECT_TRUE(m->ForwardBackward(b.x.data(), b.y.data(), b.size).ok());
    ++s.updates;
    for (size_t i = 0; i < s.params.size(); ++i) {
      std::vector<float> g(s.params[i].size());
      m->GetGrad(i, g.data());
      if (first_grads != nullptr && step == 0) first_grads->push_back(g);
      std::vector<float*> slots;
      for (auto& v : s.slots[i]) slots.push_back(v.data());
      apply(s.params[i].data(), g.data(), slots, g.size(), s.updates);
    }
    for (size_t e = 0; e < s.embeddings.size(); ++e) {
      const int dim = def->spec().embeddings[e].dim;
      const std::vector<uint64_t> keys = m->Keys(e, b.x.data(), b.size);
      std::vector<float> g(keys.size() * dim);
      m->GetRowGrads(e, absl::MakeSpan(g));
      RowsState& rows = s.embeddings[e];
      for (size_t k = 0; k < keys.size(); ++k) {
        std::vector<float*> slots;
        for (auto& v : rows.slots) slots.push_back(v.data() + keys[k] * dim);
        apply(rows.values.data() + keys[k] * dim, g.data() + k * dim, slots, dim,
              ++rows.updates[keys[k]]);
      }
    }
  }
  return s;
}

// Per parameter element, how much further than the comparison's own tolerance two float32
// runs of `steps` steps may part because the optimizer amplifies rounding (empty: nowhere).
using Slack = std::vector<std::vector<float>>;

// The slack of `steps` steps of o's optimizer, from the reference's first-step gradients g.
// Two runs that sum a gradient in different orders (ranks' halves then shards, against one
// global batch) differ by at most about sqrt(K) u sum|terms| (u = 2^-24; the probabilistic
// bound of Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019), K terms summed: the global
// batch times the positions (the GPT's context) times the widest layer. We take sum|terms| as
// at most the model's largest gradient G, so e = sqrt(K) u G bounds an element's rounding.
// SGD and momentum move a parameter by lr * g: slack lr * 2e. Adam's first step moves it by
// lr * g / (|g| + eps), whose slope lr * eps / (|g| + eps)^2 is up to lr / eps (1e6 x lr):
// an element whose gradient is within e of zero (the attention key bias's, exactly zero in
// exact arithmetic: softmax ignores a shift shared by a row's scores) may move anywhere in
// [-lr, lr] each step, whatever the BLAS kernels. Adagrad, FTRL: none (not compared here).
inline Slack OptimizerSlack(const TrainerOptions& o, const std::vector<std::vector<float>>& g,
                            int64_t steps) {
  const int64_t positions = o.model.name == "gpt" ? o.model.gpt.context : 1;
  int64_t widest = 1;
  for (int w : o.model.mlp.layers) widest = std::max<int64_t>(widest, w);
  if (o.model.name == "gpt") widest = std::max<int64_t>(widest, 4 * o.model.gpt.width);
  const double k = static_cast<double>(o.world) * o.batch_size * positions * widest;
  double largest = 0;
  for (const auto& t : g) {
    for (float v : t) largest = std::max(largest, std::abs(static_cast<double>(v)));
  }
  const double e = std::sqrt(k) * std::ldexp(1.0, -24) * largest;
  const double lr = o.optimizer.learning_rate(), eps = 1e-8;  // Adam's default epsilon
  const bool adam = o.optimizer.kind() == ps::OptimizerConfig::ADAM ||
                    o.optimizer.kind() == ps::OptimizerConfig::ADAMW;
  Slack slack(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    slack[i].resize(g[i].size());
    for (size_t j = 0; j < g[i].size(); ++j) {
      const double near = std::max(std::abs(static_cast<double>(g[i][j])) - e, 0.0) + eps;
      const double first = adam ? std::min(2.0, 2 * e * eps / (near * near)) : 2 * e;
      // Beyond the first step: only an element whose gradient is noise keeps drifting.
      const double later = adam && std::abs(g[i][j]) <= e ? 2.0 * (steps - 1) : 0.0;
      slack[i][j] = static_cast<float>(lr * (first + later));
    }
  }
  return slack;
}

// `got` matches `want` within `tolerance` (plus `slack`, where given, per parameter element);
// with_slots false: the parameters only (a state gathered without optimizer slots).
inline void ExpectNear(const ModelState& got, const ModelState& want, float tolerance,
                       const std::string& what, bool with_slots = true, const Slack& slack = {}) {
  if (with_slots) {
    ASSERT_EQ(got.updates, want.updates) << what;
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (size_t i = 0; i < want.params.size(); ++i) {
    ASSERT_EQ(got.params[i].size(), want.params[i].size());
    for (size_t j = 0; j < want.params[i].size(); ++j) {
      ASSERT_NEAR(got.params[i][j], want.params[i][j],
                  tolerance + (slack.empty() ? 0.0f : slack[i][j]))
          << what << ": tensor " << i << " element " << j;
    }
    if (!with_slots) continue;
    ASSERT_EQ(got.slots[i].size(), want.slots[i].size()) << what;
    for (size_t k = 0; k < want.slots[i].size(); ++k) {
      for (size_t j = 0; j < want.slots[i][k].size(); ++j) {
        ASSERT_NEAR(got.slots[i][k][j], want.slots[i][k][j], tolerance)
            << what << ": tensor " << i << " slot " << k << " element " << j;
      }
    }
  }
  ASSERT_EQ(got.embeddings.size(), want.embeddings.size()) << what;
  for (size_t e = 0; e < want.embeddings.size(); ++e) {
    const RowsState &g = got.embeddings[e], &w = want.embeddings[e];
    ASSERT_EQ(g.values.size(), w.values.size()) << what;
    for (size_t j = 0; j < w.values.size(); ++j) {
      ASSERT_NEAR(g.values[j], w.values[j], tolerance) << what << ": embedding " << e << " " << j;
    }
    if (!g.updates.empty()) {  // ps mode gathers the values only
      ASSERT_EQ(g.updates, w.updates) << what << ": embedding " << e << " row updates";
    }
    if (!with_slots) continue;
    ASSERT_EQ(g.slots.size(), w.slots.size()) << what;
    for (size_t k = 0; k < w.slots.size(); ++k) {
      for (size_t j = 0; j < w.slots[k].size(); ++j) {
        ASSERT_NEAR(g.slots[k][j], w.slots[k][j], tolerance)
            << what << ": embedding " << e << " slot " << k << " element " << j;
      }
    }
  }
}

// Ten steps of `t` (rank r): after the first its state is `one` within 1e-6, after the
// tenth `ten` within `ten_tolerance` (summation-order rounding of a linear optimizer).
inline void ExpectOneAndTenStepsMatch(Trainer& t, int r, const ModelState& one,
                                      const ModelState& ten, bool with_slots = true,
                                      float ten_tolerance = 2e-6f) {
  for (int64_t step = 0; step < 10; ++step) {
    auto loss = t.Step(step);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(std::isfinite(*loss));
    if (step == 0) {
      auto state = t.State(1, with_slots);
      ASSERT_TRUE(state.ok()) << state.status();
      ExpectNear(*state, one, 1e-6f, absl::StrCat("rank ", r, " after 1 step"), with_slots);
    }
  }
  auto state = t.State(10, with_slots);
  ASSERT_TRUE(state.ok()) << state.status();
  ExpectNear(*state, ten, ten_tolerance, absl::StrCat("rank ", r, " after 10 steps"), with_slots);
}

}  // namespace pscluster::modes::testing
