// What every PsClient call to the shards shares: one stub per shard, the client-wide
// deadline, the conversion of gRPC status into absl::Status naming the shard, and the
// fan-out to every shard on a thread pool (not a thread per shard per call).
// Thread-safe.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/ps/internal/raw_call.h"
#include "client/ps/internal/shard_chains.h"
#include "client/ps/ps_client_options.h"
#include "client/ps/shard_stub.h"
#include "common/backoff.h"
#include "common/call_metadata.h"
#include "common/dense_wire.h"
#include "common/executor.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/security.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.grpc.pb.h"

namespace pscluster::internal {

// The ShardData methods whose messages the client codes itself (common/dense_wire.h),
// called through the generic stub (raw_call.h).
struct DenseMethods {
  const char* pull_dense = "/pscluster.ps.ShardData/PullDense";
  const char* push_dense = "/pscluster.ps.ShardData/PushDense";
  const char* pull_dense_stream = "/pscluster.ps.ShardData/PullDenseStream";
  const char* push_dense_stream = "/pscluster.ps.ShardData/PushDenseStream";
  const char* pull_dense_batch = "/pscluster.ps.ShardData/PullDenseBatch";
  const char* push_dense_batch = "/pscluster.ps.ShardData/PushDenseBatch";
  const char* push_pull_dense_batch = "/pscluster.ps.ShardData/PushPullDenseBatch";
};
inline constexpr DenseMethods kDenseMethods;
using DenseMethod = const char* const DenseMethods::*;

class ShardCalls {
 public:
  using Stub = ShardStub;

  explicit ShardCalls(const PsClientOptions& o)
      : chains_(o.shard_replicas.empty() ? Single(o.shard_addresses) : o.shard_replicas, o.security,
                static_cast<int>(o.max_message_bytes)),
        client_id_(o.client_id),
        rpc_timeout_(o.rpc_timeout),
        wait_slice_(o.wait_slice),
        wait_check_(o.wait_check),
        resolve_chain_(o.resolve_chain),
        replicated_(!o.shard_replicas.empty()),
        pool_(chains_.size() - 1) {
    request_prefix_ = absl::StrCat(absl::Hex(std::random_device()()), "-",
                                   absl::Hex(std::random_device()()), "-");
  }
  // One address per shard.
  static std::vector<std::vector<std::string>> Single(const std::vector<std::string>& addresses) {
    std::vector<std::vector<std::string>> out;
    for (const std::string& a : addresses) out.push_back({a});
    return out;
  }

  int size() const { return chains_.size(); }
  // The replica of `shard` calls go to now (the head, as far as this client knows).
  Stub* stub(int shard) const { return chains_.stub(shard); }
  // The same replica's generic stub, for the methods whose messages the client codes itself.
  grpc::GenericStub* generic(int shard) const { return chains_.generic(shard); }
  std::string Name(int shard) const {
    return absl::StrCat("shard ", shard, " (", chains_.address(shard), ")");
  }
  // A context carrying the deadline and the client id, for streams.
  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
    if (!client_id_.empty()) ctx->AddMetadata(kClientIdKey, client_id_);
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

  bool replicated() const { return replicated_; }
  // A request id for one logical call and all its attempts ("" when not replicated and not
  // `always`: the shards use ids to answer repeated writes, which only a chain needs but
  // for PushPullDenseBatch, whose attempts all push).
  std::string NewRequestId(bool always = false) const {
    return replicated_ || always ? absl::StrCat(request_prefix_, ++requests_) : "";
  }

  // attempt(ctx) makes one whole call with the context given (its deadline: `end`, or one
  // `slice` from now if sooner; default end: the client-wide deadline from now). A call the
  // shard refused (Refused) is made again after a backoff, 1 ms doubling to 100 ms, up to
  // `end`: the shard is busy, not broken, and nothing was applied, so a multi-shard push
  // does not end up on some shards only. With replicas, a call the replica did not take
  // (UNAVAILABLE: dead, cut off, or not the head of its chain) goes on to the next replica,
  // with the same request id (metadata ps-request-id, `id` or a new one): a head that
  // applied the call before it failed has handed it down the chain, and the next head
  // answers the retry from that. So does an attempt of a call that does not wait (no
  // `slice`) once kReplicaAttempt runs out: a replica cut off the network answers nothing.
  template <typename Attempt>
  grpc::Status Retrying(int shard, Attempt attempt, absl::Time end = absl::InfinitePast(),
                        absl::Duration slice = absl::InfiniteDuration(),
                        std::string id = "") const {
    if (end == absl::InfinitePast()) end = absl::Now() + rpc_timeout_;
    if (id.empty()) id = NewRequestId();
    const bool rotate_on_deadline = replicated_ && slice == absl::InfiniteDuration();
    if (rotate_on_deadline) slice = kReplicaAttempt;
    Backoff backoff(absl::Milliseconds(1), absl::Milliseconds(100));
    for (bool said = false;;) {
      const uint64_t at = chains_.moves(shard);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(std::min(end, absl::Now() + slice)));
      if (!client_id_.empty()) ctx.AddMetadata(kClientIdKey, client_id_);
      if (!id.empty()) ctx.AddMetadata(kRequestIdKey, id);
      grpc::Status s = attempt(&ctx);
      const bool failover =
          replicated_ &&
          (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
           (rotate_on_deadline && s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED));
      if ((!Refused(s) && !failover) || absl::Now() + backoff.ceiling() >= end) return s;
      if (failover) {
        if (absl::Status gone = Follow(shard, at, s, &said); !gone.ok()) {
          return ToGrpcStatus(gone);
        }
      }
      backoff.set_max(absl::Milliseconds(failover ? 20 : 100));
      absl::SleepFor(backoff.Next());
    }
  }

  // After a replica did not take a call (`why`): with resolve_chain, the shard's chain as
  // the cluster's view has it now goes in if it changed (calls go to its head), and its
  // error ends the call (the shard's state is gone); else calls go to the next replica.
  // Said once a call, and whenever the chain changes.
  absl::Status Follow(int shard, uint64_t at, const grpc::Status& why, bool* said) const {
    const std::string from = chains_.address(shard);
    if (resolve_chain_) {
      absl::StatusOr<std::vector<std::string>> chain = resolve_chain_(shard, from);
      if (!chain.ok()) {
        LogWarning("shard %d: replica %s did not take the call (%s), and the shard is gone: %s",
                   shard, from.c_str(), why.error_message().c_str(),
                   chain.status().ToString().c_str());
        return chain.status();
      }
      if (chains_.Install(shard, *chain)) {
        LogWarning(
            "shard %d: replica %s did not take the call (%s); the cluster's view has "
            "the chain %s: calls go to its head",
            shard, from.c_str(), why.error_message().c_str(), absl::StrJoin(*chain, ", ").c_str());
        *said = true;
        return absl::OkStatus();
      }
    }
    const std::string to = chains_.Rotate(shard, at);
    if (!*said) {
      LogWarning("shard %d: replica %s did not take the call (%s); trying %s%s", shard,
                 from.c_str(), why.error_message().c_str(), to.c_str(),
                 resolve_chain_ ? " while the coordinator decides" : "");
      *said = true;
    }
    return absl::OkStatus();
  }

  // One call of a dense method, its request or answer (or both) coded by dense_wire as
  // grpc::ByteBuffer, on the replica of `shard` calls go to now.
  template <typename Req, typename Resp>
  grpc::Status DenseCall(int shard, DenseMethod method, grpc::ClientContext* ctx, const Req& req,
                         Resp* resp) const {
    return RawUnary(generic(shard), kDenseMethods.*method, ctx, req, resp);
  }
  // The same with the deadline (Retrying), as Unary.
  template <typename Req, typename Resp>
  absl::Status DenseUnary(int shard, DenseMethod method, const Req& req, Resp* resp) const {
    return Status(shard, Retrying(shard, [&](grpc::ClientContext* ctx) {
                    return DenseCall(shard, method, ctx, req, resp);
                  }));
  }

  // One unary call on `shard` with the deadline (Retrying).
  // (S: the service's stub, one of ShardStub's bases.)
  template <typename S, typename Req, typename Resp>
  absl::Status Unary(int shard, grpc::Status (S::*method)(grpc::ClientContext*, const Req&, Resp*),
                     const Req& req, Resp* resp) const {
    return Status(shard, Retrying(shard, [&](grpc::ClientContext* ctx) {
                    return (stub(shard)->template Get<S>()->*method)(ctx, req, resp);
                  }));
  }

  // A call that may wait in the shard (a BSP/SSP pull): attempt(ctx, n) makes attempt n
  // with a deadline of one wait slice. When a slice runs out, wait_check decides: an
  // error ends the wait with it (naming the shard and what the shard waited for), OK
  // repeats the call (pulls are idempotent), up to the client-wide deadline. The first
  // slice that runs out is said once on stderr, with what the shard waits for. A refused
  // attempt (Refused), or one a replica did not take, is made again with the same n
  // (Retrying, within the deadline). Every attempt carries the same request id (with
  // replicas, or `identified`); with
  // replicas a slice that runs out also moves on to the next replica (which sends the call
  // back if it is not the head): the head may have been cut off.
  template <typename Attempt>
  absl::Status Waiting(int shard, Attempt attempt, bool identified = false) const {
    const absl::Time end = absl::Now() + rpc_timeout_;
    const std::string id = NewRequestId(identified);
    bool said = false;
    for (int n = 0;; ++n) {
      const uint64_t at = chains_.moves(shard);
      const absl::Duration slice =
          wait_check_ ? wait_slice_ : (replicated_ ? kReplicaAttempt : absl::InfiniteDuration());
      grpc::Status s = Retrying(
          shard, [&](grpc::ClientContext* ctx) { return attempt(ctx, n); }, end, slice, id);
      if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && replicated_ &&
          absl::Now() < end) {
        if (absl::Status gone = Follow(shard, at, s, &said); !gone.ok()) {
          return absl::Status(gone.code(), absl::StrCat(Name(shard), ": ", gone.message()));
        }
        if (!wait_check_) continue;
      }
      if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED || !wait_check_ ||
          absl::Now() >= end) {
        return Status(shard, s);
      }
      if (n == 0) {
        LogWarning("still waiting on %s: %s", Name(shard).c_str(), s.error_message().c_str());
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
  template <typename S, typename Req, typename Resp>
  absl::StatusOr<std::vector<Resp>> All(grpc::Status (S::*method)(grpc::ClientContext*, const Req&,
                                                                  Resp*),
                                        const Req& req) {
    std::vector<Resp> out(size());
    absl::Status st = ForEach([&](int s) { return Unary(s, method, req, &out[s]); });
    if (!st.ok()) return st;
    return out;
  }

 private:
  mutable ShardChains chains_;  // where calls go: moved on by calls, which are const
  const std::string client_id_;
  const absl::Duration rpc_timeout_;
  const absl::Duration wait_slice_;
  const std::function<absl::Status()> wait_check_;
  const std::function<absl::StatusOr<std::vector<std::string>>(int, const std::string&)>
      resolve_chain_;
  const bool replicated_;
  std::string request_prefix_;  // random per client: request ids unique across clients
  mutable std::atomic<uint64_t> requests_{0};
  // With replicas: how long one attempt of a call that does not wait may take before the
  // next replica is tried.
  static constexpr absl::Duration kReplicaAttempt = absl::Seconds(5);
  Executor pool_;  // the caller runs one shard's call itself
};

}  // namespace pscluster::internal
