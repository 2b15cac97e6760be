#include "worker/modes/steps_file.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/training_mode.h"
#include "nlohmann/json.hpp"

namespace pscluster::modes {

StepsFile::StepsFile(std::string path, std::function<Mode()> mode)
    : path_(std::move(path)), mode_(std::move(mode)), out_(path_, std::ios::app) {}

absl::StatusOr<std::unique_ptr<StepsFile>> StepsFile::Open(const std::string& path,
                                                           std::function<Mode()> mode) {
  std::unique_ptr<StepsFile> f(new StepsFile(path, std::move(mode)));
  if (!f->out_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--steps_file ", path, " cannot be opened for appending: name a writable file"));
  }
  f->flushed_ = absl::Now();
  return f;
}

absl::Status StepsFile::AfterStep(const StepDone& done) {
  const nlohmann::json line = {{"step", done.step},
                               {"epoch", done.epoch},
                               {"loss", done.loss},
                               {"seconds", absl::ToDoubleSeconds(done.took)},
                               {"comm_seconds", absl::ToDoubleSeconds(done.comm)},
                               {"mode", coord::ModeName(mode_())}};
  // A non-finite loss would be written as null: JSON has no NaN.
  Write(line.dump(), done.epoch_end);
  return absl::OkStatus();
}

void StepsFile::RolledBack(int64_t failed, int64_t resumed) {
  Write(nlohmann::json{{"rollback", {{"failed", failed}, {"resumed", resumed}}}}.dump(), true);
}

void StepsFile::Write(const std::string& line, bool flush_now) {
  if (failed_) return;
  out_ << line << '\n';
  if (flush_now || absl::Now() - flushed_ >= absl::Seconds(1)) {
    out_.flush();
    flushed_ = absl::Now();
  }
  if (!out_) {
    failed_ = true;
    LogWarning("--steps_file %s: a write failed (is the disk full?); no more steps go there",
               path_.c_str());
  }
}

}  // namespace pscluster::modes
