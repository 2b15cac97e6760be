// The one adapter between absl::Status and grpc::Status (same canonical codes).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace pscluster {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// What gRPC's synchronous server answers, before any handler runs, when every one of its
// threads (ps_server --threads) is busy.
inline constexpr absl::string_view kThreadpoolExhausted = "Server Threadpool Exhausted";

// `context` (e.g. "shard 1 (127.0.0.1:5000)") is prefixed to the message; gRPC's own
// refusal at the thread bound gets what to do about it.
inline absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view context = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg =
      context.empty() ? s.error_message() : std::string(context) + ": " + s.error_message();
  if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
      s.error_message() == kThreadpoolExhausted) {
    msg +=
        " (every handler thread is busy, so the call was refused before any handler ran "
        "and changed nothing: retry after a backoff, or give the server more --threads or "
        "more shards)";
  }
  if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
      absl::StrContains(s.error_message(), "message larger than max")) {
    msg +=
        " (gRPC's own limit on one message: a shard takes up to its --max_chunk_bytes plus "
        "64 KiB; the client's is PsClientOptions::max_message_bytes, with chunk_bytes at "
        "most that minus 1 KiB. Raise both together, or send less per call)";
  }
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED && s.error_message().empty()) {
    msg +=
        "the server there does not serve this call: is it the right kind of process (a "
        "ps_coordinator's address where one is asked for, not a ps_server's, or the "
        "reverse)?";
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

}  // namespace pscluster
