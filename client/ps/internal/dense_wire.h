// DenseChunk and DenseBatch, the bulk messages, coded by hand straight into and out of
// gRPC's byte buffers, as TensorFlow's gRPC tensor coding does for its tensors. A push
// copies each tensor once, into the one slice gRPC sends (through protobuf it is copied
// twice: into the message's string, then into gRPC's buffer); a pull copies each value
// once, from the received slices into the caller's array (through protobuf: parsed into a
// string, then copied out). The bytes are the protobuf encoding with the fields in number
// order, as protobuf writes them: the shards cannot tell the difference.
#pragma once

#include <cstddef>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "proto/ps.pb.h"

namespace pscluster::internal {

// One DenseChunk: `header`'s fields (its data must be empty) with `data` as its data.
grpc::ByteBuffer EncodeDenseChunk(const ps::DenseChunk& header, absl::Span<const float> data);

// A DenseBatch: chunk i is headers[i] (data empty) with data[i] as its data.
grpc::ByteBuffer EncodeDenseBatch(absl::Span<const ps::DenseChunk> headers,
                                  absl::Span<const absl::Span<const float>> data);

// Where a received chunk's data goes: given the chunk's index in its message, its other
// fields and the size of its data in bytes, the destination of exactly that many bytes, or
// an error, which ends the decoding.
using ChunkSink =
    std::function<absl::StatusOr<char*>(int index, const ps::DenseChunk& header, size_t bytes)>;

// Decodes a DenseChunk (index 0). INTERNAL naming the problem when it does not parse.
absl::Status DecodeDenseChunk(const grpc::ByteBuffer& buffer, const ChunkSink& sink);

// Decodes a DenseBatch, its chunks in order; the number of chunks.
absl::StatusOr<int> DecodeDenseBatch(const grpc::ByteBuffer& buffer, const ChunkSink& sink);

// The ParameterServer methods whose messages are coded here, registered on one channel.
struct DenseMethods {
  explicit DenseMethods(const std::shared_ptr<grpc::ChannelInterface>& channel);
  grpc::internal::RpcMethod pull_dense, push_dense, pull_dense_stream, push_dense_stream,
      pull_dense_batch, push_dense_batch, push_pull_dense_batch;
};

}  // namespace pscluster::internal
