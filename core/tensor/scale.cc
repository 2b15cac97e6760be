#include "core/tensor/scale.h"

namespace pscluster::core {

void Scale(absl::Span<float> values, float factor) {
  float* v = values.data();
  const size_t n = values.size();
  for (size_t i = 0; i < n; ++i) v[i] *= factor;
}

}  // namespace pscluster::core
