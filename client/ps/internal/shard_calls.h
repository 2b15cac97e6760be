// What every PsClient call to the shards shares: one stub per shard, the client-wide
// deadline, the conversion of gRPC status into absl::Status naming the shard, and the
// fan-out to every shard on a thread pool (not a thread per shard per call).
// Thread-safe.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/executor.h"
#include "common/grpc_status.h"
#include "common/security.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.grpc.pb.h"

namespace pscluster::internal {

class ShardCalls {
 public:
  using Stub = ps::ParameterServer::Stub;

  ShardCalls(const std::vector<std::string>& addresses, absl::Duration rpc_timeout,
             int max_message_bytes, absl::Duration wait_slice = absl::InfiniteDuration(),
             std::function<absl::Status()> wait_check = nullptr,
             const Security& security = Security())
      : addresses_(addresses),
        rpc_timeout_(rpc_timeout),
        wait_slice_(wait_slice),
        wait_check_(std::move(wait_check)),
        pool_(addresses.size() - 1) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(max_message_bytes);
    args.SetMaxSendMessageSize(max_message_bytes);
    for (const std::string& address : addresses_) {
      stubs_.push_back(ps::ParameterServer::NewStub(security.Channel(address, args)));
    }
  }

  int size() const { return static_cast<int>(stubs_.size()); }
  Stub* stub(int shard) const { return stubs_[shard].get(); }
  std::string Name(int shard) const {
    return absl::StrCat("shard ", shard, " (", addresses_[shard], ")");
  }
  // A context carrying the deadline, for streams.
  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  }
  // gRPC status of a call on `shard` -> absl::Status naming it.
  absl::Status Status(int shard, const grpc::Status& s) const {
    return FromGrpcStatus(s, Name(shard));
  }

  // Whether the shard refused a call because every handler thread was busy: refused
  // before any handler ran, so it changed nothing and may be made again.
  static bool Refused(const grpc::Status& s) {
    return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
           s.error_message() == kThreadpoolExhausted;
  }

  // attempt() makes one whole call (a context of its own, with the deadline). A call the
  // shard refused (Refused) is made again after a backoff, 1 ms doubling to 100 ms, up to
  // `end` (default: the client-wide deadline from now): the shard is busy, not broken, and
  // nothing was applied, so a multi-shard push does not end up on some shards only.
  template <typename Attempt>
  grpc::Status Retrying(Attempt attempt, absl::Time end = absl::InfinitePast()) const {
    if (end == absl::InfinitePast()) end = absl::Now() + rpc_timeout_;
    absl::Duration backoff = absl::Milliseconds(1);
    for (;;) {
      grpc::Status s = attempt();
      if (!Refused(s) || absl::Now() + backoff >= end) return s;
      absl::SleepFor(backoff);
      backoff = std::min(2 * backoff, absl::Milliseconds(100));
    }
  }

  // One unary call on `shard` with the deadline (Retrying).
  template <typename Req, typename Resp>
  absl::Status Unary(int shard,
                     grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
                     const Req& req, Resp* resp) const {
    return Status(shard, Retrying([&] {
                    grpc::ClientContext ctx;
                    SetDeadline(&ctx);
                    return (stubs_[shard].get()->*method)(&ctx, req, resp);
                  }));
  }

  // A call that may wait in the shard (a BSP/SSP pull): attempt(ctx, n) makes attempt n
  // with a deadline of one wait slice. When a slice runs out, wait_check decides: an
  // error ends the wait with it (naming the shard and what the shard waited for), OK
  // repeats the call (pulls are idempotent), up to the client-wide deadline. The first
  // slice that runs out is said once on stderr, with what the shard waits for. A refused
  // attempt (Refused) is made again, with the same n (Retrying, within the deadline).
  template <typename Attempt>
  absl::Status Waiting(int shard, Attempt attempt) const {
    const absl::Time end = absl::Now() + rpc_timeout_;
    for (int n = 0;; ++n) {
      grpc::Status s = Retrying(
          [&] {
            grpc::ClientContext ctx;
            ctx.set_deadline(absl::ToChronoTime(
                wait_check_ ? std::min(end, absl::Now() + wait_slice_) : end));
            return attempt(&ctx, n);
          },
          end);
      if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED || !wait_check_ ||
          absl::Now() >= end) {
        return Status(shard, s);
      }
      if (n == 0) {
        std::fprintf(stderr, "still waiting on %s: %s\n", Name(shard).c_str(),
                     s.error_message().c_str());
      }
      if (absl::Status check = wait_check_(); !check.ok()) {
        return absl::Status(check.code(), absl::StrCat(Name(shard), ": gave up waiting (",
                                                       s.error_message(), "): ", check.message()));
      }
    }
  }

  // fn(shard) for every shard concurrently; the first error in shard order.
  absl::Status ForEach(const std::function<absl::Status(int)>& fn) {
    return pool_.ParallelFor(size(), fn);
  }

  // The same request to every shard; their answers by shard id.
  template <typename Req, typename Resp>
  absl::StatusOr<std::vector<Resp>> All(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                     const Req&, Resp*),
                                        const Req& req) {
    std::vector<Resp> out(size());
    absl::Status st = ForEach([&](int s) { return Unary(s, method, req, &out[s]); });
    if (!st.ok()) return st;
    return out;
  }

 private:
  const std::vector<std::string> addresses_;
  const absl::Duration rpc_timeout_;
  const absl::Duration wait_slice_;
  const std::function<absl::Status()> wait_check_;
  std::vector<std::unique_ptr<Stub>> stubs_;
  Executor pool_;  // the caller runs one shard's call itself
};

}  // namespace pscluster::internal
