#include "tools/psctl/commands.h"

#include <set>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/command_line.h"

namespace pscluster::psctl {
namespace {

struct Command {
  const char* name;
  const char* synopsis;
  const char* what;
  std::vector<const char*> flags;  // besides TLS and tokens (security.md), which all calls read
};

const std::vector<Command>& Commands() {
  static const auto* const kCommands = new std::vector<Command>{
      {"status",
       "psctl --coordinator=HOST:PORT status [--json]",
       "Members, liveness, steps, loss, the last checkpoint and mode switches. Exits 0 for a "
       "complete cluster or a finished run, 1 for an incomplete one, 3 when unreachable.",
       {"coordinator", "json", "timeout_seconds"}},
      {"top",
       "psctl --coordinator=HOST:PORT top [--interval_seconds=S] [--iterations=N]",
       "status, redrawn live until q or Ctrl-C.",
       {"coordinator", "interval_seconds", "iterations", "timeout_seconds"}},
      {"checkpoint",
       "psctl --coordinator=HOST:PORT checkpoint",
       "Asks the coordinator for a checkpoint now and waits until it is durable on every shard.",
       {"coordinator", "timeout_seconds"}},
      {"checkpoints",
       "psctl --coordinator=HOST:PORT checkpoints",
       "The coordinator's complete checkpoints: step, metric, when taken.",
       {"coordinator", "timeout_seconds"}},
      {"restore",
       "psctl --coordinator=HOST:PORT restore --step=N [--force]",
       "Every shard back to checkpoint N; the later checkpoints are deleted. Refused while "
       "workers are alive, unless --force.",
       {"coordinator", "step", "force", "timeout_seconds"}},
      {"switch-mode",
       "psctl --coordinator=HOST:PORT switch-mode --mode=MODE [--at_step=N]",
       "Switches every worker live to MODE at a step boundary (default: the next one).",
       {"coordinator", "mode", "at_step", "timeout_seconds"}},
      {"health",
       "psctl --address=HOST:PORT health",
       "The gRPC health protocol of a shard or the coordinator: exits 0 when SERVING.",
       {"address", "coordinator", "timeout_seconds"}},
      {"plan",
       "psctl plan --params=N|--layers=L --width=H --heads=A --dataset_bytes=B [--json]",
       "No cluster: how to lay out a training job on GPUs, by arithmetic (docs/planning.md). "
       "psctl --helpfull lists every flag it reads.",
       {"params", "layers", "width", "heads", "dataset_bytes", "dataset_tokens", "nodes",
        "gpus_per_node", "gpu", "precision", "json"}},
      {"export",
       "psctl export --data_dir=DIR --table=NAME|ID --out=NEW_DIR [--step=N]",
       "No cluster: a checkpoint's sparse table (values only) as a RocksDB database for "
       "serving, ids as 8-byte big-endian keys (docs/operations.md#export-for-serving).",
       {"data_dir", "table", "out", "step"}},
      {"help", "psctl help [COMMAND]", "This list, or one command's synopsis and flags.", {}},
  };
  return *kCommands;
}

std::string FlagLine(absl::string_view name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return absl::StrCat("  --", name, "\n");
  return absl::StrCat("  --", name, "=", flag->DefaultValue(), "\n",
                      WrapText(flag->Help(), "      ", 88));
}

}  // namespace

std::string CommandsOverview() {
  std::string out = "psctl COMMAND [flags]; psctl help COMMAND for one command's flags.\n\n";
  for (const Command& c : Commands()) {
    absl::StrAppend(&out, "  ", c.name, "\n", WrapText(c.what, "      ", 88));
  }
  return out;
}

std::optional<std::string> CommandHelp(absl::string_view command) {
  for (const Command& c : Commands()) {
    if (command != c.name) continue;
    std::string out = absl::StrCat("usage: ", c.synopsis, "\n\n", WrapText(c.what, "", 88));
    if (!c.flags.empty()) absl::StrAppend(&out, "\nFlags:\n");
    for (const char* f : c.flags) absl::StrAppend(&out, FlagLine(f));
    if (!c.flags.empty()) {
      absl::StrAppend(&out,
                      "\nWith TLS or tokens: --tls_ca, --token_file, --admin_token_file "
                      "(docs/security.md).\n");
    }
    return out;
  }
  return std::nullopt;
}

// What absl::ParseCommandLine would refuse with exit status 1 (an unknown flag, a flag
// without its value, a value its flag cannot hold), found first so that psctl exits with
// its usage code instead; nullopt when it will parse. Follows its syntax: -flag or --flag,
// =value or the next argument as the value (a bool needs none; --noflag is false), "--"
// ends the flags. A valid value is set here already (ParseCommandLine sets it again);
// absl's own flags (--help..., --flagfile...) are left to it.
std::optional<std::string> FlagError(int argc, char** argv) {
  static const auto* const kAbslOwn = new std::set<absl::string_view>{
      "help",    "helpfull",        "helpshort", "helppackage", "helpon",     "helpmatch",
      "version", "only_check_args", "flagfile",  "fromenv",     "tryfromenv", "undefok"};
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-") || arg.empty()) continue;  // the command
    absl::ConsumePrefix(&arg, "-");
    const size_t eq = arg.find('=');
    const std::string given(arg.substr(0, eq));
    if (kAbslOwn->count(given) > 0) continue;
    absl::string_view name = given;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::ConsumePrefix(&name, "no")) {
      flag = absl::FindCommandLineFlag(name);
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", given);
    std::string value;
    if (eq != absl::string_view::npos) {
      if (negated) return absl::StrCat("--", given, " takes no value");
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = negated ? "false" : "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::StrCat("--", given, " needs a value");
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::StrCat("--", given, "=", value, ": ", error);
    }
  }
  return std::nullopt;
}

}  // namespace pscluster::psctl
