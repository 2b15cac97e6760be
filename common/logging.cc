#include "common/logging.h"

#include <errno.h>

#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "grpc/support/log.h"
#include "spdlog/logger.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace pscluster {
namespace {

struct Loggers {
  std::shared_ptr<spdlog::logger> out;  // info
  std::shared_ptr<spdlog::logger> err;  // warnings and errors
};

// `tag` ("ps_worker/1") goes into the pattern as text: spdlog's pattern treats only '%'
// specially, so it is doubled.
std::shared_ptr<spdlog::logger> MakeLogger(const std::string& tag,
                                           std::shared_ptr<spdlog::sinks::sink> sink) {
  const std::string escaped = absl::StrReplaceAll(tag, {{"%", "%%"}});
  auto logger = std::make_shared<spdlog::logger>(tag, std::move(sink));
  logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      absl::StrCat("%Y-%m-%dT%H:%M:%S.%eZ %L ", escaped, " %v"), spdlog::pattern_time_type::utc));
  logger->set_level(spdlog::level::trace);
  logger->flush_on(spdlog::level::trace);  // every line, as it is written
  return logger;
}

Loggers Make(absl::string_view role, absl::string_view id, std::shared_ptr<spdlog::sinks::sink> out,
             std::shared_ptr<spdlog::sinks::sink> err) {
  const std::string tag = id.empty() ? std::string(role) : absl::StrCat(role, "/", id);
  return {MakeLogger(tag, std::move(out)), MakeLogger(tag, std::move(err))};
}

absl::Mutex mu(absl::kConstInit);
Loggers* current ABSL_GUARDED_BY(mu) = nullptr;

Loggers Current() {
  absl::MutexLock lock(&mu);
  if (current == nullptr) {
    current = new Loggers(Make(program_invocation_short_name, "",
                               std::make_shared<spdlog::sinks::stdout_sink_mt>(),
                               std::make_shared<spdlog::sinks::stderr_sink_mt>()));
  }
  return *current;
}

void FromGrpc(gpr_log_func_args* args) {
  const LogLevel level =
      args->severity == GPR_LOG_SEVERITY_ERROR ? LogLevel::kError : LogLevel::kInfo;
  Log(level, absl::StrCat("grpc: ", args->message, " (", args->file, ":", args->line, ")"));
}

}  // namespace

void InitLoggingTo(absl::string_view role, absl::string_view id,
                   std::shared_ptr<spdlog::sinks::sink> out,
                   std::shared_ptr<spdlog::sinks::sink> err) {
  Loggers made = Make(role, id, std::move(out), std::move(err));
  {
    absl::MutexLock lock(&mu);
    if (current == nullptr) current = new Loggers;
    *current = std::move(made);
  }
  gpr_set_log_function(FromGrpc);
}

void InitLogging(absl::string_view role, absl::string_view id) {
  InitLoggingTo(role, id, std::make_shared<spdlog::sinks::stdout_sink_mt>(),
                std::make_shared<spdlog::sinks::stderr_sink_mt>());
}

void Log(LogLevel level, absl::string_view message) {
  if (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  const Loggers loggers = Current();
  const std::string_view text(message.data(), message.size());  // fmt's own type
  switch (level) {
    case LogLevel::kInfo:
      loggers.out->info("{}", text);
      break;
    case LogLevel::kWarning:
      loggers.err->warn("{}", text);
      break;
    case LogLevel::kError:
      loggers.err->error("{}", text);
      break;
  }
}

}  // namespace pscluster
