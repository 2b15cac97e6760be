#include "client/ps/internal/dense_wire.h"

#include <grpc/slice.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"

namespace pscluster::internal {
namespace {

using google::protobuf::io::CodedOutputStream;

constexpr uint32_t kDataTag = (7 << 3) | 2;    // DenseChunk.data, length-delimited
constexpr uint32_t kChunksTag = (1 << 3) | 2;  // DenseBatch.chunks, length-delimited

size_t DataFieldBytes(size_t bytes) {
  return bytes == 0 ? 0 : 1 + CodedOutputStream::VarintSize64(bytes) + bytes;
}

// Writes `header` (its size computed: ByteSizeLong) then its data field at `out`; returns
// the end.
uint8_t* WriteChunk(const ps::DenseChunk& header, absl::Span<const float> data, uint8_t* out) {
  out = header.SerializeWithCachedSizesToArray(out);
  const size_t bytes = data.size() * sizeof(float);
  if (bytes == 0) return out;
  *out++ = kDataTag;
  out = CodedOutputStream::WriteVarint64ToArray(bytes, out);
  std::memcpy(out, data.data(), bytes);
  return out + bytes;
}

// One slice of `bytes`, filled by fill(start); the buffer owns it (no lifetime to manage).
template <typename Fill>
grpc::ByteBuffer OneSlice(size_t bytes, Fill fill) {
  grpc_slice s = grpc_slice_malloc(bytes);
  fill(GRPC_SLICE_START_PTR(s));
  grpc::Slice slice(s, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&slice, 1);
}

// A cursor over a received message's slices.
class Reader {
 public:
  explicit Reader(const grpc::ByteBuffer& buffer) {
    if (!buffer.Dump(&slices_).ok()) slices_.clear();
    for (const grpc::Slice& s : slices_) size_ += s.size();
  }
  struct Mark {
    size_t slice = 0, pos = 0, consumed = 0;
  };
  Mark mark() const { return at_; }
  void Seek(Mark m) { at_ = m; }
  size_t consumed() const { return at_.consumed; }
  size_t size() const { return size_; }

  bool Byte(uint8_t* b) {
    Settle();
    if (at_.slice == slices_.size()) return false;
    *b = slices_[at_.slice].begin()[at_.pos++];
    ++at_.consumed;
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;  // more than 10 bytes
  }
  // Copies the next n bytes to dst (null: skips them); false when fewer are left.
  bool Take(size_t n, char* dst) {
    if (n > size_ - at_.consumed) return false;
    while (n > 0) {
      Settle();
      const grpc::Slice& s = slices_[at_.slice];
      const size_t k = std::min(n, s.size() - at_.pos);
      if (dst != nullptr) std::memcpy(dst, s.begin() + at_.pos, k), dst += k;
      at_.pos += k, at_.consumed += k, n -= k;
    }
    return true;
  }

 private:
  void Settle() {  // past the end of a slice: on to the next non-empty one
    while (at_.slice < slices_.size() && at_.pos == slices_[at_.slice].size()) {
      ++at_.slice, at_.pos = 0;
    }
  }
  std::vector<grpc::Slice> slices_;
  size_t size_ = 0;
  Mark at_;
};

absl::Status Malformed(const char* what, size_t at) {
  return absl::InternalError(
      absl::StrCat("the answer does not parse as a ", what, " (at byte ", at, ")"));
}

// Parses the DenseChunk in [r.consumed(), end) and hands its data to sink.
absl::Status ReadChunk(Reader& r, size_t end, int index, const ChunkSink& sink) {
  ps::DenseChunk header;
  Reader::Mark data;
  uint64_t data_bytes = 0;
  while (r.consumed() < end) {
    uint64_t tag, v;
    if (!r.Varint(&tag)) return Malformed("DenseChunk", r.consumed());
    const uint32_t field = static_cast<uint32_t>(tag >> 3);
    switch (tag & 7) {
      case 0:
        if (!r.Varint(&v)) return Malformed("DenseChunk", r.consumed());
        if (field == 1) header.set_worker_id(static_cast<int32_t>(v));
        if (field == 2) header.set_step(static_cast<int64_t>(v));
        if (field == 3) header.set_table_id(static_cast<uint32_t>(v));
        if (field == 4) header.set_offset(v);
        if (field == 5) header.set_total_length(v);
        if (field == 6) header.set_begin(v);
        break;
      case 2:
        if (!r.Varint(&v) || v > end - r.consumed()) return Malformed("DenseChunk", r.consumed());
        if (field == 7) data = r.mark(), data_bytes = v;  // the last one counts, as in protobuf
        r.Take(v, nullptr);
        break;
      case 1:
        if (!r.Take(8, nullptr)) return Malformed("DenseChunk", r.consumed());
        break;
      case 5:
        if (!r.Take(4, nullptr)) return Malformed("DenseChunk", r.consumed());
        break;
      default:
        return Malformed("DenseChunk", r.consumed());
    }
  }
  if (r.consumed() != end) return Malformed("DenseChunk", r.consumed());
  absl::StatusOr<char*> dst = sink(index, header, data_bytes);
  if (!dst.ok()) return dst.status();
  if (data_bytes > 0) {
    const Reader::Mark after = r.mark();
    r.Seek(data);
    r.Take(data_bytes, *dst);
    r.Seek(after);
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ByteBuffer EncodeDenseChunk(const ps::DenseChunk& header, absl::Span<const float> data) {
  return OneSlice(header.ByteSizeLong() + DataFieldBytes(data.size() * sizeof(float)),
                  [&](uint8_t* out) { WriteChunk(header, data, out); });
}

grpc::ByteBuffer EncodeDenseBatch(absl::Span<const ps::DenseChunk> headers,
                                  absl::Span<const absl::Span<const float>> data) {
  std::vector<size_t> chunk_bytes(headers.size());
  size_t total = 0;
  for (size_t i = 0; i < headers.size(); ++i) {
    chunk_bytes[i] = headers[i].ByteSizeLong() + DataFieldBytes(data[i].size() * sizeof(float));
    total += 1 + CodedOutputStream::VarintSize64(chunk_bytes[i]) + chunk_bytes[i];
  }
  return OneSlice(total, [&](uint8_t* out) {
    for (size_t i = 0; i < headers.size(); ++i) {
      *out++ = kChunksTag;
      out = CodedOutputStream::WriteVarint64ToArray(chunk_bytes[i], out);
      out = WriteChunk(headers[i], data[i], out);
    }
  });
}

absl::Status DecodeDenseChunk(const grpc::ByteBuffer& buffer, const ChunkSink& sink) {
  Reader r(buffer);
  return ReadChunk(r, r.size(), 0, sink);
}

absl::StatusOr<int> DecodeDenseBatch(const grpc::ByteBuffer& buffer, const ChunkSink& sink) {
  Reader r(buffer);
  int chunks = 0;
  while (r.consumed() < r.size()) {
    uint64_t tag, v;
    if (!r.Varint(&tag)) return Malformed("DenseBatch", r.consumed());
    switch (tag & 7) {
      case 0:
        if (!r.Varint(&v)) return Malformed("DenseBatch", r.consumed());
        break;
      case 2:
        if (!r.Varint(&v) || v > r.size() - r.consumed()) {
          return Malformed("DenseBatch", r.consumed());
        }
        if (tag == kChunksTag) {
          if (absl::Status s = ReadChunk(r, r.consumed() + v, chunks++, sink); !s.ok()) return s;
        } else {
          r.Take(v, nullptr);
        }
        break;
      case 1:
        if (!r.Take(8, nullptr)) return Malformed("DenseBatch", r.consumed());
        break;
      case 5:
        if (!r.Take(4, nullptr)) return Malformed("DenseBatch", r.consumed());
        break;
      default:
        return Malformed("DenseBatch", r.consumed());
    }
  }
  return chunks;
}

DenseMethods::DenseMethods(const std::shared_ptr<grpc::ChannelInterface>& channel)
    : pull_dense("/pscluster.ps.ParameterServer/PullDense", grpc::internal::RpcMethod::NORMAL_RPC,
                 channel),
      push_dense("/pscluster.ps.ParameterServer/PushDense", grpc::internal::RpcMethod::NORMAL_RPC,
                 channel),
      pull_dense_stream("/pscluster.ps.ParameterServer/PullDenseStream",
                        grpc::internal::RpcMethod::SERVER_STREAMING, channel),
      push_dense_stream("/pscluster.ps.ParameterServer/PushDenseStream",
                        grpc::internal::RpcMethod::CLIENT_STREAMING, channel),
      pull_dense_batch("/pscluster.ps.ParameterServer/PullDenseBatch",
                       grpc::internal::RpcMethod::NORMAL_RPC, channel),
      push_dense_batch("/pscluster.ps.ParameterServer/PushDenseBatch",
                       grpc::internal::RpcMethod::NORMAL_RPC, channel),
      push_pull_dense_batch("/pscluster.ps.ParameterServer/PushPullDenseBatch",
                            grpc::internal::RpcMethod::NORMAL_RPC, channel) {}

}  // namespace pscluster::internal
