#include "server/ps/table/admission_sketch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/sharding.h"

namespace pscluster::ps {
namespace {

// One seed per hash, so that the rows collide on different ids (and none hashes like the
// shard routing, Mix64(key)).
constexpr uint64_t kSeeds[AdmissionSketch::kHashes] = {
    0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL, 0xa4093822299f31d0ULL, 0x082efa98ec4e6c89ULL};

}  // namespace

AdmissionSketch::AdmissionSketch(uint32_t counters_per_hash)
    : width_(std::max<uint32_t>(counters_per_hash, 1)), counters_(size_t{kHashes} * width_, '\0') {}

size_t AdmissionSketch::Slot(uint64_t key, int hash) const {
  return size_t{width_} * hash + Mix64(key ^ kSeeds[hash]) % width_;
}

uint32_t AdmissionSketch::Count(uint64_t key) const {
  uint32_t count = kMaxCount;
  for (int h = 0; h < kHashes; ++h) {
    count = std::min<uint32_t>(count, static_cast<uint8_t>(counters_[Slot(key, h)]));
  }
  return count;
}

uint32_t AdmissionSketch::Add(uint64_t key, uint32_t pushes) {
  const uint32_t after = std::min(Count(key) + pushes, kMaxCount);
  for (int h = 0; h < kHashes; ++h) {
    char& c = counters_[Slot(key, h)];
    if (static_cast<uint8_t>(c) < after) c = static_cast<char>(after);
  }
  return after;
}

absl::Status AdmissionSketch::Merge(absl::string_view counts) {
  if (counts.size() != counters_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an admission sketch of ", counts.size(), " counters cannot join one of ",
                     counters_.size(), " (SparseRowPolicy.admission_counters differs)"));
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint32_t sum = static_cast<uint8_t>(counters_[i]) + static_cast<uint8_t>(counts[i]);
    counters_[i] = static_cast<char>(std::min(sum, kMaxCount));
  }
  return absl::OkStatus();
}

}  // namespace pscluster::ps
