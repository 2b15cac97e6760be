// Ends client streams that stall: a stream that receives nothing for the idle timeout is
// cancelled (its handler's next Read returns false, and it answers without applying
// anything), so a client that opens a push and never finishes it holds neither a server
// thread nor the shard's memory budget for longer than that.
#pragma once

#include <atomic>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace pscluster::ps {

class StreamWatchdog {
 public:
  // `idle` <= 0 or infinite: off (no thread).
  explicit StreamWatchdog(absl::Duration idle);
  ~StreamWatchdog();

  // One stream, watched while this lives; Alive() after each message it receives.
  class Watch {
   public:
    Watch(StreamWatchdog* dog, grpc::ServerContextBase* ctx);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    void Alive() { last_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed); }
    // No more watching (the stream has all it needs): after this, the watchdog cancels it
    // no more, so ServerContext::IsCancelled() says for good whether it did.
    void Disarm();

   private:
    friend class StreamWatchdog;
    StreamWatchdog* const dog_;
    grpc::ServerContextBase* const ctx_;
    const std::string peer_;
    std::atomic<int64_t> last_ns_;
    bool fired_ = false;  // cancelled (the watchdog's, under its mutex)
  };

 private:
  void Loop();

  const absl::Duration idle_;
  absl::Mutex mu_;
  std::set<Watch*> watches_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pscluster::ps
