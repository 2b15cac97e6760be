// Tests: textbook Adam on one element in double precision (defaults beta1 0.9, beta2 0.999,
// eps 1e-8), the reference the float optimizers are checked against.
#pragma once

#include <cmath>

namespace pscluster::core::testing {

struct AdamRef {
  double w, m = 0, v = 0;
  int t = 0;
  void Step(double g, double lr) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    ++t;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t));
    const double vhat = v / (1 - std::pow(b2, t));
    w -= lr * mhat / (std::sqrt(vhat) + eps);
  }
};

}  // namespace pscluster::core::testing
