#include "common/dense_wire.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster::internal {
namespace {

std::string Bytes(const grpc::ByteBuffer& b) {
  grpc::Slice s;
  EXPECT_TRUE(b.DumpToSingleSlice(&s).ok());
  return std::string(reinterpret_cast<const char*>(s.begin()), s.size());
}

// `bytes` split into slices of `piece` bytes, as a received message may arrive.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

ps::DenseChunk Header(uint32_t table, uint64_t offset) {
  ps::DenseChunk c;
  c.set_worker_id(-3);  // negative: a 10-byte varint
  c.set_step(1234567890123);
  c.set_table_id(table);
  c.set_offset(offset);
  c.set_begin(offset);
  c.set_total_length(5);
  return c;
}

std::vector<float> Values(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + 0.5f * i;
  return v;
}

TEST(DenseWireTest, EncodesExactlyWhatProtobufWrites) {
  const std::vector<float> a = Values(5, 1), b = Values(300, -7);
  ps::DenseChunk whole = Header(4, 10);
  whole.set_data(a.data(), a.size() * sizeof(float));
  EXPECT_EQ(Bytes(EncodeDenseChunk(Header(4, 10), a)), whole.SerializeAsString());

  ps::DenseBatch batch;
  *batch.add_chunks() = whole;
  ps::DenseChunk* second = batch.add_chunks();
  *second = Header(9, 0);
  second->set_data(b.data(), b.size() * sizeof(float));
  *batch.add_chunks() = Header(11, 2);  // no data: the field is left out, as protobuf does
  const std::vector<ps::DenseChunk> headers = {Header(4, 10), Header(9, 0), Header(11, 2)};
  const std::vector<absl::Span<const float>> data = {a, b, {}};
  EXPECT_EQ(Bytes(EncodeDenseBatch(headers, data)), batch.SerializeAsString());
}

TEST(DenseWireTest, SmallMessagesHeldInlineBySlicesToo) {
  // A few bytes: gRPC keeps them inside the slice itself, not in a separate block.
  const std::vector<float> one = {2.5f};
  ps::DenseChunk empty, small = Header(1, 0);
  empty.set_table_id(1);
  small.set_data(one.data(), sizeof(float));
  EXPECT_EQ(Bytes(EncodeDenseChunk(Header(1, 0), one)), small.SerializeAsString());
  ps::DenseChunk only_table;
  only_table.set_table_id(1);
  EXPECT_EQ(Bytes(EncodeDenseChunk(only_table, {})), empty.SerializeAsString());
  ps::DenseBatch batch;
  *batch.add_chunks() = empty;
  EXPECT_EQ(Bytes(EncodeDenseBatch({only_table}, {absl::Span<const float>()})),
            batch.SerializeAsString());
}

// Messages of 64 KiB and more are encoded into memory that is recycled once gRPC drops
// them: a message must hold exactly its own bytes whether its block is fresh, reused at a
// smaller size, or another message's that is still alive.
TEST(DenseWireTest, LargeMessagesInRecycledMemoryHoldExactlyTheirBytes) {
  auto expected = [](size_t n, float base) {
    const std::vector<float> v = Values(n, base);
    ps::DenseChunk c = Header(2, 0);
    c.set_data(v.data(), v.size() * sizeof(float));
    return c.SerializeAsString();
  };
  const size_t mib = 1 << 18;  // floats
  std::vector<float> a = Values(mib, 1), b = Values(mib, 2);
  grpc::ByteBuffer first = EncodeDenseChunk(Header(2, 0), a);
  grpc::ByteBuffer second = EncodeDenseChunk(Header(2, 0), b);  // while the first is alive
  EXPECT_EQ(Bytes(first), expected(mib, 1));
  first.Clear();  // its block goes back
  for (const auto& [n, base] : {std::pair<size_t, float>{mib * 3 / 5, 3},
                                {mib, 4},
                                {mib / 4, 5},
                                {mib + 1, 6},
                                {mib * 3 / 5, 7}}) {
    const std::vector<float> v = Values(n, base);
    EXPECT_EQ(Bytes(EncodeDenseChunk(Header(2, 0), v)), expected(n, base)) << n;
  }
  EXPECT_EQ(Bytes(second), expected(mib, 2));
  const std::vector<ps::DenseChunk> headers = {Header(2, 0), Header(3, 0)};
  const std::vector<absl::Span<const float>> data = {a, b};
  ps::DenseBatch batch;
  for (int i = 0; i < 2; ++i) {
    *batch.add_chunks() = headers[i];
    batch.mutable_chunks(i)->set_data(data[i].data(), data[i].size() * sizeof(float));
  }
  EXPECT_EQ(Bytes(EncodeDenseBatch(headers, data)), batch.SerializeAsString());
}

TEST(DenseWireTest, DecodesProtobufsBytesFromAnySlicing) {
  const std::vector<float> a = Values(5, 1), b = Values(300, -7);
  ps::DenseBatch batch;
  for (const auto& [table, values] : {std::pair{4u, &a}, std::pair{9u, &b}}) {
    ps::DenseChunk* c = batch.add_chunks();
    *c = Header(table, 100);
    c->set_data(values->data(), values->size() * sizeof(float));
  }
  const std::string wire = batch.SerializeAsString();
  for (size_t piece : {size_t{1}, size_t{3}, size_t{64}, wire.size()}) {
    std::vector<float> out_a(5), out_b(300);
    std::vector<uint32_t> tables;
    absl::StatusOr<int> n = DecodeDenseBatch(
        Sliced(wire, piece),
        [&](int k, const ps::DenseChunk& h, size_t bytes) -> absl::StatusOr<char*> {
          EXPECT_EQ(h.worker_id(), -3);
          EXPECT_EQ(h.step(), 1234567890123);
          EXPECT_EQ(h.offset(), 100u);
          EXPECT_TRUE(h.data().empty());
          tables.push_back(h.table_id());
          std::vector<float>& out = k == 0 ? out_a : out_b;
          EXPECT_EQ(bytes, out.size() * sizeof(float));
          return reinterpret_cast<char*>(out.data());
        });
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, 2);
    EXPECT_EQ(tables, (std::vector<uint32_t>{4, 9}));
    EXPECT_EQ(out_a, a);
    EXPECT_EQ(out_b, b);
  }
}

TEST(DenseWireTest, DataBeforeTheOtherFieldsAndUnknownFieldsStillDecode) {
  const std::vector<float> a = Values(4, 2);
  std::string wire;
  wire += static_cast<char>((7 << 3) | 2);
  wire += static_cast<char>(a.size() * sizeof(float));
  wire.append(reinterpret_cast<const char*>(a.data()), a.size() * sizeof(float));
  wire += static_cast<char>((4 << 3) | 0), wire += static_cast<char>(42);  // offset 42
  wire += static_cast<char>((15 << 3) | 5), wire.append(4, 'x');           // unknown fixed32
  wire += static_cast<char>((16 << 3) | 1);                                // unknown fixed64,
  wire += static_cast<char>(1), wire.append(8, 'y');                       // 2-byte tag
  std::vector<float> out(4);
  ASSERT_TRUE(
      DecodeDenseChunk(Sliced(wire, 5),
                       [&](int, const ps::DenseChunk& h, size_t bytes) -> absl::StatusOr<char*> {
                         EXPECT_EQ(h.offset(), 42u);
                         EXPECT_EQ(bytes, 16u);
                         return reinterpret_cast<char*>(out.data());
                       })
          .ok());
  EXPECT_EQ(out, a);
}

TEST(DenseWireTest, EveryTruncationIsAnErrorNotACrash) {
  const std::vector<float> a = Values(7, 3);
  const std::string wire = Bytes(EncodeDenseBatch({Header(1, 0), Header(2, 0)}, {a, a}));
  std::vector<float> out(7);
  auto sink = [&](int, const ps::DenseChunk&, size_t bytes) -> absl::StatusOr<char*> {
    if (bytes != out.size() * sizeof(float)) return absl::InternalError("wrong size");
    return reinterpret_cast<char*>(out.data());
  };
  for (size_t cut = 1; cut < wire.size(); ++cut) {
    absl::StatusOr<int> n = DecodeDenseBatch(Sliced(wire.substr(0, cut), 3), sink);
    // A cut exactly between the two chunks is a valid one-chunk batch.
    if (n.ok()) {
      EXPECT_EQ(*n, 1) << "cut at " << cut;
    } else {
      EXPECT_EQ(n.status().code(), absl::StatusCode::kInternal) << "cut at " << cut;
    }
  }
  EXPECT_FALSE(DecodeDenseChunk(Sliced(std::string(11, '\xff'), 4), sink).ok());  // endless varint
  EXPECT_FALSE(DecodeDenseChunk(Sliced("\x3a\x7f"
                                       "abc",
                                       4),
                                sink)
                   .ok());                                       // data past the end
  EXPECT_FALSE(DecodeDenseChunk(Sliced("\x0b", 1), sink).ok());  // group wire type
}

// Field number 0, which protobuf refuses, is an error (dense_wire_fuzzer found it accepted),
// and so is a tag beyond 32 bits, which protobuf truncates to another field's; the largest
// field number is an unknown field like any other.
TEST(DenseWireTest, TagsOutsideProtobufsFieldNumbersAreErrors) {
  auto sink = [](int, const ps::DenseChunk&, size_t) -> absl::StatusOr<char*> {
    return nullptr;  // no data in these
  };
  const std::string field_zero("\x00\x07", 2);                   // field 0, a varint
  const std::string beyond_32_bits("\x88\x80\x80\x80\x20\x01");  // tag 2^33 + 8
  const std::string largest_field("\xf8\xff\xff\xff\x0f\x01");   // field 2^29 - 1
  ps::DenseChunk parsed;
  EXPECT_FALSE(parsed.ParseFromString(field_zero));
  EXPECT_FALSE(DecodeDenseChunk(Sliced(field_zero, 1), sink).ok());
  EXPECT_FALSE(DecodeDenseBatch(Sliced(field_zero, 1), sink).ok());
  EXPECT_FALSE(DecodeDenseChunk(Sliced(beyond_32_bits, 1), sink).ok());
  EXPECT_FALSE(DecodeDenseBatch(Sliced(beyond_32_bits, 1), sink).ok());
  EXPECT_TRUE(parsed.ParseFromString(largest_field));
  EXPECT_TRUE(DecodeDenseChunk(Sliced(largest_field, 1), sink).ok());
  EXPECT_TRUE(DecodeDenseBatch(Sliced(largest_field, 1), sink).ok());
}

TEST(DenseWireTest, TheSinksErrorEndsTheDecoding) {
  const std::vector<float> a = Values(3, 0);
  absl::StatusOr<int> n =
      DecodeDenseBatch(EncodeDenseBatch({Header(1, 0), Header(2, 0)}, {a, a}),
                       [](int k, const ps::DenseChunk&, size_t) -> absl::StatusOr<char*> {
                         return absl::InternalError(absl::StrCat("no room for chunk ", k));
                       });
  EXPECT_EQ(n.status().message(), "no room for chunk 0");
}

}  // namespace
}  // namespace pscluster::internal
