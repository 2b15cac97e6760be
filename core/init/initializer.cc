#include "core/init/initializer.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster::core {
namespace {

constexpr float kMaxNormalScale = std::numeric_limits<float>::max() / 6.0f;

// Uniform in [0, 1) from the top 24 bits of a hash.
float Unit(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

float ValueAt(const ps::InitializerConfig& c, uint64_t stream, uint64_t index) {
  switch (c.kind()) {
    case ps::InitializerConfig::CONSTANT:
      return c.value();
    case ps::InitializerConfig::UNIFORM:
      return c.scale() * (2.0f * Unit(Mix64(stream ^ Mix64(index))) - 1.0f);
    case ps::InitializerConfig::NORMAL: {
      // Box-Muller from two independent hashes of the same position.
      uint64_t h = Mix64(stream ^ Mix64(index));
      float u1 = 1.0f - Unit(h);  // (0, 1]
      float u2 = Unit(Mix64(h));
      return c.scale() * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    }
    default:
      return 0.0f;
  }
}

}  // namespace

absl::Status ValidateInitializer(const ps::InitializerConfig& c) {
  if (!std::isfinite(c.value())) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer.value must be finite, got ", c.value()));
  }
  if (!std::isfinite(c.scale()) || c.scale() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer.scale must be finite and >= 0, got ", c.scale()));
  }
  if (!ps::InitializerConfig::Kind_IsValid(c.kind())) {
    return absl::InvalidArgumentError(absl::StrCat("initializer.kind ", c.kind(), " is unknown"));
  }
  // NORMAL draws at most 5.8 standard deviations (Box-Muller from 24-bit uniforms): a larger
  // scale would make some values infinite.
  if (c.kind() == ps::InitializerConfig::NORMAL && c.scale() > kMaxNormalScale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initializer.scale ", c.scale(), " of a NORMAL initializer must be <= ", kMaxNormalScale,
        " (its values stay finite)"));
  }
  return absl::OkStatus();
}

void InitDense(const ps::InitializerConfig& c, uint64_t first_index, absl::Span<float> out) {
  uint64_t stream = Mix64(c.seed());
  for (size_t i = 0; i < out.size(); ++i) out[i] = ValueAt(c, stream, first_index + i);
}

void InitSparseRow(const ps::InitializerConfig& c, uint64_t key, absl::Span<float> out) {
  uint64_t stream = Mix64(c.seed() ^ Mix64(key));
  for (size_t i = 0; i < out.size(); ++i) out[i] = ValueAt(c, stream, i);
}

}  // namespace pscluster::core
