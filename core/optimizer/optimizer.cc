#include "core/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pscluster::core {
namespace {

using Kind = OptimizerOptions::Kind;

// The learning rate at update `step` (1-based), with the optional exponential decay.
struct Schedule {
  explicit Schedule(const OptimizerOptions& o)
      : lr(o.learning_rate),
        rate(o.lr_decay_rate),
        steps(o.lr_decay_steps),
        warmup(o.lr_warmup_steps) {}
  float At(int64_t step) const {
    const double t = static_cast<double>(step < 1 ? 0 : step - 1);
    double at = lr;
    if (steps > 0) at *= std::pow(double{rate}, t / static_cast<double>(steps));
    if (warmup > 0 && t + 1 < warmup) at *= (t + 1) / static_cast<double>(warmup);
    return static_cast<float>(at);
  }
  float lr;
  float rate;
  int64_t steps;
  int64_t warmup;
};

// Each loop below is a plain element-wise pass over restrict-qualified
// pointers with no calls and only select-style branches, so the compiler can
// vectorize it; dispatch happens once per Apply() through the vtable.

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerOptions& o) : lr_(o) {}
  int num_slots() const override { return 0; }
  float slot_initial_value(int /*slot*/) const override { return 0.0f; }
  void Apply(float* __restrict w, const float* __restrict g, float* const* /*slots*/, size_t n,
             int64_t step) const override {
    const float lr = lr_.At(step);
    for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
  }

 private:
  const Schedule lr_;
};

class Momentum final : public Optimizer {
 public:
  explicit Momentum(const OptimizerOptions& o) : lr_(o), mu_(o.momentum), nesterov_(o.nesterov) {}
  int num_slots() const override { return 1; }
  float slot_initial_value(int /*slot*/) const override { return 0.0f; }
  void Apply(float* __restrict w, const float* __restrict g, float* const* slots, size_t n,
             int64_t step) const override {
    float* __restrict v = slots[0];
    const float lr = lr_.At(step);
    const float mu = mu_;
    if (nesterov_) {
      for (size_t i = 0; i < n; ++i) {
        v[i] = mu * v[i] + g[i];
        w[i] -= lr * (g[i] + mu * v[i]);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        v[i] = mu * v[i] + g[i];
        w[i] -= lr * v[i];
      }
    }
  }

 private:
  const Schedule lr_;
  const float mu_;
  const bool nesterov_;
};

class Adagrad final : public Optimizer {
 public:
  explicit Adagrad(const OptimizerOptions& o)
      : lr_(o), eps_(o.epsilon), init_(o.initial_accumulator) {}
  int num_slots() const override { return 1; }
  float slot_initial_value(int slot) const override { return slot == 0 ? init_ : 0.0f; }
  void Apply(float* __restrict w, const float* __restrict g, float* const* slots, size_t n,
             int64_t step) const override {
    float* __restrict acc = slots[0];
    const float lr = lr_.At(step);
    const float eps = eps_;
    for (size_t i = 0; i < n; ++i) {
      acc[i] += g[i] * g[i];
      w[i] -= lr * g[i] / (std::sqrt(acc[i]) + eps);
    }
  }

 private:
  const Schedule lr_;
  const float eps_;
  const float init_;
};

// Adam and AdamW (decoupled weight decay; decay is 0 for plain Adam).
class Adam final : public Optimizer {
 public:
  Adam(const OptimizerOptions& o, float weight_decay)
      : lr_(o), b1_(o.beta1), b2_(o.beta2), eps_(o.epsilon), weight_decay_(weight_decay) {}
  int num_slots() const override { return 2; }
  float slot_initial_value(int /*slot*/) const override { return 0.0f; }
  void Apply(float* __restrict w, const float* __restrict g, float* const* slots, size_t n,
             int64_t step) const override {
    float* __restrict m = slots[0];
    float* __restrict v = slots[1];
    if (step < 1) step = 1;
    // Bias corrections are computed once per call in double, then used in
    // float32 like PyTorch: w -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps).
    const double t = static_cast<double>(step);
    const float bc1 = static_cast<float>(1.0 - std::pow(double{b1_}, t));
    const float bc2 = static_cast<float>(1.0 - std::pow(double{b2_}, t));
    const float lr = lr_.At(step);
    const float step_size = lr / bc1;
    const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
    const float b1 = b1_, b2 = b2_, eps = eps_;
    const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
    const float decay = 1.0f - lr * weight_decay_;
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      m[i] = b1 * m[i] + one_minus_b1 * gi;
      v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
      const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
      w[i] = w[i] * decay - step_size * m[i] / denom;
    }
  }

 private:
  const Schedule lr_;
  const float b1_;
  const float b2_;
  const float eps_;
  const float weight_decay_;
};

// FTRL-proximal (McMahan et al. 2013), alpha = learning_rate.
class Ftrl final : public Optimizer {
 public:
  explicit Ftrl(const OptimizerOptions& o)
      : alpha_(o), beta_(o.ftrl_beta), l1_(o.l1), l2_(o.l2), init_(o.initial_accumulator) {}
  int num_slots() const override { return 2; }
  float slot_initial_value(int slot) const override {
    return slot == 1 ? init_ : 0.0f;  // Slot 0 is z, slot 1 is n.
  }
  void Apply(float* __restrict w, const float* __restrict g, float* const* slots, size_t n,
             int64_t step) const override {
    float* __restrict z = slots[0];
    float* __restrict acc = slots[1];
    const float inv_alpha = 1.0f / alpha_.At(step);
    const float beta = beta_, l1 = l1_, l2 = l2_;
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      const float n_old = acc[i];
      const float n_new = n_old + gi * gi;
      const float sqrt_n_new = std::sqrt(n_new);
      const float sigma = (sqrt_n_new - std::sqrt(n_old)) * inv_alpha;
      const float zi = z[i] + gi - sigma * w[i];
      z[i] = zi;
      acc[i] = n_new;
      const float shrunk = zi > 0.0f ? zi - l1 : zi + l1;
      const float denom = (beta + sqrt_n_new) * inv_alpha + l2;
      w[i] = std::fabs(zi) <= l1 ? 0.0f : -shrunk / denom;
    }
  }

 private:
  const Schedule alpha_;
  const float beta_;
  const float l1_;
  const float l2_;
  const float init_;
};

absl::Status NotFinite(absl::string_view field, float value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " must be finite, got ", value));
}

// Checks that `value` is finite and >= 0.
absl::Status CheckNonNegative(absl::string_view field, float value) {
  if (!std::isfinite(value)) return NotFinite(field, value);
  if (value < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be >= 0, got ", value));
  }
  return absl::OkStatus();
}

// Checks that `value` is finite and in [0, 1).
absl::Status CheckUnitInterval(absl::string_view field, float value) {
  if (!std::isfinite(value)) return NotFinite(field, value);
  if (value < 0.0f || value >= 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

absl::Status Validate(const OptimizerOptions& o) {
  if (!std::isfinite(o.learning_rate)) {
    return NotFinite("learning_rate", o.learning_rate);
  }
  if (o.learning_rate <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate must be > 0, got ", o.learning_rate));
  }
  for (absl::Status s :
       {CheckUnitInterval("momentum", o.momentum), CheckUnitInterval("beta1", o.beta1),
        CheckUnitInterval("beta2", o.beta2), CheckNonNegative("epsilon", o.epsilon),
        CheckNonNegative("weight_decay", o.weight_decay),
        CheckNonNegative("initial_accumulator", o.initial_accumulator),
        CheckNonNegative("l1", o.l1), CheckNonNegative("l2", o.l2),
        CheckNonNegative("ftrl_beta", o.ftrl_beta)}) {
    if (!s.ok()) return s;
  }
  if (!std::isfinite(o.lr_decay_rate) || o.lr_decay_rate <= 0.0f || o.lr_decay_rate > 1.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr_decay_rate must be in (0, 1], got ", o.lr_decay_rate));
  }
  if (o.lr_warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr_warmup_steps must be >= 0, got ", o.lr_warmup_steps));
  }
  if (o.lr_decay_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr_decay_steps must be >= 0, got ", o.lr_decay_steps));
  }
  return absl::OkStatus();
}

}  // namespace

float ScheduledLearningRate(const OptimizerOptions& options, int64_t update) {
  return Schedule(options).At(update);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerOptions& options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  switch (options.kind) {
    case Kind::kSgd:
      return std::unique_ptr<Optimizer>(new Sgd(options));
    case Kind::kMomentum:
      return std::unique_ptr<Optimizer>(new Momentum(options));
    case Kind::kAdagrad:
      return std::unique_ptr<Optimizer>(new Adagrad(options));
    case Kind::kAdam:
      return std::unique_ptr<Optimizer>(new Adam(options, 0.0f));
    case Kind::kAdamW:
      return std::unique_ptr<Optimizer>(new Adam(options, options.weight_decay));
    case Kind::kFtrl:
      return std::unique_ptr<Optimizer>(new Ftrl(options));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("kind has unknown value ", static_cast<int>(options.kind)));
}

size_t FirstOverflow(const Optimizer& optimizer, const float* w, const float* g,
                     const float* const* slots, size_t n, int64_t step, float g_scale) {
  constexpr size_t kBlock = 512;
  const int num_slots = optimizer.num_slots();
  float scratch_w[kBlock], scratch_g[kBlock], scratch_slots[8][kBlock];
  float* slot_ptrs[8];
  for (int k = 0; k < num_slots; ++k) slot_ptrs[k] = scratch_slots[k];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = std::min(kBlock, n - at);
    std::memcpy(scratch_w, w + at, m * sizeof(float));
    for (size_t i = 0; i < m; ++i) scratch_g[i] = g[at + i] * g_scale;
    for (int k = 0; k < num_slots; ++k)
      std::memcpy(scratch_slots[k], slots[k] + at, m * sizeof(float));
    optimizer.Apply(scratch_w, scratch_g, slot_ptrs, m, step);
    for (size_t i = 0; i < m; ++i) {
      bool finite = std::isfinite(scratch_w[i]);
      for (int k = 0; k < num_slots; ++k) finite = finite && std::isfinite(scratch_slots[k][i]);
      if (!finite) return at + i;
    }
  }
  return n;
}

}  // namespace pscluster::core
