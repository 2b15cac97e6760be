#include <cmath>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "worker/model/internal/gpt_model.h"

namespace pscluster::model::internal {

absl::Status Gpt::Forward(Slot& s, const float* x, int batch, const LayerHooks* hooks) {
  const int n = batch * o_.context, d = o_.width;
  const bool hooked = hooks != nullptr && hooks->before;
  if (embed_) {
    UploadTokenIds(x, n, s.tokens);
    if (hooked) RETURN_IF_ERROR(hooks->before(0, /*backward=*/false));
    backend_->GatherRows(values_[kWte], d, s.tokens, n, s.xs[0]);
    RETURN_IF_ERROR(AllReduce(s.xs[0], static_cast<size_t>(n) * d, hooks));  // TENSOR: rows
    backend_->GatherRows(values_[kWpe], d, positions_, n, tmp_);
    backend_->Axpy(1.0f, tmp_, s.xs[0], static_cast<size_t>(n) * d);
  } else {
    backend_->Upload(x, s.xs[0], static_cast<size_t>(n) * d);
  }
  for (int j = 0; j < blocks(); ++j) {
    if (hooked) RETURN_IF_ERROR(hooks->before(1 + b0_ + j, /*backward=*/false));
    RETURN_IF_ERROR(BlockForward(s, j, batch, hooks));
  }
  if (!head_) return absl::OkStatus();
  if (hooked) RETURN_IF_ERROR(hooks->before(o_.layers + 1, /*backward=*/false));
  const int lnf = LnfGamma(o_.layers);
  backend_->LayerNorm(s.xs.back(), values_[lnf], values_[lnf + 1], n, d, o_.ln_eps, s.lnf, s.meanf,
                      s.rstdf);
  // logits[n x vocab] = lnf[n x d] * wte^T (TENSOR: this worker's vocabulary columns, then
  // every worker's side by side).
  float* logits = tp_ > 1 ? s.logits_local : s.logits;
  backend_->Gemm(false, true, n, vl_, d, 1.0f, s.lnf, values_[kWte], 0.0f, logits);
  if (tp_ > 1) RETURN_IF_ERROR(hooks->all_gather_columns(logits, n, vl_, s.logits));
  return absl::OkStatus();
}

absl::Status Gpt::BlockForward(Slot& s, int j, int batch, const LayerHooks* hooks) {
  const BlockActivations& a = s.blocks[j];
  const int l = b0_ + j;
  const float* x = s.xs[j];
  const auto [t, d, dl, fl, heads, n, k] = Dims(batch);
  const size_t nd = static_cast<size_t>(n) * d;
  const int64_t att = static_cast<int64_t>(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(k));
  compute::Backend& be = *backend_;
  be.LayerNorm(x, W(l, kLn1Gamma), W(l, kLn1Beta), n, d, o_.ln_eps, a.ln1, a.mean1, a.rstd1);
  be.Gemm(false, false, n, 3 * dl, d, 1.0f, a.ln1, W(l, kQkvWeight), 0.0f, a.qkv);
  be.AddRowVector(a.qkv, W(l, kQkvBias), n, 3 * dl);
  for (int b = 0; b < batch; ++b) {  // per example, the heads as one batched product
    const float* q = a.qkv + static_cast<size_t>(b) * t * 3 * dl;
    // scores[h] = scale * q_h k_h^T
    be.GemmBatched(false, true, t, t, k, scale, q, 3 * dl, k, q + dl, 3 * dl, k, 0.0f,
                   a.att + b * heads * att, t, att, heads);
  }
  be.CausalSoftmax(a.att, batch * heads, t);
  for (int b = 0; b < batch; ++b) {  // out_h = p_h v_h, side by side
    const float* v = a.qkv + static_cast<size_t>(b) * t * 3 * dl + 2 * dl;
    be.GemmBatched(false, false, t, k, t, 1.0f, a.att + b * heads * att, t, att, v, 3 * dl, k, 0.0f,
                   a.attn + static_cast<size_t>(b) * t * dl, dl, k, heads);
  }
  // x1 = x + attn Wo + bo (TENSOR: attn Wo is a sum over the workers' rows of Wo).
  if (tp_ > 1) {
    be.Gemm(false, false, n, d, dl, 1.0f, a.attn, W(l, kProjWeight), 0.0f, tmp_);
    RETURN_IF_ERROR(AllReduce(tmp_, nd, hooks));
    be.Copy(x, a.x1, nd);
    be.Axpy(1.0f, tmp_, a.x1, nd);
  } else {
    be.Copy(x, a.x1, nd);
    be.Gemm(false, false, n, d, dl, 1.0f, a.attn, W(l, kProjWeight), 1.0f, a.x1);
  }
  be.AddRowVector(a.x1, W(l, kProjBias), n, d);
  be.LayerNorm(a.x1, W(l, kLn2Gamma), W(l, kLn2Beta), n, d, o_.ln_eps, a.ln2, a.mean2, a.rstd2);
  be.Gemm(false, false, n, fl, d, 1.0f, a.ln2, W(l, kFcWeight), 0.0f, a.h);
  be.AddRowVector(a.h, W(l, kFcBias), n, fl);
  be.Gelu(a.h, a.g, static_cast<size_t>(n) * fl);
  float* out = s.xs[j + 1];  // out = x1 + g Wm + bm (TENSOR: summed over Wm's rows)
  if (tp_ > 1) {
    be.Gemm(false, false, n, d, fl, 1.0f, a.g, W(l, kMlpWeight), 0.0f, tmp_);
    RETURN_IF_ERROR(AllReduce(tmp_, nd, hooks));
    be.Copy(a.x1, out, nd);
    be.Axpy(1.0f, tmp_, out, nd);
  } else {
    be.Copy(a.x1, out, nd);
    be.Gemm(false, false, n, d, fl, 1.0f, a.g, W(l, kMlpWeight), 1.0f, out);
  }
  be.AddRowVector(out, W(l, kMlpBias), n, d);
  return absl::OkStatus();
}

absl::Status Gpt::Backward(Slot& s, int batch, float grad_scale, const LayerHooks* hooks) {
  const int n = batch * o_.context, d = o_.width, lnf = LnfGamma(o_.layers);
  compute::Backend& be = *backend_;
  const bool after = hooks != nullptr && static_cast<bool>(hooks->after_backward);
  if (head_) {
    // logits = lnf wte^T: d lnf = dlogits wte, d wte += dlogits^T lnf (both scaled; TENSOR:
    // this worker's vocabulary columns of dlogits, and d lnf summed over the workers).
    const float* dlogits = s.logits + static_cast<size_t>(tp_rank_) * vl_;
    be.GemmBatched(false, false, n, d, vl_, grad_scale, dlogits, o_.vocab, 0, values_[kWte], d, 0,
                   0.0f, dln_, d, 0, 1);
    RETURN_IF_ERROR(AllReduce(dln_, static_cast<size_t>(n) * d, hooks));
    be.GemmBatched(true, false, vl_, d, n, grad_scale, dlogits, o_.vocab, 0, s.lnf, d, 0, 1.0f,
                   grads_[kWte], d, 0, 1);
    be.LayerNormBackward(dln_, s.xs.back(), values_[lnf], s.meanf, s.rstdf, n, d, dx_, grads_[lnf],
                         grads_[lnf + 1]);
    if (after) RETURN_IF_ERROR(hooks->after_backward(o_.layers + 1));
  }
  for (int j = blocks() - 1; j >= 0; --j) {
    const int l = b0_ + j;
    if (hooks != nullptr && hooks->before) RETURN_IF_ERROR(hooks->before(1 + l, true));
    if (share_) {
      for (int t = 0; t < kBlockTensors; ++t) ZeroGrad(BlockParam(l, t));
    }
    RETURN_IF_ERROR(BlockBackward(s, j, batch, hooks));
    if (after) RETURN_IF_ERROR(hooks->after_backward(1 + l));
  }
  if (embed_) {
    be.ScatterAddRows(dx_, d, s.tokens, n, grads_[kWte], tp_ > 1 ? vl_ + 1 : vl_);
    be.ScatterAddRows(dx_, d, positions_, n, grads_[kWpe], o_.context);
    if (after) RETURN_IF_ERROR(hooks->after_backward(0));
  }
  return absl::OkStatus();
}

absl::Status Gpt::BlockBackward(const Slot& s, int j, int batch, const LayerHooks* hooks) {
  const BlockActivations& a = s.blocks[j];
  const int l = b0_ + j;
  const float* x = s.xs[j];
  const auto [t, d, dl, fl, heads, n, k] = Dims(batch);
  const size_t nd = static_cast<size_t>(n) * d;
  const int64_t att = static_cast<int64_t>(t) * t;
  const float scale = 1.0f / std::sqrt(static_cast<float>(k));
  compute::Backend& be = *backend_;
  // out = x1 + g Wm + bm (Wm: this worker's rows; dx_ and bm replicated).
  be.Gemm(true, false, fl, d, n, 1.0f, a.g, dx_, 1.0f, G(l, kMlpWeight));
  be.Gemm(false, false, 1, d, n, 1.0f, ones_, dx_, 1.0f, G(l, kMlpBias));
  be.Gemm(false, true, n, fl, d, 1.0f, dx_, W(l, kMlpWeight), 0.0f, dh_);
  be.GeluBackward(a.h, dh_, dh_, static_cast<size_t>(n) * fl);
  // h = ln2 Wfc + bfc (Wfc: this worker's columns; d ln2 summed over the workers).
  be.Gemm(true, false, d, fl, n, 1.0f, a.ln2, dh_, 1.0f, G(l, kFcWeight));
  be.Gemm(false, false, 1, fl, n, 1.0f, ones_, dh_, 1.0f, G(l, kFcBias));
  be.Gemm(false, true, n, d, fl, 1.0f, dh_, W(l, kFcWeight), 0.0f, dln_);
  RETURN_IF_ERROR(AllReduce(dln_, nd, hooks));
  be.LayerNormBackward(dln_, a.x1, W(l, kLn2Gamma), a.mean2, a.rstd2, n, d, tmp_, G(l, kLn2Gamma),
                       G(l, kLn2Beta));
  be.Axpy(1.0f, tmp_, dx_, nd);  // dx_ is now d x1
  // x1 = x + attn Wo + bo.
  be.Gemm(true, false, dl, d, n, 1.0f, a.attn, dx_, 1.0f, G(l, kProjWeight));
  be.Gemm(false, false, 1, d, n, 1.0f, ones_, dx_, 1.0f, G(l, kProjBias));
  be.Gemm(false, true, n, dl, d, 1.0f, dx_, W(l, kProjWeight), 0.0f, dattn_);
  for (int b = 0; b < batch; ++b) {
    const size_t row = static_cast<size_t>(b) * t;
    const float* v = a.qkv + row * 3 * dl + 2 * dl;
    const float* dout = dattn_ + row * dl;
    // dp_h = dout_h v_h^T; dv_h = p_h^T dout_h.
    be.GemmBatched(false, true, t, t, k, 1.0f, dout, dl, k, v, 3 * dl, k, 0.0f,
                   datt_ + b * heads * att, t, att, heads);
    be.GemmBatched(true, false, t, k, t, 1.0f, a.att + b * heads * att, t, att, dout, dl, k, 0.0f,
                   dqkv_ + row * 3 * dl + 2 * dl, 3 * dl, k, heads);
  }
  be.SoftmaxBackward(a.att, datt_, datt_, batch * heads * t, t);
  for (int b = 0; b < batch; ++b) {
    const size_t row = static_cast<size_t>(b) * t;
    const float* q = a.qkv + row * 3 * dl;
    const float* ds = datt_ + b * heads * att;
    // dq_h = scale ds_h k_h; dk_h = scale ds_h^T q_h.
    be.GemmBatched(false, false, t, k, t, scale, ds, t, att, q + dl, 3 * dl, k, 0.0f,
                   dqkv_ + row * 3 * dl, 3 * dl, k, heads);
    be.GemmBatched(true, false, t, k, t, scale, ds, t, att, q, 3 * dl, k, 0.0f,
                   dqkv_ + row * 3 * dl + dl, 3 * dl, k, heads);
  }
  // qkv = ln1 Wqkv + bqkv (Wqkv: this worker's heads' columns; d ln1 summed).
  be.Gemm(true, false, d, 3 * dl, n, 1.0f, a.ln1, dqkv_, 1.0f, G(l, kQkvWeight));
  be.Gemm(false, false, 1, 3 * dl, n, 1.0f, ones_, dqkv_, 1.0f, G(l, kQkvBias));
  be.Gemm(false, true, n, d, 3 * dl, 1.0f, dqkv_, W(l, kQkvWeight), 0.0f, dln_);
  RETURN_IF_ERROR(AllReduce(dln_, nd, hooks));
  be.LayerNormBackward(dln_, x, W(l, kLn1Gamma), a.mean1, a.rstd1, n, d, tmp_, G(l, kLn1Gamma),
                       G(l, kLn1Beta));
  be.Axpy(1.0f, tmp_, dx_, nd);
  return absl::OkStatus();
}

}  // namespace pscluster::model::internal
