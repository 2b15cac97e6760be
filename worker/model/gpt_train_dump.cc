// Trains worker/model/gpt alone (one process, Adam from core/optimizer, a constant learning
// rate) on the first STEPS x BATCH windows of the fortunes corpus in order, and writes its
// initial parameters and the loss of every step, for worker/model/gpt_train_torch_check.py,
// which trains the PyTorch twin from the same parameters on the same batches.
//
//   gpt_train_dump OUT_FILE STEPS LR [LAYERS HEADS WIDTH CONTEXT BATCH]
//
// OUT_FILE: a JSON line (the options, the losses), then raw float32 initial parameters.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/init/initializer.h"
#include "core/optimizer/optimizer.h"
#include "worker/compute/backend.h"
#include "worker/data/text.h"
#include "worker/model/gpt.h"

namespace pscluster::model {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

// The dump: a JSON line (sizes, hyper-parameters, losses), then the initial parameters.
int Write(const char* path, const GptOptions& o, int batch, float lr,
          const std::vector<float>& losses, const std::vector<std::vector<float>>& initial) {
  std::vector<size_t> sizes;
  for (const auto& p : initial) sizes.push_back(p.size());
  std::ofstream out(path, std::ios::binary);
  out << absl::StrCat("{\"layers\": ", o.layers, ", \"heads\": ", o.heads, ", \"width\": ", o.width,
                      ", \"context\": ", o.context, ", \"batch\": ", batch, ", \"lr\": ", lr,
                      ", \"losses\": [", absl::StrJoin(losses, ", "), "], \"sizes\": [",
                      absl::StrJoin(sizes, ", "), "]}\n");
  for (const auto& p : initial) {
    out.write(reinterpret_cast<const char*>(p.data()), p.size() * sizeof(float));
  }
  return out.good() ? 0 : 1;
}

int Run(int argc, char** argv) {
  const int steps = std::atoi(argv[2]);
  const float lr = std::strtof(argv[3], nullptr);
  GptOptions o;
  int batch = 16;
  if (argc == 9) {
    o.layers = std::atoi(argv[4]);
    o.heads = std::atoi(argv[5]);
    o.width = std::atoi(argv[6]);
    o.context = std::atoi(argv[7]);
    batch = std::atoi(argv[8]);
  }
  auto corpus = data::LoadFortunes(data::kDefaultFortunesDir);
  if (!corpus.ok()) return Fail(corpus.status());
  auto windows = data::MakeLanguageModelData(corpus->train, o.context);
  if (!windows.ok()) return Fail(windows.status());
  auto def = MakeGptDef(o, 1);
  if (!def.ok()) return Fail(def.status());
  auto backend = compute::MakeCpuBackend(1);
  auto model = (*def)->Create(backend.get(), WholeModel(batch));
  if (!model.ok()) return Fail(model.status());
  core::OptimizerOptions adam;
  adam.kind = core::OptimizerOptions::Kind::kAdam;
  adam.learning_rate = lr;
  auto opt = core::Optimizer::Create(adam);
  if (!opt.ok()) return Fail(opt.status());
  const auto& spec = (*def)->spec();
  std::vector<std::vector<float>> params, m, v, initial;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    params.emplace_back(spec.params[i].size());
    core::InitDense(spec.params[i].init, 0, absl::MakeSpan(params.back()));
    m.emplace_back(params.back().size(), 0.0f);
    v.emplace_back(params.back().size(), 0.0f);
  }
  initial = params;
  std::vector<float> losses, grad;
  const size_t per = static_cast<size_t>(batch) * o.context;
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < params.size(); ++i) (*model)->SetParam(i, params[i].data());
    const size_t first = (static_cast<size_t>(step) * per) % (windows->x.size() - per + 1);
    auto r = (*model)->ForwardBackward(windows->x.data() + first, windows->y.data() + first, batch);
    if (!r.ok()) return Fail(r.status());
    losses.push_back(r->loss);
    for (size_t i = 0; i < params.size(); ++i) {
      grad.resize(params[i].size());
      (*model)->GetGrad(i, grad.data());
      float* slots[] = {m[i].data(), v[i].data()};
      (*opt)->Apply(params[i].data(), grad.data(), slots, grad.size(), step + 1);
    }
  }
  return Write(argv[1], o, batch, lr, losses, initial);
}

}  // namespace
}  // namespace pscluster::model

int main(int argc, char** argv) {
  if (argc != 4 && argc != 9) {
    return std::fprintf(stderr,
                        "usage: gpt_train_dump OUT_FILE STEPS LR [LAYERS HEADS WIDTH CONTEXT "
                        "BATCH]\n"),
           2;
  }
  return pscluster::model::Run(argc, argv);
}
