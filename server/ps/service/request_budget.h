// The shard-wide budget for the memory that requests in flight hold (ps_server
// --max_inflight_request_bytes). A handler charges the bytes it keeps while it runs (a push
// stream: the whole transfer, held until it is applied; an import or export: the table's
// whole state); a charge that would take the total over the budget is refused with
// RESOURCE_EXHAUSTED naming the budget and the flag. Unary requests, which gRPC has already
// received, are counted without being refused. Every charge is given back when the handler
// returns. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pscluster::ps {

class RequestBudget {
 public:
  explicit RequestBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}
  RequestBudget(const RequestBudget&) = delete;
  RequestBudget& operator=(const RequestBudget&) = delete;

  // What one request holds; given back when destroyed. Move-only.
  class Charge {
   public:
    explicit Charge(RequestBudget* budget) : budget_(budget) {}
    Charge(Charge&& o) noexcept : budget_(o.budget_), bytes_(std::exchange(o.bytes_, 0)) {}
    Charge& operator=(Charge&&) = delete;
    ~Charge() { budget_->Give(bytes_); }

    // Grows the charge to `bytes` in all (a smaller number changes nothing). When that would
    // take the shard's requests in flight over the budget: RESOURCE_EXHAUSTED, naming `what`,
    // the budget and the flag, and the charge stays as it was.
    absl::Status GrowTo(uint64_t bytes, absl::string_view what) {
      if (bytes <= bytes_) return absl::OkStatus();
      uint64_t others = 0;
      if (!budget_->Take(bytes - bytes_, /*force=*/false, &others)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, " would hold ", bytes, " bytes while other requests in flight hold ", others,
            ": over this shard's in-flight request budget of ", budget_->limit(),
            " bytes (ps_server --max_inflight_request_bytes); retry later, or raise the flag"));
      }
      bytes_ = bytes;
      return absl::OkStatus();
    }
    // Grows the charge to `bytes` even over the budget: memory gRPC already holds (a unary
    // request), counted so that streams see it.
    void ForceGrowTo(uint64_t bytes) {
      if (bytes <= bytes_) return;
      uint64_t others = 0;
      budget_->Take(bytes - bytes_, /*force=*/true, &others);
      bytes_ = bytes;
    }
    // Gives everything back now (a handler that has let go of its memory before it ends).
    void Release() { budget_->Give(std::exchange(bytes_, 0)); }
    uint64_t bytes() const { return bytes_; }

   private:
    RequestBudget* budget_;
    uint64_t bytes_ = 0;
  };

  uint64_t limit() const { return limit_; }

  // How long nothing has been charged (zero while some charge is held).
  absl::Duration IdleFor() {
    absl::MutexLock lock(&mu_);
    return in_flight_ > 0 ? absl::ZeroDuration() : absl::Now() - last_busy_;
  }

 private:
  // Adds `bytes` unless (without force) that would exceed the limit; *others: the bytes
  // charged before.
  bool Take(uint64_t bytes, bool force, uint64_t* others) {
    absl::MutexLock lock(&mu_);
    *others = in_flight_;
    if (!force && (bytes > limit_ || in_flight_ > limit_ - bytes)) return false;
    in_flight_ += bytes;
    last_busy_ = absl::Now();
    return true;
  }
  void Give(uint64_t bytes) {
    if (bytes == 0) return;
    absl::MutexLock lock(&mu_);
    in_flight_ -= bytes;
    last_busy_ = absl::Now();
  }

  const uint64_t limit_;
  absl::Mutex mu_;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_busy_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

}  // namespace pscluster::ps
