// Writes one forward and backward of worker/model/gpt for worker/model/gpt_torch_test.py,
// which recomputes it in PyTorch (bench/gpt_torch.py) on the same weights and inputs.
//
//   gpt_dump OUT_FILE [LAYERS HEADS WIDTH CONTEXT BATCH]   (default 3 4 32 16 4)
//
// OUT_FILE: a JSON line (the options, batch, loss and every tensor's size), then raw
// little-endian float32: the tokens, the labels, every parameter and every gradient, in
// the spec's order.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/init/initializer.h"
#include "worker/compute/backend.h"
#include "worker/model/gpt.h"

namespace pscluster::model {
namespace {

int Run(const char* path, int layers, int heads, int width, int context, int batch) {
  GptOptions o;
  o.layers = layers;
  o.heads = heads;
  o.width = width;
  o.context = context;
  o.vocab = 256;
  auto def = MakeGptDef(o, 5);
  if (!def.ok()) return std::fprintf(stderr, "%s\n", def.status().ToString().c_str()), 1;
  auto backend = compute::MakeCpuBackend(1);
  auto model = (*def)->Create(backend.get(), WholeModel(batch));
  if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().ToString().c_str()), 1;
  // The spec's values, weights x 5 and LayerNorm/bias values moved off 1 and 0, so that
  // attention and GELU are far from linear and every term of the gradient matters.
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> jitter(-0.2f, 0.2f);
  std::vector<std::vector<float>> params;
  for (const TensorSpec& t : (*def)->spec().params) {
    params.emplace_back(t.size());
    core::InitDense(t.init, 0, absl::MakeSpan(params.back()));
    for (float& v : params.back()) v = t.shape.size() == 1 ? v + jitter(rng) : v * 5.0f;
    (*model)->SetParam(static_cast<int>(params.size() - 1), params.back().data());
  }
  std::vector<float> x(batch * o.context);
  std::vector<int32_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(rng() % o.vocab);
    y[i] = static_cast<int32_t>(rng() % o.vocab);
  }
  auto r = (*model)->ForwardBackward(x.data(), y.data(), batch);
  if (!r.ok()) return std::fprintf(stderr, "%s\n", r.status().ToString().c_str()), 1;
  std::vector<size_t> sizes;
  for (const auto& p : params) sizes.push_back(p.size());
  std::ofstream out(path, std::ios::binary);
  out << absl::StrCat("{\"layers\": ", o.layers, ", \"heads\": ", o.heads, ", \"width\": ", o.width,
                      ", \"context\": ", o.context, ", \"vocab\": ", o.vocab,
                      ", \"batch\": ", batch, ", \"loss\": ", r->loss, ", \"sizes\": [",
                      absl::StrJoin(sizes, ", "), "]}\n");
  std::vector<float> labels(y.begin(), y.end());
  auto write = [&](const std::vector<float>& v) {
    out.write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  write(x);
  write(labels);
  for (const auto& p : params) write(p);
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> g(params[i].size());
    (*model)->GetGrad(static_cast<int>(i), g.data());
    write(g);
  }
  return out.good() ? 0 : 1;
}

}  // namespace
}  // namespace pscluster::model

int main(int argc, char** argv) {
  if (argc != 2 && argc != 7) {
    return std::fprintf(stderr, "usage: gpt_dump OUT_FILE [LAYERS HEADS WIDTH CONTEXT BATCH]\n"), 2;
  }
  if (argc == 2) return pscluster::model::Run(argv[1], 3, 4, 32, 16, 4);
  return pscluster::model::Run(argv[1], std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
                               std::atoi(argv[5]), std::atoi(argv[6]));
}
