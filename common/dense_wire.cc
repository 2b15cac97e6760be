#include "common/dense_wire.h"

#include <grpc/slice.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/size_pool.h"
#include "google/protobuf/io/coded_stream.h"

namespace pscluster::internal {
namespace {

using google::protobuf::io::CodedOutputStream;

constexpr uint32_t kDataTag = (7 << 3) | 2;    // DenseChunk.data, length-delimited
constexpr uint32_t kChunksTag = (1 << 3) | 2;  // DenseBatch.chunks, length-delimited

// The memory of large encoded messages, recycled. In a process whose malloc is left as glibc
// sets it (the client inside a user's program, Python's), a fresh megabyte is often a fresh
// mapping (glibc maps blocks this large, or trims its heap when they are freed), and every
// page of it faults on first touch: on a virtual machine, whose page faults are slow, a
// 1 MiB push then took 0.96 ms of client CPU instead of 0.40
// (bench/history/RESULTS-to-2026-12-05.md, 2026-12-04 evening; the daemons tune malloc,
// common/malloc_mode.h). A slice at or above kPoolFrom bytes takes a block of this pool, and gRPC
// gives the block back when it drops the slice (after sending it, on whichever thread); the pool
// keeps at most kPoolBytes of them and frees the rest. A block is reused for a message of at least
// half its size, so small messages never hold large blocks.
class SlicePool {
 public:
  static SlicePool& Get() {
    static SlicePool* const pool = new SlicePool;  // never destroyed: slices may outlive main
    return *pool;
  }

  grpc::Slice Take(size_t bytes) {
    if (bytes < kPoolFrom) return grpc::Slice(grpc_slice_malloc(bytes), grpc::Slice::STEAL_REF);
    Block block = pool_.Take(bytes).value_or(nullptr);
    if (block == nullptr) {
      block.reset(static_cast<char*>(std::malloc(kHeader + bytes)));
      if (block == nullptr) throw std::bad_alloc();
      std::memcpy(block.get(), &bytes, sizeof(bytes));  // its capacity
    }
    char* data = block.get() + kHeader;
    return grpc::Slice(grpc_slice_new_with_user_data(data, bytes, &Give, block.release()),
                       grpc::Slice::STEAL_REF);
  }

  // Frees every pooled block.
  void Clear() { pool_.Clear(); }

  static constexpr size_t kPoolFrom = 64 << 10;
  static constexpr size_t kPoolBytes = 64 << 20;

 private:
  struct Free {
    void operator()(char* block) const { std::free(block); }
  };
  using Block = std::unique_ptr<char, Free>;  // a header, then the data
  static constexpr size_t kHeader = 64;       // the capacity, and the data cache-line aligned

  static void Give(void* block) {
    size_t capacity;
    std::memcpy(&capacity, block, sizeof(capacity));
    Get().pool_.Put(capacity, Block(static_cast<char*>(block)));
  }

  SizePool<Block> pool_{kPoolBytes};
};

size_t DataFieldBytes(size_t bytes) {
  return bytes == 0 ? 0 : 1 + CodedOutputStream::VarintSize64(bytes) + bytes;
}

size_t ChunkBytes(const ps::DenseChunk& header, size_t data_bytes) {
  return header.ByteSizeLong() + DataFieldBytes(data_bytes);  // ByteSizeLong caches the size
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
  // A varint of at most max_bytes (<= 10) bytes: protobuf's 10 for a value, 5 for a tag or a
  // length; bits beyond 64 are dropped, as protobuf drops them.
  bool Varint(uint64_t* v, int max_bytes = 10) {
    *v = 0;
    for (int i = 0; i < max_bytes; ++i) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << (7 * i);  // the 10th byte's shift is 63
      if (!(b & 0x80)) return true;
    }
    return false;
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

// Reads a field's tag; false where protobuf would refuse it (more than 5 bytes, field number
// 0) or read another field than it names (beyond 32 bits, which protobuf truncates).
bool Tag(Reader& r, uint64_t* tag) {
  return r.Varint(tag, 5) && (*tag >> 3) != 0 && *tag <= 0xffffffffu;
}

// Reads a length-delimited field's length; false where protobuf would refuse it (more than 5
// bytes, 2 GiB or more).
bool Length(Reader& r, uint64_t* length) {
  return r.Varint(length, 5) && *length < (uint64_t{1} << 31);
}

// Skips the value of a field of wire type `type` (its tag read) that must end by `end`;
// false when it does not parse.
bool SkipField(Reader& r, uint64_t type, size_t end) {
  uint64_t v;
  switch (type) {
    case 0:
      return r.Varint(&v) && r.consumed() <= end;
    case 1:
      return 8 <= end - r.consumed() && r.Take(8, nullptr);
    case 2:
      return Length(r, &v) && v <= end - r.consumed() && r.Take(v, nullptr);
    case 5:
      return 4 <= end - r.consumed() && r.Take(4, nullptr);
    default:  // groups (3, 4) are not in these messages; 6 and 7 do not exist
      return false;
  }
}

// Parses the DenseChunk in [r.consumed(), end) and hands its data to sink.
absl::Status ReadChunk(Reader& r, size_t end, int index, const ChunkSink& sink) {
  ps::DenseChunk header;
  Reader::Mark data;
  uint64_t data_bytes = 0;
  while (r.consumed() < end) {
    uint64_t tag, v;
    if (!Tag(r, &tag)) return Malformed("DenseChunk", r.consumed());
    const uint32_t field = static_cast<uint32_t>(tag >> 3);
    if ((tag & 7) == 0 && field >= 1 && field <= 6) {
      if (!r.Varint(&v)) return Malformed("DenseChunk", r.consumed());
      if (field == 1) header.set_worker_id(static_cast<int32_t>(v));
      if (field == 2) header.set_step(static_cast<int64_t>(v));
      if (field == 3) header.set_table_id(static_cast<uint32_t>(v));
      if (field == 4) header.set_offset(v);
      if (field == 5) header.set_total_length(v);
      if (field == 6) header.set_begin(v);
    } else if (tag == kDataTag) {
      if (!Length(r, &v) || v > end - r.consumed()) return Malformed("DenseChunk", r.consumed());
      data = r.mark(), data_bytes = v;  // the last one counts, as in protobuf
      r.Take(v, nullptr);
    } else if (!SkipField(r, tag & 7, end)) {
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

absl::StatusOr<grpc::ByteBuffer> EncodeDense(absl::Span<const ps::DenseChunk> headers,
                                             absl::Span<const size_t> data_bytes, bool batch,
                                             const ChunkFill& fill) {
  std::vector<size_t> chunk_bytes(headers.size());
  size_t total = 0;
  for (size_t i = 0; i < headers.size(); ++i) {
    chunk_bytes[i] = ChunkBytes(headers[i], data_bytes[i]);
    total += chunk_bytes[i];
    if (batch) total += 1 + CodedOutputStream::VarintSize64(chunk_bytes[i]);
  }
  // The buffer owns the slice: no lifetime to manage. (Small slices hold their bytes inline,
  // so they are written through the Slice that keeps them, not a copy of it.)
  grpc::Slice slice = SlicePool::Get().Take(total);
  uint8_t* out = const_cast<uint8_t*>(slice.begin());
  for (size_t i = 0; i < headers.size(); ++i) {
    if (batch) {
      *out++ = kChunksTag;
      out = CodedOutputStream::WriteVarint64ToArray(chunk_bytes[i], out);
    }
    out = headers[i].SerializeWithCachedSizesToArray(out);
    if (data_bytes[i] == 0) continue;
    *out++ = kDataTag;
    out = CodedOutputStream::WriteVarint64ToArray(data_bytes[i], out);
    if (absl::Status st = fill(i, reinterpret_cast<char*>(out)); !st.ok()) return st;
    out += data_bytes[i];
  }
  return grpc::ByteBuffer(&slice, 1);
}

namespace {

// The spans' bytes as chunk data.
grpc::ByteBuffer EncodeSpans(absl::Span<const ps::DenseChunk> headers,
                             absl::Span<const absl::Span<const float>> data, bool batch) {
  std::vector<size_t> bytes;
  for (const auto& d : data) bytes.push_back(d.size() * sizeof(float));
  return *EncodeDense(headers, bytes, batch, [&](size_t i, char* dst) {
    std::memcpy(dst, data[i].data(), bytes[i]);
    return absl::OkStatus();
  });
}

}  // namespace

void ReleasePooledMessageMemory() { SlicePool::Get().Clear(); }

grpc::ByteBuffer EncodeDenseChunk(const ps::DenseChunk& header, absl::Span<const float> data) {
  return EncodeSpans({&header, 1}, {&data, 1}, /*batch=*/false);
}

grpc::ByteBuffer EncodeDenseBatch(absl::Span<const ps::DenseChunk> headers,
                                  absl::Span<const absl::Span<const float>> data) {
  return EncodeSpans(headers, data, /*batch=*/true);
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
    if (!Tag(r, &tag)) return Malformed("DenseBatch", r.consumed());
    if (tag == kChunksTag) {
      if (!Length(r, &v) || v > r.size() - r.consumed()) {
        return Malformed("DenseBatch", r.consumed());
      }
      if (absl::Status s = ReadChunk(r, r.consumed() + v, chunks++, sink); !s.ok()) return s;
    } else if (!SkipField(r, tag & 7, r.size())) {
      return Malformed("DenseBatch", r.consumed());
    }
  }
  return chunks;
}

}  // namespace pscluster::internal
