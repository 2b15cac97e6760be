// Replacing a small file so that a crash at any moment leaves the old contents or the new
// ones, never a mix: write a temporary file beside it, fsync it, rename it over the
// target, fsync the directory. Thread-compatible (one writer per path).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pscluster {

// UNAVAILABLE naming the path and the errno text when any step fails (the old contents,
// if any, are then still in place).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace pscluster
