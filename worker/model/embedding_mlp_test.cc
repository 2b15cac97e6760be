#include "worker/model/embedding_mlp.h"

#include <cmath>
#include <vector>

#include "core/init/initializer.h"
#include "gtest/gtest.h"

namespace pscluster::model {
namespace {

constexpr int kBatch = 6;

class EmbeddingMlpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    o_.features = 5;
    o_.categorical = 3;
    o_.buckets = 4;
    o_.dim = 3;
    o_.hidden = {7};
    o_.classes = 3;
    def_ = *MakeEmbeddingMlpDef(o_, /*seed=*/4);
    backend_ = compute::MakeCpuBackend(1);
    model_ = *def_->Create(backend_.get(), WholeModel(kBatch));
    const ModelSpec& spec = def_->spec();
    for (size_t i = 0; i < spec.params.size(); ++i) {
      std::vector<float> v(spec.params[i].size());
      core::InitDense(spec.params[i].init, 0, absl::MakeSpan(v));
      for (size_t j = 0; j < v.size(); ++j) v[j] += 0.01f * ((j * 7 + i) % 5);  // biases too
      model_->SetParam(i, v.data());
    }
    const EmbeddingSpec& e = spec.embeddings[0];
    rows_.resize(e.vocab * e.dim);
    for (uint64_t id = 0; id < e.vocab; ++id) {
      core::InitSparseRow(e.init, id, absl::MakeSpan(rows_.data() + id * e.dim, e.dim));
      rows_[id * e.dim] = std::fabs(rows_[id * e.dim]) + 0.3f;  // keep the mean off the ReLU kink
    }
    SetAllRows();
    for (int i = 0; i < kBatch * o_.features; ++i) x_.push_back(std::sin(i * 1.7f) * 1.9f);
    for (int i = 0; i < kBatch; ++i) y_.push_back(i % 3);
  }

  void SetAllRows() {
    std::vector<uint64_t> all(o_.categorical * o_.buckets);
    for (uint64_t k = 0; k < all.size(); ++k) all[k] = k;
    ASSERT_TRUE(model_->SetRows(0, all, rows_).ok());
  }

  double Loss() { return model_->Evaluate(x_.data(), y_.data(), kBatch)->loss; }

  EmbeddingMlpOptions o_;
  std::unique_ptr<ModelDef> def_;
  std::unique_ptr<compute::Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<float> rows_, x_;
  std::vector<int32_t> y_;
};

TEST_F(EmbeddingMlpTest, SpecHasTheTableAndTheMlpTensors) {
  const ModelSpec& spec = def_->spec();
  ASSERT_EQ(spec.embeddings.size(), 1u);
  EXPECT_EQ(spec.embeddings[0].vocab, 12u);
  EXPECT_EQ(spec.embeddings[0].dim, 3);
  ASSERT_EQ(spec.params.size(), 4u);
  EXPECT_EQ(spec.params[0].name, "fc0.weight");
  EXPECT_EQ(spec.params[0].size(), 8u * 7u);  // features + dim in
  EXPECT_EQ(spec.input_width, 5);
}

TEST_F(EmbeddingMlpTest, KeysAreSortedUniqueAndOneBucketPerFeature) {
  const std::vector<uint64_t> keys = model_->Keys(0, x_.data(), kBatch);
  ASSERT_FALSE(keys.empty());
  for (size_t i = 1; i < keys.size(); ++i) EXPECT_LT(keys[i - 1], keys[i]);
  for (uint64_t k : keys) EXPECT_LT(k, 12u);
  EXPECT_LE(keys.size(), static_cast<size_t>(kBatch * o_.categorical));
}

TEST_F(EmbeddingMlpTest, RowGradientsMatchFiniteDifferences) {
  ASSERT_TRUE(model_->ForwardBackward(x_.data(), y_.data(), kBatch).ok());
  const std::vector<uint64_t> keys = model_->Keys(0, x_.data(), kBatch);
  std::vector<float> grads(keys.size() * o_.dim);
  model_->GetRowGrads(0, absl::MakeSpan(grads));
  const float eps = 1e-2f;
  for (size_t k = 0; k < keys.size(); ++k) {
    for (int j = 0; j < o_.dim; ++j) {
      float& v = rows_[keys[k] * o_.dim + j];
      const float saved = v;
      v = saved + eps;
      SetAllRows();
      const double up = Loss();
      v = saved - eps;
      SetAllRows();
      const double down = Loss();
      v = saved;
      SetAllRows();
      EXPECT_NEAR(grads[k * o_.dim + j], (up - down) / (2 * eps), 2e-3)
          << "row " << keys[k] << " element " << j;
    }
  }
}

TEST_F(EmbeddingMlpTest, ARowNotSetIsRefusedNamingIt) {
  auto fresh = *def_->Create(backend_.get(), WholeModel(kBatch));
  auto r = fresh->ForwardBackward(x_.data(), y_.data(), kBatch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("emb0"), absl::string_view::npos) << r.status();
}

TEST_F(EmbeddingMlpTest, BadRowsAndStagesAreRefused) {
  std::vector<uint64_t> keys = {1, 99};
  std::vector<float> rows(2 * o_.dim);
  EXPECT_EQ(model_->SetRows(0, keys, rows).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(model_->SetRows(0, {1}, rows).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->SetRows(1, {1}, absl::MakeSpan(rows.data(), o_.dim)).code(),
            absl::StatusCode::kInvalidArgument);
  InstanceOptions stage = WholeModel(kBatch);
  stage.end_layer = 1;
  EXPECT_EQ(def_->Create(backend_.get(), stage).status().code(),
            absl::StatusCode::kInvalidArgument);
  EmbeddingMlpOptions bad = o_;
  bad.categorical = 9;
  EXPECT_EQ(MakeEmbeddingMlpDef(bad, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster::model
