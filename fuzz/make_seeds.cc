// Writes the seed corpora of the fuzz targets (checked in under fuzz/corpus/):
//   bazel run //fuzz:make_seeds -- $PWD/fuzz/corpus
// ps_service/ and coordinator/: call sequences a real client makes (fuzz_input.h encoding,
// method numbers as in the targets' tables); snapshot/: .psnap files a real shard wrote
// (dense Adam under BSP, sparse Adagrad), plus a truncated and a bit-flipped copy;
// dense_wire/: a shard's answers as the clients receive them (dense_wire_fuzzer's encoding).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/dense_wire.h"
#include "fuzz/fuzz_input.h"
#include "proto/coordinator.pb.h"
#include "proto/ps.pb.h"
#include "server/ps/service/commands.h"
#include "server/ps/service/options.h"
#include "server/ps/snapshot/file_snapshot_store.h"
#include "server/ps/snapshot/snapshotter.h"

namespace fs = std::filesystem;
using pscluster::fuzz::AppendCall;

namespace {

void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}

std::string Bytes(const google::protobuf::Message& m) { return m.SerializeAsString(); }

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

pscluster::ps::TableSpec Dense(uint32_t id, pscluster::ps::ConsistencyConfig::Mode mode) {
  pscluster::ps::TableSpec t;
  t.set_table_id(id);
  t.set_name("w" + std::to_string(id));
  t.set_kind(pscluster::ps::TableSpec::DENSE);
  t.set_size(300);
  t.mutable_optimizer()->set_kind(pscluster::ps::OptimizerConfig::ADAM);
  t.mutable_optimizer()->set_learning_rate(0.01f);
  t.mutable_consistency()->set_mode(mode);
  t.mutable_initializer()->set_kind(pscluster::ps::InitializerConfig::UNIFORM);
  t.mutable_initializer()->set_scale(0.1f);
  return t;
}

pscluster::ps::TableSpec Sparse(uint32_t id) {
  pscluster::ps::TableSpec t;
  t.set_table_id(id);
  t.set_name("emb");
  t.set_kind(pscluster::ps::TableSpec::SPARSE);
  t.set_dim(4);
  t.mutable_optimizer()->set_kind(pscluster::ps::OptimizerConfig::ADAGRAD);
  t.mutable_optimizer()->set_learning_rate(0.1f);
  t.mutable_consistency()->set_mode(pscluster::ps::ConsistencyConfig::ASP);
  return t;
}

// Method numbers of ps_service_fuzzer.cc's table.
enum PsMethod : uint8_t {
  kRegister,
  kUnregister,
  kCreate,
  kDescribe,
  kPullDense,
  kPushDense,
  kPullBatch,
  kPushBatch,
  kPushPullBatch,
  kPullSparse,
  kPushSparse,
  kStats,
  kSnapshot,
  kList,
  kStatus,
  kRestore,
  kPushStream,
  kImport,
  kPullStream,
  kExport,
  kReplicate
};

// A stream call's request: the flags byte (1: the client cancels instead of ending the
// stream), then each message as AppendCall writes it (its method byte unused). A server
// stream's: the flags byte (1: the client cancels after the first message), then the request.
std::string StreamOf(bool cancel, const std::vector<std::string>& messages) {
  std::string s(1, static_cast<char>(cancel));
  for (const std::string& m : messages) AppendCall(&s, 0, m);
  return s;
}

void PsSeeds(const fs::path& out) {
  using namespace pscluster::ps;
  std::string s;
  RegisterWorkerRequest reg;
  reg.set_worker_id(0);
  AppendCall(&s, kRegister, Bytes(reg));
  reg.set_worker_id(1);
  AppendCall(&s, kRegister, Bytes(reg));
  CreateTableRequest create;
  *create.mutable_spec() = Dense(1, ConsistencyConfig::BSP);
  AppendCall(&s, kCreate, Bytes(create));
  *create.mutable_spec() = Sparse(2);
  AppendCall(&s, kCreate, Bytes(create));
  for (int w = 0; w < 2; ++w) {
    DenseChunk c;
    c.set_worker_id(w);
    c.set_step(0);
    c.set_table_id(1);
    c.set_total_length(300);
    c.set_data(Floats(std::vector<float>(300, 0.5f * (w + 1))));
    AppendCall(&s, kPushDense, Bytes(c));
  }
  PullDenseRequest pull;
  pull.set_table_id(1);
  pull.set_step(1);
  AppendCall(&s, kPullDense, Bytes(pull));
  SparseRequest sparse;
  sparse.set_table_id(2);
  for (uint64_t k : {uint64_t{3}, uint64_t{17}, uint64_t{3}, uint64_t{1} << 40}) sparse.add_keys(k);
  AppendCall(&s, kPullSparse, Bytes(sparse));
  sparse.set_grads(Floats(std::vector<float>(16, 1.0f)));
  AppendCall(&s, kPushSparse, Bytes(sparse));
  SnapshotRequest snap;
  snap.set_step(1);
  AppendCall(&s, kSnapshot, Bytes(snap));
  AppendCall(&s, kStatus, Bytes(SnapshotStatusRequest()));
  AppendCall(&s, kList, Bytes(ListSnapshotsRequest()));
  RestoreRequest restore;
  restore.set_step(1);
  AppendCall(&s, kRestore, Bytes(restore));
  AppendCall(&s, kStats, Bytes(StatsRequest()));
  Write(out / "ps_service" / "train_snapshot_restore", s);

  // Batches: push and pull two tables in one call, the ASP and SSP ways.
  std::string b;
  reg.set_worker_id(0);
  AppendCall(&b, kRegister, Bytes(reg));
  *create.mutable_spec() = Dense(1, ConsistencyConfig::ASP);
  AppendCall(&b, kCreate, Bytes(create));
  *create.mutable_spec() = Dense(2, ConsistencyConfig::SSP);
  create.mutable_spec()->mutable_consistency()->set_staleness(2);
  AppendCall(&b, kCreate, Bytes(create));
  DenseBatch batch;
  for (uint32_t t : {1u, 2u}) {
    DenseChunk* c = batch.add_chunks();
    c->set_table_id(t);
    c->set_total_length(300);
    c->set_data(Floats(std::vector<float>(300, 1.0f)));
  }
  AppendCall(&b, kPushBatch, Bytes(batch));
  for (DenseChunk& c : *batch.mutable_chunks()) c.set_step(1);
  AppendCall(&b, kPushPullBatch, Bytes(batch));
  PullDenseBatchRequest pulls;
  for (uint32_t t : {1u, 2u}) {
    pulls.add_pulls()->set_table_id(t);
    pulls.mutable_pulls()->rbegin()->set_step(2);
  }
  AppendCall(&b, kPullBatch, Bytes(pulls));
  DescribeTableRequest describe;
  describe.set_table_id(2);
  AppendCall(&b, kDescribe, Bytes(describe));
  UnregisterWorkerRequest leave;
  leave.set_worker_id(0);
  AppendCall(&b, kUnregister, Bytes(leave));
  Write(out / "ps_service" / "batches", b);

  // Streams: a push in two chunks, one cut off after its first, an import of Adam's state.
  std::string t;
  AppendCall(&t, kRegister, Bytes(reg));
  *create.mutable_spec() = Dense(1, ConsistencyConfig::BSP);
  AppendCall(&t, kCreate, Bytes(create));
  auto half = [](uint64_t offset, int64_t step) {  // of a 300-value push
    DenseChunk c;
    c.set_step(step);
    c.set_table_id(1);
    c.set_offset(offset);
    c.set_total_length(300);
    c.set_data(Floats(std::vector<float>(150, 0.25f)));
    return Bytes(c);
  };
  AppendCall(&t, kPushStream, StreamOf(false, {half(0, 0), half(150, 0)}));
  AppendCall(&t, kPushStream, StreamOf(true, {half(0, 1)}));
  TableStateChunk state;
  state.set_table_id(1);
  state.set_step(1);
  state.set_updates(1);
  state.set_num_slots(2);
  for (int i = 0; i < 300; ++i) state.add_values(0.5f);
  for (int i = 0; i < 600; ++i) state.add_slots(0.01f);
  AppendCall(&t, kImport, StreamOf(false, {Bytes(state)}));
  pull.set_step(1);
  AppendCall(&t, kPullDense, Bytes(pull));
  Write(out / "ps_service" / "streams", t);

  // Server streams: a pull in 64-byte chunks read to the end and one cut off after its first,
  // an export of the table's state read to the end and one cut off.
  std::string r;
  AppendCall(&r, kRegister, Bytes(reg));
  *create.mutable_spec() = Dense(1, ConsistencyConfig::BSP);
  AppendCall(&r, kCreate, Bytes(create));
  AppendCall(&r, kPushStream, StreamOf(false, {half(0, 0), half(150, 0)}));
  PullDenseRequest chunked;
  chunked.set_table_id(1);
  chunked.set_step(1);
  chunked.set_chunk_bytes(64);
  const auto flagged = [](bool cancel, const std::string& request) {
    return std::string(1, static_cast<char>(cancel)) + request;
  };
  AppendCall(&r, kPullStream, flagged(false, Bytes(chunked)));
  AppendCall(&r, kPullStream, flagged(true, Bytes(chunked)));
  ExportDenseRequest export_state;
  export_state.set_table_id(1);
  export_state.set_step(1);
  AppendCall(&r, kExport, flagged(false, Bytes(export_state)));
  AppendCall(&r, kExport, flagged(true, Bytes(export_state)));
  Write(out / "ps_service" / "server_streams", r);

  // Replicate, to the shard as a chain's tail (epoch 3): a worker, a dense and a sparse
  // table, a push of each kind in sequence order (a streamed one in two chunks), then an
  // update out of turn, one from an older epoch, and a stream cut off.
  std::string p;
  uint64_t seq = 0;
  const auto update = [&seq](const std::function<void(ReplicatedUpdate*)>& fill) {
    ReplicatedUpdate u;
    u.set_seq(++seq);
    u.set_epoch(3);
    fill(&u);
    return Bytes(u);
  };
  const auto replicate = [&p](bool cancel, const std::vector<std::string>& messages) {
    AppendCall(&p, kReplicate, StreamOf(cancel, messages));
  };
  replicate(false, {update([&](ReplicatedUpdate* u) { *u->mutable_register_worker() = reg; })});
  *create.mutable_spec() = Dense(1, ConsistencyConfig::BSP);
  replicate(false, {update([&](ReplicatedUpdate* u) { *u->mutable_create_table() = create; })});
  *create.mutable_spec() = Sparse(2);
  replicate(false, {update([&](ReplicatedUpdate* u) { *u->mutable_create_table() = create; })});
  DenseChunk whole;
  whole.set_table_id(1);
  whole.set_total_length(300);
  whole.set_data(Floats(std::vector<float>(300, 0.5f)));
  replicate(false, {update([&](ReplicatedUpdate* u) { *u->mutable_push_dense() = whole; })});
  ReplicatedUpdate chunk;
  chunk.mutable_chunk()->set_data(Floats(std::vector<float>(150, 0.25f)));
  whole.set_step(1);
  whole.clear_data();  // a stream's first message: its data comes in the chunks
  replicate(false, {update([&](ReplicatedUpdate* u) {
                      *u->mutable_push_dense() = whole;
                      u->set_stream(true);
                    }),
                    Bytes(chunk), Bytes(chunk)});
  DenseBatch two;
  DenseChunk* c = two.add_chunks();
  c->set_table_id(1);
  c->set_step(2);
  c->set_total_length(300);
  c->set_data(Floats(std::vector<float>(300, 1.0f)));
  replicate(false, {update([&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = two; })});
  replicate(false, {update([&](ReplicatedUpdate* u) { *u->mutable_push_sparse() = sparse; })});
  seq += 5;  // out of turn
  replicate(false, {update([&](ReplicatedUpdate* u) { *u->mutable_push_sparse() = sparse; })});
  seq = 7;  // the last applied
  ReplicatedUpdate stale;
  stale.set_seq(8);
  stale.set_epoch(2);
  *stale.mutable_register_worker() = reg;
  replicate(false, {Bytes(stale)});
  replicate(true, {update([&](ReplicatedUpdate* u) {
                     *u->mutable_push_dense() = whole;
                     u->set_stream(true);
                   }),
                   Bytes(chunk)});
  AppendCall(&p, kStats, Bytes(StatsRequest()));
  Write(out / "ps_service" / "replicate", p);
}

// Method numbers of coordinator_fuzzer.cc's table.
enum CoordMethod : uint8_t {
  kCRegister,
  kHeartbeat,
  kProgress,
  kGetView,
  kKvPut,
  kKvGet,
  kSwitch,
  kPoll,
  kReportSwitch,
  kCheckpoint,
  kTick,
  kJoinChain
};

// 2 shards x 2 replicas register: the chains form.
void RegisterReplicas(std::string* s) {
  using namespace pscluster::coord;
  for (int i = 0; i < 4; ++i) {
    RegisterRequest r;
    r.set_role(SHARD);
    r.set_id(i / 2);
    r.set_replica(i % 2);
    r.set_address("shard" + std::to_string(i) + ":5000");
    AppendCall(s, kCRegister, Bytes(r));
  }
}

void CoordinatorSeeds(const fs::path& out) {
  using namespace pscluster::coord;
  std::string s;
  RegisterReplicas(&s);
  for (int i = 0; i < 2; ++i) {
    RegisterRequest r;
    r.set_role(WORKER);
    r.set_id(i);
    r.set_address("worker" + std::to_string(i));
    AppendCall(&s, kCRegister, Bytes(r));
  }
  HeartbeatRequest hb;
  hb.set_role(WORKER);
  hb.set_id(0);
  hb.set_incarnation(1);
  AppendCall(&s, kHeartbeat, Bytes(hb));
  GetViewRequest view;
  view.set_wait_until_complete(true);
  AppendCall(&s, kGetView, Bytes(view));
  KvPutRequest put;
  put.set_key("gloo/0");
  put.set_value("address");
  AppendCall(&s, kKvPut, Bytes(put));
  KvGetRequest get;
  get.set_key("gloo/0");
  AppendCall(&s, kKvGet, Bytes(get));
  ReportProgressRequest progress;
  progress.set_rank(0);
  progress.set_incarnation(1);
  progress.set_view_version(5);
  progress.set_step(10);
  progress.set_loss(0.5);
  AppendCall(&s, kProgress, Bytes(progress));
  SwitchModeRequest sw;
  sw.set_mode(ALLREDUCE);
  sw.set_at_step(40);
  AppendCall(&s, kSwitch, Bytes(sw));
  PollSwitchRequest poll;
  poll.set_rank(0);
  poll.set_incarnation(1);
  poll.set_step(40);
  AppendCall(&s, kPoll, Bytes(poll));
  ReportSwitchRequest done;
  done.set_rank(0);
  done.set_incarnation(1);
  done.set_switch_id(1);
  done.set_at_step(40);
  done.set_from_mode(PS);
  done.set_to_mode(ALLREDUCE);
  AppendCall(&s, kReportSwitch, Bytes(done));
  AppendCall(&s, kTick, std::string(1, '\x20'));  // 8 s: everyone is declared dead
  AppendCall(&s, kHeartbeat, Bytes(hb));
  AppendCall(&s, kCheckpoint, Bytes(CheckpointRequest()));
  Write(out / "coordinator" / "join_train_switch", s);

  // A replica fails, registers again outside its chain, and joins it by state transfer.
  std::string c;
  RegisterReplicas(&c);
  HeartbeatRequest beat;
  beat.set_role(SHARD);
  beat.set_id(0);
  beat.set_replica(0);
  beat.set_incarnation(1);
  AppendCall(&c, kTick, std::string(1, '\x10'));  // 4 s: no one is dead yet
  AppendCall(&c, kHeartbeat, Bytes(beat));
  AppendCall(&c, kTick, std::string(1, '\x10'));  // replica 1 of shard 0 is, and leaves
  RegisterRequest again;
  again.set_role(SHARD);
  again.set_id(0);
  again.set_replica(1);
  again.set_address("shard1b:5000");
  AppendCall(&c, kCRegister, Bytes(again));
  JoinChainRequest join;
  join.set_shard(0);
  join.set_replica(1);
  join.set_epoch(3);
  AppendCall(&c, kJoinChain, Bytes(join));
  AppendCall(&c, kGetView, Bytes(GetViewRequest()));
  Write(out / "coordinator" / "replica_fails_and_joins", c);
}

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
