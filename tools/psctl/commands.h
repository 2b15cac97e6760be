// psctl's command line beyond absl's flags: the check of the flags before absl parses them
// (so that a bad one exits with psctl's usage code), and the help of each command.
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace pscluster::psctl {

// What absl::ParseCommandLine would refuse (an unknown flag, a flag without its value, a
// value its flag cannot hold), or nullopt when it will parse.
std::optional<std::string> FlagError(int argc, char** argv);

// `psctl help`: each command and what it does, one line each.
std::string CommandsOverview();
// `psctl help COMMAND`: its synopsis, what it does, and each flag it reads with its default
// and help (from the flags themselves); nullopt for an unknown command.
std::optional<std::string> CommandHelp(absl::string_view command);

}  // namespace pscluster::psctl
