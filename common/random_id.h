// 128 random bits as 32 hex digits, from the kernel's randomness: ids that must not repeat
// across processes (a client's id) and secrets a caller cannot guess (a member's).
#pragma once

#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace pscluster {

inline std::string RandomId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(random(), absl::kZeroPad8));
  return id;
}

}  // namespace pscluster
