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

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int b = absl::GetFlag(FLAGS_batch), t = absl::GetFlag(FLAGS_context);
  const int d = absl::GetFlag(FLAGS_width), a = absl::GetFlag(FLAGS_heads);
  const int v = absl::GetFlag(FLAGS_vocab), k = d / a, n = b * t;
  const int layers = absl::GetFlag(FLAGS_layers);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  auto be = compute::MakeCpuBackend(1);
  auto buffer = [&](size_t count, float value) {
    return std::make_unique<compute::BackendBuffer>(be.get(), std::vector<float>(count, value));
  };
  // Values that keep every kernel on its ordinary path (no denormals, no overflow).
  auto x = buffer(size_t{n} * 4 * d, 0.5f), y = buffer(size_t{n} * 4 * d, 0.25f);
  const size_t weights = size_t{d} * std::max(4 * d, v);
  auto z = buffer(size_t{n} * 4 * d, 0.1f), w = buffer(weights, 0.01f), dw = buffer(weights, 0);
  auto att = buffer(size_t{b} * a * t * t, 0.01f), datt = buffer(size_t{b} * a * t * t, 0.02f);
  auto qkv = buffer(size_t{n} * 3 * d, 0.1f), logits = buffer(size_t{n} * v, 0.1f);
  auto stats = buffer(size_t{2} * n, 1.0f), gamma = buffer(d, 1.0f), beta = buffer(4 * d, 0);
  auto dbias = buffer(4 * d, 0), dgamma = buffer(d, 0), dbeta = buffer(d, 0);
  std::vector<int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = i % v;

  // One product with weights of in x out, forward and both gradients; 3 x 2·n·in·out FLOPs.
  auto linear = [&](int in, int out) {
    be->Gemm(false, false, n, out, in, 1.0f, x->get(), w->get(), 0.0f, y->get());
    be->Gemm(false, true, n, in, out, 1.0f, y->get(), w->get(), 0.0f, z->get());
    be->Gemm(true, false, in, out, n, 1.0f, x->get(), y->get(), 0.0f, dw->get());
  };
  // Attention's products per block: scores q·kᵀ and the output p·v, and their 4 gradients.
  auto attention = [&]() {
    const int count = b * a;
    const float* q = qkv->get();
    const int64_t st = int64_t{t} * t;
    be->GemmBatched(false, true, t, t, k, 1.0f, q, 3 * d, k, q + d, 3 * d, k, 0.0f, att->get(), t,
                    st, count);
    be->GemmBatched(false, false, t, k, t, 1.0f, att->get(), t, st, q + 2 * d, 3 * d, k, 0.0f,
                    y->get(), d, k, count);
    be->GemmBatched(false, true, t, t, k, 1.0f, y->get(), d, k, q + 2 * d, 3 * d, k, 0.0f,
                    datt->get(), t, st, count);  // dp = do·vᵀ
    be->GemmBatched(true, false, t, k, t, 1.0f, att->get(), t, st, y->get(), d, k, 0.0f, z->get(),
                    d, k, count);  // dv = pᵀ·do
    be->GemmBatched(false, false, t, k, t, 1.0f, datt->get(), t, st, q + d, 3 * d, k, 0.0f,
                    z->get(), d, k, count);  // dq = ds·k
    be->GemmBatched(true, false, t, k, t, 1.0f, datt->get(), t, st, q, 3 * d, k, 0.0f, z->get(), d,
                    k, count);  // dk = dsᵀ·q
  };
  const double block_gemm = TimePerCall(seconds, [&] {
    linear(d, 3 * d);
    attention();
    linear(d, d);
    linear(d, 4 * d);
    linear(4 * d, d);
  });
  const double block_flops =
      3 * 2.0 * n * d * (3 * d + d + 4 * d + 4 * d) + 6 * 2.0 * b * a * t * t * k;
  const double head_gemm = TimePerCall(seconds, [&] { linear(d, v); });
  const double head_flops = 3 * 2.0 * n * d * v;

  const double block_elementwise = TimePerCall(seconds, [&] {
    float *mean = stats->get(), *rstd = stats->get() + n;
    be->LayerNorm(x->get(), gamma->get(), beta->get(), n, d, 1e-5f, y->get(), mean, rstd);
    be->AddRowVector(qkv->get(), beta->get(), n, 3 * d);
    be->CausalSoftmax(att->get(), b * a, t);
    be->AddRowVector(y->get(), beta->get(), n, d);
    be->Copy(x->get(), z->get(), size_t{n} * d);  // the residual stream
    be->Axpy(1.0f, y->get(), z->get(), size_t{n} * d);
    be->LayerNorm(z->get(), gamma->get(), beta->get(), n, d, 1e-5f, y->get(), mean, rstd);
    be->AddRowVector(x->get(), beta->get(), n, 4 * d);
    be->Gelu(x->get(), y->get(), size_t{n} * 4 * d);
    be->AddRowVector(z->get(), beta->get(), n, d);
    be->Axpy(1.0f, y->get(), z->get(), size_t{n} * d);
    // Backward: the bias gradients, GELU's, LayerNorm's, softmax's, the residual adds.
    be->ColumnSums(y->get(), n, d, dbias->get());
    be->GeluBackward(x->get(), y->get(), z->get(), size_t{n} * 4 * d);
    be->ColumnSums(z->get(), n, 4 * d, dbias->get());
    be->LayerNormBackward(y->get(), x->get(), gamma->get(), mean, rstd, n, d, z->get(),
                          dgamma->get(), dbeta->get());
    be->Axpy(1.0f, z->get(), y->get(), size_t{n} * d);
    be->ColumnSums(y->get(), n, d, dbias->get());
    be->SoftmaxBackward(att->get(), datt->get(), datt->get(), b * a * t, t);
    be->ColumnSums(qkv->get(), n, 3 * d, dbias->get());
    be->LayerNormBackward(y->get(), x->get(), gamma->get(), mean, rstd, n, d, z->get(),
                          dgamma->get(), dbeta->get());
    be->Axpy(1.0f, z->get(), y->get(), size_t{n} * d);
  });
  const double loss = TimePerCall(seconds, [&] {
    be->SoftmaxCrossEntropy(logits->get(), labels.data(), n, v, logits->get(), nullptr);
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
