// Checks and sizes of requests that more than one handler file shares.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/parse_errors.h"
#include "grpcpp/support/status.h"
#include "proto/ps.pb.h"

namespace pscluster::ps {

inline absl::Span<const float> AsFloats(const std::string& bytes) {
  return absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()), bytes.size() / 4);
}

inline absl::Status CheckFloatBytes(const std::string& bytes, absl::string_view field) {
  if (bytes.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " holds ", bytes.size(),
                                                   " bytes, not a whole number of float32 values"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckStep(int64_t step) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step));
  return absl::OkStatus();
}

// The gradient bytes a batch carries.
inline uint64_t PayloadBytes(const DenseBatch& batch) {
  uint64_t bytes = 0;
  for (const DenseChunk& c : batch.chunks()) bytes += c.data().size();
  return bytes;
}

// A method of one of the shard's services, e.g. {"ShardAdmin", "Stats"}.
struct RawMethod {
  const char* service;
  const char* method;
};

// A request that did not parse, named as ps_server's parse-error interceptor names those of
// the generated handlers (common/parse_errors.h).
inline grpc::Status Unparsable(const RawMethod& m) {
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat("/pscluster.ps.", m.service, "/", m.method, ": ", kUnparsableRequest));
}
inline grpc::Status Unparsable(const char* data_method) {
  return Unparsable(RawMethod{"ShardData", data_method});
}

}  // namespace pscluster::ps
