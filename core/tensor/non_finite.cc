#include "core/tensor/non_finite.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace pscluster::core {

size_t FirstNonFinite(absl::Span<const float> values) {
  constexpr size_t kBlock = 1024;
  for (size_t start = 0; start < values.size(); start += kBlock) {
    const size_t n = std::min(kBlock, values.size() - start);
    const float* v = values.data() + start;
    uint32_t bad = 0;
    for (size_t i = 0; i < n; ++i) {  // exponent all ones <=> Inf or NaN
      uint32_t bits;
      std::memcpy(&bits, v + i, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad) {
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[i])) return start + i;
      }
    }
  }
  return values.size();
}

namespace {

uint32_t MagnitudeBits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits & 0x7fffffffu;
}

float FromMagnitudeBits(uint32_t biggest) {
  if (biggest >= 0x7f800000u) return std::numeric_limits<float>::infinity();
  float out;
  std::memcpy(&out, &biggest, sizeof(out));
  return out;
}

}  // namespace

float MaxAbs(absl::Span<const float> values) {
  uint32_t biggest = 0;
  for (float v : values) biggest = std::max(biggest, MagnitudeBits(v));
  return FromMagnitudeBits(biggest);
}

float AddAndMaxAbs(absl::Span<float> sum, absl::Span<const float> add) {
  uint32_t biggest = 0;
  float* s = sum.data();
  const float* a = add.data();
  for (size_t i = 0; i < sum.size(); ++i) {
    s[i] += a[i];
    biggest = std::max(biggest, MagnitudeBits(s[i]));
  }
  return FromMagnitudeBits(biggest);
}

}  // namespace pscluster::core
