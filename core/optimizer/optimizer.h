// Server-side optimizers for the parameter server.
//
// An Optimizer turns a gradient into an in-place update of a block of float
// parameters. It holds nothing but its validated options: any per-parameter
// state (momentum buffers, Adam moments, FTRL z/n, ...) lives in caller-owned
// "slot" arrays stored next to the parameters. Because Apply() is const and
// touches only the memory it is handed, one Optimizer may be shared by any
// number of threads, provided no two threads update the same elements at once.
//
// Typical use:
//   absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(options);
//   if (!opt.ok()) return opt.status();
//   std::vector<std::vector<float>> slots((*opt)->num_slots());
//   for (int k = 0; k < (*opt)->num_slots(); ++k)
//     slots[k].assign(n, (*opt)->slot_initial_value(k));
//   ... (*opt)->Apply(w, g, slot_ptrs, n, ++step);

#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace pscluster::core {

// Typed options with documented defaults. Fields that do not apply to the
// selected kind are ignored by the update rule, but every field is still
// validated by Optimizer::Create() so that a bad value is never silently kept.
struct OptimizerOptions {
  enum class Kind { kSgd, kMomentum, kAdagrad, kAdam, kAdamW, kFtrl };
  Kind kind = Kind::kSgd;
  // Step size for every kind (alpha for FTRL). Must be finite and > 0.
  float learning_rate = 0.01f;
  float momentum = 0.9f;  // kMomentum; in [0, 1).
  bool nesterov = false;  // kMomentum
  float beta1 = 0.9f;     // kAdam/kAdamW; in [0, 1).
  float beta2 = 0.999f;   // kAdam/kAdamW; in [0, 1).
  float epsilon = 1e-8f;  // kAdagrad/kAdam/kAdamW; >= 0.
  // kAdamW: decoupled decay (w *= 1 - lr*wd before the Adam step); >= 0.
  float weight_decay = 0.0f;
  // kAdagrad accumulator and kFtrl 'n' start value; >= 0.
  float initial_accumulator = 0.1f;
  float l1 = 0.0f;         // kFtrl; >= 0.
  float l2 = 0.0f;         // kFtrl; >= 0.
  float ftrl_beta = 1.0f;  // kFtrl; >= 0.
  // Exponential learning-rate decay by update count t (the `step` of Apply):
  // lr(t) = learning_rate * lr_decay_rate^((t - 1) / lr_decay_steps), for every kind.
  // lr_decay_steps = 0 (default) disables it; the rate must be in (0, 1].
  float lr_decay_rate = 1.0f;
  int64_t lr_decay_steps = 0;
  // Linear warmup, times the above: lr(t) *= min(1, t / lr_warmup_steps); 0 (default): none.
  int64_t lr_warmup_steps = 0;
};

// Applies server-side updates. Stateless apart from its options: state lives
// in caller-owned "slots" next to the parameters. Thread-safe (const).
//
// Update rules (float32 arithmetic, PyTorch / McMahan et al. 2013 conventions):
//   SGD:      w -= lr*g
//   Momentum: v = mu*v + g;  w -= lr*(nesterov ? g + mu*v : v)
//   Adagrad:  acc += g*g;    w -= lr*g / (sqrt(acc) + eps)
//   Adam:     m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//             w -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
//   AdamW:    w *= 1 - lr*wd, then the Adam step.
//   FTRL:     sigma = (sqrt(n+g*g) - sqrt(n)) / lr;  z += g - sigma*w;
//   (lr is the scheduled rate lr(t): decayed, warmed up.)
//             n += g*g;
//             w = |z| <= l1 ? 0
//                           : -(z - sign(z)*l1) / ((beta + sqrt(n))/lr + l2)
// The scheduled learning rate lr(t) at update `update` (1-based): decayed and warmed up as
// every kind's Apply uses it.
float ScheduledLearningRate(const OptimizerOptions& options, int64_t update);

class Optimizer {
 public:
  // Validates options: INVALID_ARGUMENT with a message naming the field
  // (e.g. "learning_rate must be > 0, got -1") for lr<=0 or non-finite,
  // momentum not in [0,1), beta1/beta2 not in [0,1), epsilon<0,
  // weight_decay<0, initial_accumulator<0, l1<0, l2<0, ftrl_beta<0, any
  // non-finite value, or an unknown kind.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerOptions& options);

  virtual ~Optimizer() = default;

  // Number of float state arrays per parameter (SGD 0, Momentum 1,
  // Adagrad 1, Adam/AdamW 2 (m, v), FTRL 2 (z, n)).
  virtual int num_slots() const = 0;

  // Value slot k starts at (0 unless Adagrad accumulator / FTRL n =
  // initial_accumulator). Returns 0 for an out-of-range slot.
  virtual float slot_initial_value(int slot) const = 0;

  // One update of n elements: w[i] updated from gradient g[i]; slots[k]
  // points at n floats of slot k (slots may be null when num_slots() == 0).
  // step is the 1-based count of updates these elements have received
  // including this one (used for Adam bias correction); values < 1 are
  // treated as 1. w, g and the slot arrays must not overlap.
  virtual void Apply(float* w, const float* g, float* const* slots, size_t n,
                     int64_t step) const = 0;
};

// The first element i whose value or optimizer slots would not be finite after
// Apply(w, g * g_scale, slots, n, step), or n when all would be: computed block by block on
// copies, changing nothing. A finite gradient can overflow (a large gradient times the
// learning rate, or its square in Adam's v); callers refuse such an update before applying.
size_t FirstOverflow(const Optimizer& optimizer, const float* w, const float* g,
                     const float* const* slots, size_t n, int64_t step, float g_scale = 1.0f);

}  // namespace pscluster::core
