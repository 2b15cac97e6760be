// DenseChunk and DenseBatch, the bulk messages, coded by hand straight into and out of
// gRPC's byte buffers, as TensorFlow's gRPC tensor coding does for its tensors. A client's
// push copies each tensor once, into the one slice gRPC sends (through protobuf it is
// copied twice: into the message's string, then into gRPC's buffer); a shard's pull answer
// is read from the table straight into that slice (through protobuf: into the message's
// string, then into gRPC's buffer); a client copies each received value once, from the
// slices into the caller's array (through protobuf: parsed into a string, then copied
// out). The bytes are the protobuf encoding with the fields in number order, as protobuf
// writes them: the other side cannot tell the difference.
#pragma once

#include <cstddef>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.pb.h"

namespace pscluster::internal {

// Writes chunk i's data, data_bytes[i] bytes, at dst; an error abandons the encoding.
using ChunkFill = std::function<absl::Status(size_t i, char* dst)>;

// Chunk i is headers[i]'s fields (its data must be empty) and a data field of data_bytes[i]
// bytes that fill(i, ...) writes in place, in one slice: a DenseBatch of them (`batch`), or
// the one DenseChunk (!batch, one header).
absl::StatusOr<grpc::ByteBuffer> EncodeDense(absl::Span<const ps::DenseChunk> headers,
                                             absl::Span<const size_t> data_bytes, bool batch,
                                             const ChunkFill& fill);

// Messages of 64 KiB and more are encoded into blocks that are recycled once gRPC drops the
// message (up to 64 MiB of them kept per process: a fresh block's pages fault in on first
// touch). Frees the blocks kept.
void ReleasePooledMessageMemory();

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

}  // namespace pscluster::internal
