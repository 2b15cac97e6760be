// The one adapter between absl::Status and grpc::Status (same canonical codes).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace pscluster {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// `context` (e.g. "shard 1 (127.0.0.1:5000)") is prefixed to the message.
inline absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view context = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg =
      context.empty() ? s.error_message() : std::string(context) + ": " + s.error_message();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

}  // namespace pscluster
