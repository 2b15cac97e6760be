// libFuzzer target: the hand-written decoder of the bulk messages (common/dense_wire.h),
// which every C++ and Python client runs on a shard's answers, against protobuf's own parser
// of the same bytes. Input: byte 0 picks DenseChunk (even) or DenseBatch (odd); byte 1 sets
// the length of the slices the message arrives in (1-256 bytes: gRPC hands a message over as
// several slices, and every field may straddle their boundaries); the rest is the message.
// Beyond "no crash, no read outside the input" (ASan): whatever the decoder accepts,
// protobuf accepts too and reads the same chunks, fields and data.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dense_wire.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.pb.h"

namespace {

using pscluster::ps::DenseBatch;
using pscluster::ps::DenseChunk;

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "dense_wire_fuzzer: %s\n", why.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool batch = data[0] & 1;
  const size_t slice_bytes = size_t{data[1]} + 1;
  const std::string message(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < message.size(); at += slice_bytes) {
    slices.emplace_back(message.data() + at, std::min(slice_bytes, message.size() - at));
  }
  const grpc::ByteBuffer buffer(slices.data(), slices.size());

  DenseBatch decoded;  // what the decoder handed its sink, as protobuf would hold it
  auto sink = [&](int index, const DenseChunk& header, size_t bytes) -> absl::StatusOr<char*> {
    if (index != decoded.chunks_size()) {
      Fail(absl::StrCat("chunk ", index, " after ", decoded.chunks_size()));
    }
    if (bytes > message.size()) Fail(absl::StrCat(bytes, " bytes of data in ", message.size()));
    DenseChunk* c = decoded.add_chunks();
    *c = header;
    if (!c->data().empty()) Fail("a header with data");
    c->mutable_data()->resize(bytes);
    return c->mutable_data()->data();
  };
  bool ok;
  if (batch) {
    absl::StatusOr<int> n = pscluster::internal::DecodeDenseBatch(buffer, sink);
    ok = n.ok();
    if (ok && *n != decoded.chunks_size()) {
      Fail(absl::StrCat(*n, " chunks counted, ", decoded.chunks_size(), " decoded"));
    }
  } else {
    ok = pscluster::internal::DecodeDenseChunk(buffer, sink).ok();
    if (ok && decoded.chunks_size() != 1) Fail("a chunk decoded as several");
  }
  if (!ok) return 0;  // stricter than protobuf is allowed (groups are not in these messages)

  DenseBatch parsed;
  const bool parsed_ok =
      batch ? parsed.ParseFromString(message) : parsed.add_chunks()->ParseFromString(message);
  if (!parsed_ok) Fail("the decoder accepted what protobuf refuses");
  for (DenseChunk& c : *parsed.mutable_chunks()) c.DiscardUnknownFields();
  parsed.DiscardUnknownFields();
  std::string diff;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  if (!differencer.Compare(parsed, decoded)) Fail("decoder and protobuf differ: " + diff);
  return 0;
}
