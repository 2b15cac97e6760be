#include "worker/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/internal/gpt_model.h"

namespace pscluster::model {
namespace {

using internal::BlockParam;
using internal::Gpt;
using internal::kBlockTensors;
using internal::kWpe;
using internal::kWte;
using internal::LnfGamma;

class GptDef final : public ModelDef {
 public:
  GptDef(const GptOptions& options, uint64_t seed)
      : options_(options), spec_(GptSpec(options, seed)) {}
  const ModelSpec& spec() const override { return spec_; }
  absl::StatusOr<std::unique_ptr<Model>> Create(compute::Backend* backend,
                                                const InstanceOptions& o) const override {
    ASSIGN_OR_RETURN(std::unique_ptr<Gpt> gpt, Gpt::Create(backend, options_, spec_, o));
    return std::unique_ptr<Model>(std::move(gpt));
  }

 private:
  const GptOptions options_;
  const ModelSpec spec_;
};

}  // namespace

absl::Status ValidateGpt(const GptOptions& o) {
  for (const auto& [name, value] : {std::pair<const char*, int>{"layers", o.layers},
                                    {"heads", o.heads},
                                    {"width", o.width},
                                    {"context", o.context},
                                    {"vocab", o.vocab}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("gpt ", name, " must be >= 1, got ", value));
    }
  }
  if (o.width % o.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpt width ", o.width, " is not divisible by heads ", o.heads));
  }
  if (!(o.ln_eps > 0)) return absl::InvalidArgumentError("gpt ln_eps must be > 0");
  return absl::OkStatus();
}

namespace {

// The layers a pipeline splits: the embedding, the blocks and the head, with their
// parameters and costs (FLOP per example, relative).
void AddGptLayers(const GptOptions& o, ModelSpec* spec) {
  const int64_t d = o.width;
  const int lnf = LnfGamma(o.layers);
  const double t = o.context;
  spec->layer_params.push_back({kWte, kWpe});  // the embedding: a lookup and an add
  spec->layer_costs.push_back(t * d);
  for (int l = 0; l < o.layers; ++l) {
    std::vector<int> block;
    for (int i = 0; i < kBlockTensors; ++i) block.push_back(BlockParam(l, i));
    spec->layer_params.push_back(std::move(block));
    spec->layer_costs.push_back(t * 12 * d * d + 2 * t * t * d);  // weights + attention
  }
  spec->layer_params.push_back({lnf, lnf + 1});  // the head, which reads wte
  spec->layer_costs.push_back(t * d * o.vocab);
  spec->layer_reads.assign(spec->layer_params.size(), {});
  spec->layer_reads.back() = {kWte};
}

}  // namespace

ModelSpec GptSpec(const GptOptions& o, uint64_t seed) {
  ModelSpec spec;
  spec.kind = "gpt";
  spec.input_width = o.context;
  spec.label_width = o.context;
  spec.classes = o.vocab;
  spec.eval_batch = 16;  // activations: ~0.6 MB per example and block at the default sizes
  const int64_t d = o.width;
  using Split = TensorSplit;
  auto add = [&](std::string name, std::vector<int64_t> shape, float normal_scale, float constant,
                 Split split = {}) {
    TensorSpec t{std::move(name), std::move(shape), {}};
    if (normal_scale > 0) {
      t.init.set_kind(ps::InitializerConfig::NORMAL);
      t.init.set_scale(normal_scale);
    } else if (constant != 0) {
      t.init.set_kind(ps::InitializerConfig::CONSTANT);
      t.init.set_value(constant);
    }
    t.init.set_seed(seed * 1000 + spec.params.size());
    spec.params.push_back(std::move(t));
    spec.splits.push_back(split);
  };
  const float sigma = 0.02f, residual = 0.02f / std::sqrt(2.0f * std::max(o.layers, 1));
  const Split rows{Split::kRows, 1}, columns{Split::kColumns, 1}, qkv{Split::kColumns, 3};
  add("wte", {o.vocab, d}, sigma, 0, rows);  // TENSOR: split by vocabulary
  add("wpe", {o.context, d}, sigma, 0);
  for (int l = 0; l < o.layers; ++l) {
    const std::string h = absl::StrCat("h", l, ".");
    add(h + "ln1.gamma", {d}, 0, 1);
    add(h + "ln1.beta", {d}, 0, 0);
    add(h + "attn.qkv.weight", {d, 3 * d}, sigma, 0, qkv);  // column-parallel, by heads
    add(h + "attn.qkv.bias", {3 * d}, 0, 0, qkv);
    add(h + "attn.proj.weight", {d, d}, residual, 0, rows);  // row-parallel
    add(h + "attn.proj.bias", {d}, 0, 0);
    add(h + "ln2.gamma", {d}, 0, 1);
    add(h + "ln2.beta", {d}, 0, 0);
    add(h + "mlp.fc.weight", {d, 4 * d}, sigma, 0, columns);  // column-parallel
    add(h + "mlp.fc.bias", {4 * d}, 0, 0, columns);
    add(h + "mlp.proj.weight", {4 * d, d}, residual, 0, rows);  // row-parallel
    add(h + "mlp.proj.bias", {d}, 0, 0);
  }
  add("lnf.gamma", {d}, 0, 1);
  add("lnf.beta", {d}, 0, 0);
  spec.max_tensor_parallel = std::gcd(o.heads, o.vocab);
  AddGptLayers(o, &spec);
  return spec;
}

absl::StatusOr<std::unique_ptr<ModelDef>> MakeGptDef(const GptOptions& options, uint64_t seed) {
  RETURN_IF_ERROR(ValidateGpt(options));
  return std::unique_ptr<ModelDef>(new GptDef(options, seed));
}

}  // namespace pscluster::model