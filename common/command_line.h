// --help and --version for every binary. Abseil 20220623's own --help lists only flags defined
// in a file named after the program (none of ours are, so it printed "No flags matched.") and
// exits 1; its --version printed "Debug build (NDEBUG not #defined)". Call before
// absl::ParseCommandLine. Not thread-safe: main() only.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace pscluster {

// When argv (before a "--") holds --help, -h, --helpshort or --helpfull, prints `usage` and
// the flags (--helpfull adds Abseil's own) to stdout and exits 0; --version prints
// "PROGRAM VERSION" (the repository's VERSION file) and exits 0. Otherwise returns.
void HandleHelpAndVersion(int argc, char** argv, absl::string_view usage);

// `text` in lines of at most `width` characters, each after `indent` (help output).
std::string WrapText(absl::string_view text, absl::string_view indent, size_t width);

// The help text itself: `usage`, then each flag as "--name=DEFAULT" and its help, grouped
// by the file that defines it; Abseil's own flags only with `full`.
std::string FlagsHelp(absl::string_view usage, bool full);

}  // namespace pscluster
