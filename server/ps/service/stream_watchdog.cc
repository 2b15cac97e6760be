#include "server/ps/service/stream_watchdog.h"

#include <algorithm>
#include <cstdio>

#include "common/logging.h"

namespace pscluster::ps {

StreamWatchdog::StreamWatchdog(absl::Duration idle) : idle_(idle) {
  if (idle_ > absl::ZeroDuration() && idle_ != absl::InfiniteDuration()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

StreamWatchdog::~StreamWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

StreamWatchdog::Watch::Watch(StreamWatchdog* dog, grpc::ServerContextBase* ctx)
    : dog_(dog), ctx_(ctx), peer_(ctx->peer()), last_ns_(absl::GetCurrentTimeNanos()) {
  absl::MutexLock lock(&dog_->mu_);
  dog_->watches_.insert(this);
}

StreamWatchdog::Watch::~Watch() { Disarm(); }

void StreamWatchdog::Watch::Disarm() {
  absl::MutexLock lock(&dog_->mu_);  // the loop cancels only streams still watched
  dog_->watches_.erase(this);
}

void StreamWatchdog::Loop() {
  const absl::Duration every = std::clamp(idle_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), every)) {
    const int64_t now = absl::GetCurrentTimeNanos();
    for (Watch* w : watches_) {
      if (!w->fired_ && absl::Nanoseconds(now - w->last_ns_.load()) > idle_) {
        w->fired_ = true;
        w->ctx_->TryCancel();
        LogInfo(
            "ps_server: a stream from %s received nothing for %s: cancelled, nothing of it "
            "applied (--stream_idle_timeout)",
            w->peer_.c_str(), absl::FormatDuration(idle_).c_str());
      }
    }
  }
}

}  // namespace pscluster::ps
