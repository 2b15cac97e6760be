// The ps_service target's seeds: call sequences a real client (and, for Replicate, a
// chain's head) makes.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fuzz/seeds.h"

namespace pscluster::fuzz::seeds {
namespace {

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

// The ps_service seeds' common requests.
pscluster::ps::RegisterWorkerRequest Register(int32_t worker) {
  pscluster::ps::RegisterWorkerRequest reg;
  reg.set_worker_id(worker);
  return reg;
}
pscluster::ps::CreateTableRequest Create(const pscluster::ps::TableSpec& spec) {
  pscluster::ps::CreateTableRequest create;
  *create.mutable_spec() = spec;
  return create;
}
// Sparse table 2's rows 3, 17, 3 again and 2^40.
pscluster::ps::SparseRequest SparseKeys() {
  pscluster::ps::SparseRequest sparse;
  sparse.set_table_id(2);
  for (uint64_t k : {uint64_t{3}, uint64_t{17}, uint64_t{3}, uint64_t{1} << 40}) sparse.add_keys(k);
  return sparse;
}
// Half of a 300-value push to dense table 1, as a stream's chunk.
std::string Half(uint64_t offset, int64_t step) {
  pscluster::ps::DenseChunk c;
  c.set_step(step);
  c.set_table_id(1);
  c.set_offset(offset);
  c.set_total_length(300);
  c.set_data(Floats(std::vector<float>(150, 0.25f)));
  return Bytes(c);
}

// The calls that open the stream seeds: worker 0 registered, dense BSP table 1 created,
// and step 0 pushed to it as a stream of two halves.
std::string OneStreamedPush() {
  using namespace pscluster::ps;
  std::string calls;
  AppendCall(&calls, kRegister, Bytes(Register(0)));
  AppendCall(&calls, kCreate, Bytes(Create(Dense(1, ConsistencyConfig::BSP))));
  AppendCall(&calls, kPushStream, StreamOf(false, {Half(0, 0), Half(150, 0)}));
  return calls;
}

// Two workers train a step of a dense and a sparse table, snapshot it and restore it.
void TrainSnapshotRestoreSeed(const fs::path& out) {
  using namespace pscluster::ps;
  std::string s;
  AppendCall(&s, kRegister, Bytes(Register(0)));
  AppendCall(&s, kRegister, Bytes(Register(1)));
  AppendCall(&s, kCreate, Bytes(Create(Dense(1, ConsistencyConfig::BSP))));
  AppendCall(&s, kCreate, Bytes(Create(Sparse(2))));
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
  SparseRequest sparse = SparseKeys();
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
}

// Batches: push and pull two tables in one call, the ASP and SSP ways.
void BatchesSeed(const fs::path& out) {
  using namespace pscluster::ps;
  std::string b;
  AppendCall(&b, kRegister, Bytes(Register(0)));
  AppendCall(&b, kCreate, Bytes(Create(Dense(1, ConsistencyConfig::ASP))));
  CreateTableRequest ssp = Create(Dense(2, ConsistencyConfig::SSP));
  ssp.mutable_spec()->mutable_consistency()->set_staleness(2);
  AppendCall(&b, kCreate, Bytes(ssp));
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
}

// Client streams: a push in two chunks, one cut off after its first, an import of Adam's
// state.
void StreamsSeed(const fs::path& out) {
  using namespace pscluster::ps;
  std::string t = OneStreamedPush();
  AppendCall(&t, kPushStream, StreamOf(true, {Half(0, 1)}));
  TableStateChunk state;
  state.set_table_id(1);
  state.set_step(1);
  state.set_updates(1);
  state.set_num_slots(2);
  for (int i = 0; i < 300; ++i) state.add_values(0.5f);
  for (int i = 0; i < 600; ++i) state.add_slots(0.01f);
  AppendCall(&t, kImport, StreamOf(false, {Bytes(state)}));
  PullDenseRequest pull;
  pull.set_table_id(1);
  pull.set_step(1);
  AppendCall(&t, kPullDense, Bytes(pull));
  Write(out / "ps_service" / "streams", t);
}

// Server streams: a pull in 64-byte chunks read to the end and one cut off after its first,
// an export of the table's state read to the end and one cut off.
void ServerStreamsSeed(const fs::path& out) {
  using namespace pscluster::ps;
  std::string r = OneStreamedPush();
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
}

// Replicate, to the shard as a chain's tail (epoch 3): a worker, a dense and a sparse
// table, a push of each kind in sequence order (a streamed one in two chunks), then an
// update out of turn, one from an older epoch, and a stream cut off.
class ReplicateSeed {
 public:
  void WriteTo(const fs::path& out) {
    using namespace pscluster::ps;
    Whole([](ReplicatedUpdate* u) { *u->mutable_register_worker() = Register(0); });
    Whole([](ReplicatedUpdate* u) {
      *u->mutable_create_table() = Create(Dense(1, ConsistencyConfig::BSP));
    });
    Whole([](ReplicatedUpdate* u) { *u->mutable_create_table() = Create(Sparse(2)); });
    DenseChunk whole;
    whole.set_table_id(1);
    whole.set_total_length(300);
    whole.set_data(Floats(std::vector<float>(300, 0.5f)));
    Whole([&](ReplicatedUpdate* u) { *u->mutable_push_dense() = whole; });
    whole.set_step(1);
    whole.clear_data();  // a stream's first message: its data comes in the chunks
    Streamed(false, whole, 2);
    DenseBatch two;
    DenseChunk* c = two.add_chunks();
    c->set_table_id(1);
    c->set_step(2);
    c->set_total_length(300);
    c->set_data(Floats(std::vector<float>(300, 1.0f)));
    Whole([&](ReplicatedUpdate* u) { *u->mutable_push_dense_batch() = two; });
    SparseRequest sparse = SparseKeys();
    sparse.set_grads(Floats(std::vector<float>(16, 1.0f)));
    Whole([&](ReplicatedUpdate* u) { *u->mutable_push_sparse() = sparse; });
    seq_ += 5;  // out of turn
    Whole([&](ReplicatedUpdate* u) { *u->mutable_push_sparse() = sparse; });
    seq_ = 7;  // the last applied
    ReplicatedUpdate stale;
    stale.set_seq(8);
    stale.set_epoch(2);
    *stale.mutable_register_worker() = Register(0);
    AppendCall(&p_, kReplicate, StreamOf(false, {Bytes(stale)}));
    Streamed(true, whole, 1);
    AppendCall(&p_, kStats, Bytes(StatsRequest()));
    Write(out / "ps_service" / "replicate", p_);
  }

 private:
  // The next update in sequence, whole in one message.
  void Whole(const std::function<void(pscluster::ps::ReplicatedUpdate*)>& fill) {
    AppendCall(&p_, kReplicate, StreamOf(false, {Next(fill)}));
  }
  // The next update, a push streamed as `first` then `chunks` chunks; `cancel`: cut off.
  void Streamed(bool cancel, const pscluster::ps::DenseChunk& first, int chunks) {
    pscluster::ps::ReplicatedUpdate chunk;
    chunk.mutable_chunk()->set_data(Floats(std::vector<float>(150, 0.25f)));
    std::vector<std::string> messages = {Next([&](pscluster::ps::ReplicatedUpdate* u) {
      *u->mutable_push_dense() = first;
      u->set_stream(true);
    })};
    for (int i = 0; i < chunks; ++i) messages.push_back(Bytes(chunk));
    AppendCall(&p_, kReplicate, StreamOf(cancel, messages));
  }
  std::string Next(const std::function<void(pscluster::ps::ReplicatedUpdate*)>& fill) {
    pscluster::ps::ReplicatedUpdate u;
    u.set_seq(++seq_);
    u.set_epoch(3);
    fill(&u);
    return Bytes(u);
  }

  std::string p_;
  uint64_t seq_ = 0;
};

}  // namespace

void PsSeeds(const fs::path& out) {
  TrainSnapshotRestoreSeed(out);
  BatchesSeed(out);
  StreamsSeed(out);
  ServerStreamsSeed(out);
  ReplicateSeed().WriteTo(out);
}

}  // namespace pscluster::fuzz::seeds
