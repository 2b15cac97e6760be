#include "common/command_line.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/version.h"

namespace pscluster {
namespace {}  // namespace

std::string WrapText(absl::string_view text, absl::string_view indent, size_t width) {
  std::string out, line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      absl::StrAppend(&out, indent, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, indent, line, "\n");
  return out;
}

namespace {

bool IsAbseils(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/");
}

}  // namespace

std::string FlagsHelp(absl::string_view usage, bool full) {
  std::map<std::string, std::map<absl::string_view, const absl::CommandLineFlag*>> by_file;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (full || !IsAbseils(*flag)) by_file[flag->Filename()][name] = flag;
  }
  std::string out = absl::StrCat(usage, "\n\nFlags", full ? "" : " (--helpfull adds Abseil's",
                                 full ? ":\n" : ": --flagfile, --fromenv, --tryfromenv, ...):\n");
  for (const auto& [file, flags] : by_file) {
    absl::StrAppend(&out, "\n  from ", file, ":\n");
    for (const auto& [name, flag] : flags) {
      absl::StrAppend(&out, "    --", name, "=", flag->DefaultValue(), "\n",
                      WrapText(flag->Help(), "        ", 88));
    }
  }
  return out;
}

void HandleHelpAndVersion(int argc, char** argv, absl::string_view usage) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") return;
    if (absl::StartsWith(arg, "--")) arg.remove_prefix(1);
    if (arg == "-version") {
      absl::string_view program = argv[0];
      program.remove_prefix(program.rfind('/') + 1);  // npos + 1 == 0: no folder
      std::printf("%.*s %s\n", static_cast<int>(program.size()), program.data(), PSCLUSTER_VERSION);
      std::exit(0);
    }
    if (arg == "-help" || arg == "-h" || arg == "-helpshort" || arg == "-helpfull") {
      const std::string help = FlagsHelp(usage, arg == "-helpfull");
      std::fwrite(help.data(), 1, help.size(), stdout);
      std::exit(0);
    }
  }
}

}  // namespace pscluster
