// Writes the seed corpora of the fuzz targets (checked in under fuzz/corpus/):
//   bazel run //fuzz:make_seeds -- $PWD/fuzz/corpus
// ps_service/ and coordinator/: call sequences a real client makes (fuzz_input.h encoding,
// method numbers as in the targets' tables); snapshot/: .psnap files a real shard wrote
// (dense Adam under BSP, sparse Adagrad), plus a truncated and a bit-flipped copy;
// dense_wire/: a shard's answers as the clients receive them (dense_wire_fuzzer's encoding).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/dense_wire.h"
#include "fuzz/seeds.h"
#include "proto/ps.pb.h"
#include "server/ps/service/commands.h"
#include "server/ps/service/options.h"
#include "server/ps/snapshot/file_snapshot_store.h"
#include "server/ps/snapshot/snapshotter.h"

namespace {

using namespace pscluster::fuzz::seeds;

void SnapshotSeeds(const fs::path& out) {
  using namespace pscluster::ps;
  const fs::path root = fs::temp_directory_path() / "make_seeds_snapshots";
  fs::remove_all(root);
  Shard shard(ShardOptions{});
  SnapshotterOptions o;
  o.root = root.string();
  auto snapshotter = *Snapshotter::Create(&shard, o);
  shard.RegisterWorker(0);
  if (!shard.CreateTable(Dense(1, ConsistencyConfig::BSP)).ok() ||
      !shard.CreateTable(Sparse(2)).ok()) {
    std::abort();
  }
  Commands commands(&shard, ServiceOptions().max_chunk_bytes);  // a push's own checks
  DenseChunk c;
  c.set_table_id(1);
  c.set_total_length(300);
  c.set_data(Floats(std::vector<float>(300, 0.25f)));
  PushDenseResponse pushed;
  if (!commands.PushDense(c, &pushed).ok()) std::abort();
  SparseRequest sparse;
  sparse.set_table_id(2);
  for (uint64_t k : {uint64_t{5}, uint64_t{9}}) sparse.add_keys(k);
  sparse.set_grads(Floats(std::vector<float>(8, 1.0f)));
  PushSparseResponse rows;
  if (!commands.PushSparse(sparse, &rows).ok()) std::abort();
  SnapshotRequest request;
  request.set_step(1);
  if (!snapshotter->Snapshot(request, absl::Now() + absl::Seconds(10)).ok() ||
      !snapshotter->AwaitIdle(absl::Now() + absl::Seconds(30))) {
    std::abort();
  }
  std::ifstream in(FileSnapshotStore::SnapshotPath(ShardSnapshotDir(root.string(), 0), 1),
                   std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.empty()) std::abort();
  Write(out / "snapshot" / "dense_bsp_adam_sparse_adagrad.psnap", file);
  Write(out / "snapshot" / "truncated.psnap", file.substr(0, file.size() / 2));
  std::string flipped = file;
  flipped[flipped.size() / 3] ^= 0x10;
  Write(out / "snapshot" / "flipped.psnap", flipped);
  fs::remove_all(root);
}

// A message's bytes behind dense_wire_fuzzer's two bytes: batch or chunk, slice length - 1.
std::string WireInput(bool batch, uint8_t slice_bytes_minus_1, const grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  if (!message.Dump(&slices).ok()) std::abort();
  std::string bytes{static_cast<char>(batch), static_cast<char>(slice_bytes_minus_1)};
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

void DenseWireSeeds(const fs::path& out) {
  using pscluster::ps::DenseChunk;
  DenseChunk h;
  h.set_worker_id(1);
  h.set_step(42);
  h.set_table_id(3);
  h.set_offset(128);
  h.set_begin(100);
  h.set_total_length(1000);
  const std::vector<float> v(40, 0.5f), w(3, -2.0f);
  const grpc::ByteBuffer chunk = pscluster::internal::EncodeDenseChunk(h, v);
  Write(out / "dense_wire" / "chunk_one_slice", WireInput(false, 255, chunk));
  Write(out / "dense_wire" / "chunk_byte_slices", WireInput(false, 0, chunk));
  DenseChunk h2 = h;
  h2.set_table_id(4);
  h2.set_offset(0);
  const std::vector<DenseChunk> headers{h, h2};
  const std::vector<absl::Span<const float>> data{v, w};
  Write(out / "dense_wire" / "batch_7_byte_slices",
        WireInput(true, 6, pscluster::internal::EncodeDenseBatch(headers, data)));
  // Through protobuf, every field twice (the last counts, in protobuf and in the decoder).
  DenseChunk p = h;
  p.set_data(Floats(w));
  std::string twice = p.SerializeAsString() + p.SerializeAsString();
  Write(out / "dense_wire" / "chunk_repeated_fields", std::string{0, 16} + twice);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR (e.g. $PWD/fuzz/corpus)\n");
    return 2;
  }
  PsSeeds(argv[1]);
  CoordinatorSeeds(argv[1]);
  SnapshotSeeds(argv[1]);
  DenseWireSeeds(argv[1]);
  return 0;
}
