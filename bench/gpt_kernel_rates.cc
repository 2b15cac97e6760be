// The two rates psctl plan needs to predict a GPT step on this machine, measured on the CPU
// backend's own kernels at the model's shapes (bench/plan_vs_measured.sh runs one copy per
// worker at once, as the workers share the machine):
//
//   gemm_gflops        the products one block, the head and their backwards run (forward
//                      x W, the gradient's x Wᵀ and Xᵀ x, attention's batched products),
//                      FLOPs (2·m·n·k each) over their time;
//   elementwise_gbps   the step's element-wise kernels (LayerNorm, GELU, causal softmax,
//                      bias adds, residual copies and adds, their backwards, the loss's
//                      softmax) over their time, counted as the plan counts them: 4 bytes
//                      per element of tools/psctl/plan.h's ElementwisePerTokenLayer. On a GPU these
//                      kernels are bound by the memory bandwidth (the plan's --memory_gbps
//                      presets); on a CPU core GELU's tanh and softmax's exp make them
//                      compute-bound, so the rate is measured rather than taken from a copy's
//                      bandwidth.
//
// Not a whole step: no training, no communication, no optimizer; each kernel class alone.
//
//   bazel run -c opt //bench:gpt_kernel_rates -- [--batch=16 --context=128 --width=256
//       --heads=4 --vocab=256 --seconds=3]
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "tools/psctl/plan.h"
#include "worker/compute/backend.h"

ABSL_FLAG(int, batch, 16, "Sequences per step (per worker).");
ABSL_FLAG(int, context, 128, "Tokens per sequence.");
ABSL_FLAG(int, width, 256, "Model width h.");
ABSL_FLAG(int, heads, 4, "Attention heads a.");
ABSL_FLAG(int, vocab, 256, "Vocabulary V.");
ABSL_FLAG(int, layers, 4, "Blocks L: weighs a block's rates against the head's.");
ABSL_FLAG(double, seconds, 3, "Timed seconds per kernel class (after a warm-up pass).");

using namespace pscluster;

namespace {

// Runs fn repeatedly for about `seconds`; returns seconds per call.
double TimePerCall(double seconds, const std::function<void()>& fn) {
  fn();  // warm-up: first touches, BLAS buffers
  int calls = 0;
  const absl::Time start = absl::Now();
  absl::Duration spent;
  do {
    fn();
    ++calls;
    spent = absl::Now() - start;
  } while (absl::ToDoubleSeconds(spent) < seconds);
  return absl::ToDoubleSeconds(spent) / calls;
}

// The kernels' operands: a block's activations, weights and their gradients.
struct Kernels {
  int b, t, d, a, v, k, n;  // batch, context, width, heads, vocabulary, head width, tokens
  std::unique_ptr<compute::Backend> be;
  std::unique_ptr<compute::BackendBuffer> x, y, z, w, dw, att, datt, qkv, logits, stats, gamma,
      beta, dbias, dgamma, dbeta;
  std::vector<int32_t> labels;
};

Kernels MakeKernels() {
  Kernels k;
  k.b = absl::GetFlag(FLAGS_batch), k.t = absl::GetFlag(FLAGS_context);
  k.d = absl::GetFlag(FLAGS_width), k.a = absl::GetFlag(FLAGS_heads);
  k.v = absl::GetFlag(FLAGS_vocab), k.k = k.d / k.a, k.n = k.b * k.t;
  const int b = k.b, t = k.t, d = k.d, a = k.a, v = k.v, n = k.n;
  k.be = compute::MakeCpuBackend(1);
  auto buffer = [&](size_t count, float value) {
    return std::make_unique<compute::BackendBuffer>(k.be.get(), std::vector<float>(count, value));
  };
  // Values that keep every kernel on its ordinary path (no denormals, no overflow).
  k.x = buffer(static_cast<size_t>(n) * 4 * d, 0.5f),
  k.y = buffer(static_cast<size_t>(n) * 4 * d, 0.25f);
  const size_t weights = static_cast<size_t>(d) * std::max(4 * d, v);
  k.z = buffer(static_cast<size_t>(n) * 4 * d, 0.1f), k.w = buffer(weights, 0.01f),
  k.dw = buffer(weights, 0);
  k.att = buffer(static_cast<size_t>(b) * a * t * t, 0.01f),
  k.datt = buffer(static_cast<size_t>(b) * a * t * t, 0.02f);
  k.qkv = buffer(static_cast<size_t>(n) * 3 * d, 0.1f),
  k.logits = buffer(static_cast<size_t>(n) * v, 0.1f);
  k.stats = buffer(size_t{2} * n, 1.0f), k.gamma = buffer(d, 1.0f), k.beta = buffer(4 * d, 0);
  k.dbias = buffer(4 * d, 0), k.dgamma = buffer(d, 0), k.dbeta = buffer(d, 0);
  k.labels.resize(n);
  for (int i = 0; i < n; ++i) k.labels[i] = i % v;
  return k;
}

// One product with weights of in x out, forward and both gradients; 3 x 2·n·in·out FLOPs.
void Linear(Kernels& k, int in, int out) {
  const int n = k.n;
  k.be->Gemm(false, false, n, out, in, 1.0f, k.x->get(), k.w->get(), 0.0f, k.y->get());
  k.be->Gemm(false, true, n, in, out, 1.0f, k.y->get(), k.w->get(), 0.0f, k.z->get());
  k.be->Gemm(true, false, in, out, n, 1.0f, k.x->get(), k.y->get(), 0.0f, k.dw->get());
}

// Attention's products per block: scores q·kᵀ and the output p·v, and their 4 gradients.
void Attention(Kernels& kn) {
  const int b = kn.b, t = kn.t, d = kn.d, a = kn.a, k = kn.k;
  const int count = b * a;
  const float* q = kn.qkv->get();
  const int64_t st = int64_t{t} * t;
  kn.be->GemmBatched(false, true, t, t, k, 1.0f, q, 3 * d, k, q + d, 3 * d, k, 0.0f, kn.att->get(),
                     t, st, count);
  kn.be->GemmBatched(false, false, t, k, t, 1.0f, kn.att->get(), t, st, q + 2 * d, 3 * d, k, 0.0f,
                     kn.y->get(), d, k, count);
  kn.be->GemmBatched(false, true, t, t, k, 1.0f, kn.y->get(), d, k, q + 2 * d, 3 * d, k, 0.0f,
                     kn.datt->get(), t, st, count);  // dp = do·vᵀ
  kn.be->GemmBatched(true, false, t, k, t, 1.0f, kn.att->get(), t, st, kn.y->get(), d, k, 0.0f,
                     kn.z->get(), d, k, count);  // dv = pᵀ·do
  kn.be->GemmBatched(false, false, t, k, t, 1.0f, kn.datt->get(), t, st, q + d, 3 * d, k, 0.0f,
                     kn.z->get(), d, k, count);  // dq = ds·k
  kn.be->GemmBatched(true, false, t, k, t, 1.0f, kn.datt->get(), t, st, q, 3 * d, k, 0.0f,
                     kn.z->get(), d, k, count);  // dk = dsᵀ·q
}

// A block's element-wise kernels, forward and backward.
void BlockElementwise(Kernels& k) {
  const int b = k.b, t = k.t, d = k.d, a = k.a, n = k.n;
  float *mean = k.stats->get(), *rstd = k.stats->get() + n;
  k.be->LayerNorm(k.x->get(), k.gamma->get(), k.beta->get(), n, d, 1e-5f, k.y->get(), mean, rstd);
  k.be->AddRowVector(k.qkv->get(), k.beta->get(), n, 3 * d);
  k.be->CausalSoftmax(k.att->get(), b * a, t);
  k.be->AddRowVector(k.y->get(), k.beta->get(), n, d);
  k.be->Copy(k.x->get(), k.z->get(), static_cast<size_t>(n) * d);  // the residual stream
  k.be->Axpy(1.0f, k.y->get(), k.z->get(), static_cast<size_t>(n) * d);
  k.be->LayerNorm(k.z->get(), k.gamma->get(), k.beta->get(), n, d, 1e-5f, k.y->get(), mean, rstd);
  k.be->AddRowVector(k.x->get(), k.beta->get(), n, 4 * d);
  k.be->Gelu(k.x->get(), k.y->get(), static_cast<size_t>(n) * 4 * d);
  k.be->AddRowVector(k.z->get(), k.beta->get(), n, d);
  k.be->Axpy(1.0f, k.y->get(), k.z->get(), static_cast<size_t>(n) * d);
  // Backward: the bias gradients, GELU's, LayerNorm's, softmax's, the residual adds.
  k.be->ColumnSums(k.y->get(), n, d, k.dbias->get());
  k.be->GeluBackward(k.x->get(), k.y->get(), k.z->get(), static_cast<size_t>(n) * 4 * d);
  k.be->ColumnSums(k.z->get(), n, 4 * d, k.dbias->get());
  k.be->LayerNormBackward(k.y->get(), k.x->get(), k.gamma->get(), mean, rstd, n, d, k.z->get(),
                          k.dgamma->get(), k.dbeta->get());
  k.be->Axpy(1.0f, k.z->get(), k.y->get(), static_cast<size_t>(n) * d);
  k.be->ColumnSums(k.y->get(), n, d, k.dbias->get());
  k.be->SoftmaxBackward(k.att->get(), k.datt->get(), k.datt->get(), b * a * t, t);
  k.be->ColumnSums(k.qkv->get(), n, 3 * d, k.dbias->get());
  k.be->LayerNormBackward(k.y->get(), k.x->get(), k.gamma->get(), mean, rstd, n, d, k.z->get(),
                          k.dgamma->get(), k.dbeta->get());
  k.be->Axpy(1.0f, k.z->get(), k.y->get(), static_cast<size_t>(n) * d);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int layers = absl::GetFlag(FLAGS_layers);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  Kernels kn = MakeKernels();
  const int b = kn.b, t = kn.t, d = kn.d, a = kn.a, v = kn.v, k = kn.k, n = kn.n;
  const double block_gemm = TimePerCall(seconds, [&] {
    Linear(kn, d, 3 * d);
    Attention(kn);
    Linear(kn, d, d);
    Linear(kn, d, 4 * d);
    Linear(kn, 4 * d, d);
  });
  const double block_flops =
      3 * 2.0 * n * d * (3 * d + d + 4 * d + 4 * d) + 6 * 2.0 * b * a * t * t * k;
  const double head_gemm = TimePerCall(seconds, [&] { Linear(kn, d, v); });
  const double head_flops = 3 * 2.0 * n * d * v;
  const double block_elementwise = TimePerCall(seconds, [&] { BlockElementwise(kn); });
  const double loss = TimePerCall(seconds, [&] {
    kn.be->SoftmaxCrossEntropy(kn.logits->get(), kn.labels.data(), n, v, kn.logits->get(), nullptr);
  });
  // The plan's count, 4 bytes an element.
  plan::Model shape;
  shape.layers = layers;
  shape.width = d;
  shape.heads = a;
  shape.vocab = v;
  shape.context = t;
  const plan::ElementwiseCounts e = plan::ElementwisePerTokenLayer(shape);
  const double block_bytes = 4.0 * n * (e.whole + e.split), loss_bytes = 4.0 * n * e.loss;
  std::printf(
      "{\"gemm_gflops\": %.2f, \"block_gemm_gflops\": %.2f, \"head_gemm_gflops\": %.2f, "
      "\"elementwise_gbps\": %.2f, \"block_elementwise_gbps\": %.2f, \"loss_gbps\": %.2f, "
      "\"block_gemm_ms\": %.3f, \"block_elementwise_ms\": %.3f, \"loss_ms\": %.3f}\n",
      (layers * block_flops + head_flops) / (layers * block_gemm + head_gemm) / 1e9,
      block_flops / block_gemm / 1e9, head_flops / head_gemm / 1e9,
      (layers * block_bytes + loss_bytes) / (layers * block_elementwise + loss) / 1e9,
      block_bytes / block_elementwise / 1e9, loss_bytes / loss / 1e9, 1e3 * block_gemm,
      1e3 * block_elementwise, 1e3 * loss);
  return 0;
}
