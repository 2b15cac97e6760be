// libFuzzer target: sequences of calls to a shard's three services over a fresh shard (with
// snapshots in memory), every call a real gRPC call over loopback TCP to the services'
// own handlers. A unary request is arbitrary bytes, sent as they are (the shard parses
// them, as a client built from another .proto would have it). Every unary method is
// reachable, and the streaming ones: the three that read a client's stream
// (PushDenseStream, ImportDense, and Replicate, a chain's updates, to this shard as a tail),
// whose messages are arbitrary too and which the client may end or cancel, and the two that
// write one (PullDenseStream, ExportDense), which the client may read to the end or cancel
// after a message. Beyond "no crash, no hang, no leak": a call that fails must leave the
// shard exactly as it was (Shard::Fingerprint; checked for the calls that change state),
// except Snapshot, whose failure releases BSP steps the capture held back.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/ps/shard_stub.h"
#include "fuzz/fuzz_input.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/service/shard_services.h"
#include "server/ps/snapshot/memory_snapshot_store.h"
#include "server/ps/snapshot/snapshotter.h"

namespace pscluster::fuzz {
namespace {

using namespace pscluster::ps;  // NOLINT: the request and response messages

// Small tables: the fingerprints before and after each call copy them. (Named, not
// positional: a field added to ShardOptions once turned the sparse limit of 64 into a shard
// memory limit of 64 bytes, and for two days no table could be created here.)
ShardOptions SmallTables() {
  ShardOptions o;
  o.max_table_bytes = 64 << 10;
  o.max_memory_bytes = 1 << 20;
  o.max_sparse_dim = 64;
  return o;
}

struct Server {
  Server() : shard(SmallTables()) {
    SnapshotterOptions so;
    so.root = "/fuzz";
    so.storage = &storage;
    snapshotter = *Snapshotter::Create(&shard, so);
    ServiceOptions vo;
    vo.max_chunk_bytes = 64 << 10;
    vo.max_wait = absl::Milliseconds(1);  // BSP/SSP pulls that would wait fail at once
    vo.max_inflight_request_bytes = 16 << 20;
    vo.release_idle_memory_after = absl::InfiniteDuration();
    services = std::make_unique<ShardServices>(&shard, snapshotter.get(), vo);
  }
  // The replica after a head, for Replicate: made at an input's first Replicate call (it
  // says its place on stdout), attached to the service during those calls only (with it,
  // this shard is not the head and serves no client). The tail of chain epoch 3: replica 0
  // (the head: the fuzzer), then 1 (this shard).
  Replicator* Chain() {
    if (chain == nullptr) {
      ReplicatorOptions o;
      o.replica = 1;
      o.forward_timeout = absl::Milliseconds(1);  // an update out of turn waits no longer
      chain = services->NewReplicator(o);
      chain->Update(ChainConfig{3, {0, 1}, {"127.0.0.1:1", "127.0.0.1:2"}, true});
    }
    return chain.get();
  }
  MemorySnapshotStorage storage;
  Shard shard;
  std::unique_ptr<Snapshotter> snapshotter;
  std::unique_ptr<ShardServices> services;
  std::unique_ptr<Replicator> chain;  // destroyed first: it applies to the services
};

// The handlers the forwarder ran. A handler may still run when its client's call has ended
// (cancelled, or refused early), and a call cancelled at once may reach no handler at all: a
// call is cancelled only once its handler has started, and the state is checked (and the shard
// destroyed) only once every handler has returned.
class Handlers {
 public:
  class Running {
   public:
    explicit Running(Handlers* h) : h_(h) {
      absl::MutexLock lock(&h_->mu_);
      ++h_->started_, ++h_->running_;
    }
    ~Running() {
      absl::MutexLock lock(&h_->mu_);
      --h_->running_;
    }

   private:
    Handlers* h_;
  };
  uint64_t started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  // Aborts, naming `what`, when not so within 30 s (a hang is a bug).
  void AwaitStartedAfter(uint64_t before, const char* what) {
    absl::MutexLock lock(&mu_);
    auto after = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return started_ > before; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&after), absl::Seconds(30))) {
      std::fprintf(stderr, "%s: no handler started within 30 s\n", what);
      std::abort();
    }
  }
  void AwaitIdle(const char* what) {
    absl::MutexLock lock(&mu_);
    auto idle = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return running_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(30))) {
      std::fprintf(stderr, "%s: a handler still runs 30 s after its call ended\n", what);
      std::abort();
    }
  }

 private:
  absl::Mutex mu_;
  uint64_t started_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

// The streaming methods of each service, handed to the current input's shard.
struct Target {
  std::atomic<ShardServices*> services{nullptr};
  Handlers handlers;
};
// A raw callback method handed to the current input's shard (the target holds it until
// every reactor of the call is done: Call waits for its core's in-flight count).
#define PSCLUSTER_FORWARD_UNARY(Service, Method)                                                  \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req, \
                                   grpc::ByteBuffer* resp) override {                             \
    return t_->services.load()->Service()->Method(ctx, req, resp);                                \
  }

class DataForwarder final : public ShardDataBase {
 public:
  explicit DataForwarder(Target* t) : t_(t) {}
  PSCLUSTER_FORWARD_UNARY(data, RegisterWorker)
  PSCLUSTER_FORWARD_UNARY(data, UnregisterWorker)
  PSCLUSTER_FORWARD_UNARY(data, PullDense)
  PSCLUSTER_FORWARD_UNARY(data, PushDense)
  PSCLUSTER_FORWARD_UNARY(data, PullDenseBatch)
  PSCLUSTER_FORWARD_UNARY(data, PushDenseBatch)
  PSCLUSTER_FORWARD_UNARY(data, PushPullDenseBatch)
  PSCLUSTER_FORWARD_UNARY(data, PullSparse)
  PSCLUSTER_FORWARD_UNARY(data, PushSparse)
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PullDenseStream(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) override {
    Handlers::Running running(&t_->handlers);  // (then the reactor is in flight)
    return t_->services.load()->data()->PullDenseStream(ctx, req);
  }
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushDenseStream(grpc::CallbackServerContext* ctx,
                                                             grpc::ByteBuffer* resp) override {
    Handlers::Running running(&t_->handlers);
    return t_->services.load()->data()->PushDenseStream(ctx, resp);
  }

 private:
  Target* const t_;
};
class AdminForwarder final : public ShardAdminBase {
 public:
  explicit AdminForwarder(Target* t) : t_(t) {}
  PSCLUSTER_FORWARD_UNARY(admin, CreateTable)
  PSCLUSTER_FORWARD_UNARY(admin, DescribeTable)
  PSCLUSTER_FORWARD_UNARY(admin, Stats)
  PSCLUSTER_FORWARD_UNARY(admin, Snapshot)
  PSCLUSTER_FORWARD_UNARY(admin, ListSnapshots)
  PSCLUSTER_FORWARD_UNARY(admin, SnapshotStatus)
  PSCLUSTER_FORWARD_UNARY(admin, Restore)
  grpc::ServerReadReactor<grpc::ByteBuffer>* ImportDense(grpc::CallbackServerContext* ctx,
                                                         grpc::ByteBuffer* resp) override {
    Handlers::Running running(&t_->handlers);
    return t_->services.load()->admin()->ImportDense(ctx, resp);
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportDense(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* req) override {
    Handlers::Running running(&t_->handlers);
    return t_->services.load()->admin()->ExportDense(ctx, req);
  }

 private:
  Target* const t_;
};
class ReplicationForwarder final : public ShardReplicationBase {
 public:
  explicit ReplicationForwarder(Target* t) : t_(t) {}
  grpc::ServerReadReactor<grpc::ByteBuffer>* Replicate(grpc::CallbackServerContext* ctx,
                                                       grpc::ByteBuffer* resp) override {
    Handlers::Running running(&t_->handlers);
    return t_->services.load()->replication()->Replicate(ctx, resp);
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* TransferState(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* req) override {
    Handlers::Running running(&t_->handlers);
    return t_->services.load()->replication()->TransferState(ctx, req);
  }
  PSCLUSTER_FORWARD_UNARY(replication, JoinedChain)

 private:
  Target* const t_;
};
#undef PSCLUSTER_FORWARD_UNARY

// The streaming handlers run behind a real gRPC call: one server on loopback TCP for the
// whole run, whose service hands each call to the current input's shard. (Not gRPC's
// in-process channel: gRPC 1.51's in-process transport never frees a stream call's arenas,
// client's and server's, ~3.6 KB an input here; over TCP the same calls free everything.)
struct Streams {
  Streams() {
    grpc::ServerBuilder b;
    b.RegisterService(&data);
    b.RegisterService(&admin);
    b.RegisterService(&replication);
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    // Handler threads kept, never ended or started mid-run: gRPC frees an ended one's state
    // on a later call, and a thread it starts is referenced from nowhere LeakSanitizer looks
    // until it runs; either is taken for a leak of the input during which it happened. So
    // no poller gives up after the default 10 s without a call, and the few that the run's
    // one call at a time needs are there from the start.
    b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
    b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 4);
    b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 64);
    b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 24 * 3600 * 1000);
    server = b.BuildAndStart();
    if (server == nullptr || port == 0) {
      std::fprintf(stderr, "ps_service_fuzzer: cannot listen on 127.0.0.1\n");
      std::abort();
    }
    auto channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub = ShardStub::New(channel);
    generic = std::make_unique<grpc::GenericStub>(channel);
  }
  Target target;
  DataForwarder data{&target};
  AdminForwarder admin{&target};
  ReplicationForwarder replication{&target};
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ShardStub> stub;
  std::unique_ptr<grpc::GenericStub> generic;  // the unary calls, their bytes as they came
};

Streams& TheStreams() {
  static Streams* const streams = new Streams;  // never destroyed: its threads outlive main
  return *streams;
}

// One streaming call to `s`'s shard, named `name`: client(stub, ctx, started) opens it and
// plays the client's side, calling started() once its messages are sent and before it ends
// or cancels the call (a call is cancelled only once its handler has started), and returns
// the call's status. Returns once every handler has returned.
// A call's reactors may still run when its client has the answer; the shard outlives them.
void AwaitReactorsDone(Server* s, const char* name) {
  if (!s->services->core()->in_flight.WaitIdle(absl::Now() + absl::Seconds(30))) {
    std::fprintf(stderr, "%s: a reactor still runs 30 s after its call ended\n", name);
    std::abort();
  }
}

template <typename Client>
grpc::Status Call(Server* s, const char* name, Client client) {
  Streams& streams = TheStreams();
  streams.target.services = s->services.get();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  Handlers& handlers = streams.target.handlers;
  const uint64_t before = handlers.started();
  grpc::Status status =
      client(*streams.stub, &ctx, [&] { handlers.AwaitStartedAfter(before, name); });
  handlers.AwaitIdle(name);
  AwaitReactorsDone(s, name);
  return status;
}

// A unary call to `s`'s shard, its request `bytes` as they came (the shard parses them).
Method<Server> Unary(const char* service, const char* name, bool checked = true) {
  const std::string path = absl::StrCat("/pscluster.ps.", service, "/", name);
  return {name,
          [path, name](Server* s, const std::string& bytes, grpc::Status* status) {
            Streams& streams = TheStreams();
            streams.target.services = s->services.get();
            grpc::ClientContext ctx;
            ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
            grpc::Slice slice(bytes);
            grpc::ByteBuffer request(&slice, 1), response;
            absl::Notification done;
            streams.generic->UnaryCall(&ctx, path, grpc::StubOptions(), &request, &response,
                                       [&](grpc::Status st) {
                                         *status = std::move(st);
                                         done.Notify();
                                       });
            if (!done.WaitForNotificationWithTimeout(absl::Seconds(30))) {
              std::fprintf(stderr, "%s: no answer within 30 s\n", name);
              std::abort();
            }
            AwaitReactorsDone(s, name);
            return true;
          },
          checked};
}

// A client stream of the messages in `bytes` (each a u16 little-endian length and that many
// bytes; the ones that do not parse are left out, as gRPC's client could not send them).
// The first byte: odd, the client cancels after the messages instead of ending the stream
// (a stream cut off, which must change nothing).
template <typename S, typename Msg, typename Resp>
Method<Server> Stream(const char* name,
                      std::unique_ptr<grpc::ClientWriter<Msg>> (S::*open)(grpc::ClientContext*,
                                                                          Resp*)) {
  return {name, [name, open](Server* s, const std::string& bytes, grpc::Status* status) {
            *status = Call(s, name, [&](ShardStub& stub, grpc::ClientContext* ctx, auto started) {
              Resp resp;
              std::unique_ptr<grpc::ClientWriter<Msg>> writer =
                  (stub.template Get<S>()->*open)(ctx, &resp);
              const bool cancel = !bytes.empty() && (bytes[0] & 1);
              CallReader messages(reinterpret_cast<const uint8_t*>(bytes.data()) + !bytes.empty(),
                                  bytes.empty() ? 0 : bytes.size() - 1);
              uint8_t unused;
              std::string one;
              for (int n = 0; n < 16 && messages.Next(&unused, &one); ++n) {
                Msg m;
                if (m.ParseFromString(one) && !writer->Write(m)) break;
              }
              started();
              if (cancel) {
                ctx->TryCancel();
              } else {
                writer->WritesDone();
              }
              return writer->Finish();
            });
            return true;
          }};
}

// A server stream (the pull and export streams): the request is `bytes` after the first
// byte, which says, when odd, that the client cancels after its first message instead of
// reading to the end (at most 4,096 messages). Nothing is applied; the handler must not
// crash, hang or leak, whatever the request and wherever the call ends.
template <typename S, typename Req, typename Msg>
Method<Server> ServerStream(const char* name, std::unique_ptr<grpc::ClientReader<Msg>> (S::*open)(
                                                  grpc::ClientContext*, const Req&)) {
  return {name,
          [name, open](Server* s, const std::string& bytes, grpc::Status* status) {
            Req req;
            if (bytes.empty() || !req.ParseFromArray(bytes.data() + 1, bytes.size() - 1)) {
              return false;
            }
            *status = Call(s, name, [&](ShardStub& stub, grpc::ClientContext* ctx, auto started) {
              std::unique_ptr<grpc::ClientReader<Msg>> reader =
                  (stub.template Get<S>()->*open)(ctx, req);
              const bool cancel = bytes[0] & 1;
              Msg m;
              bool ended = false;
              for (int n = 0; n < (cancel ? 1 : 4096) && !ended; ++n) ended = !reader->Read(&m);
              started();
              if (!ended) ctx->TryCancel();
              return reader->Finish();
            });
            return true;
          },
          false};
}

// Replicate: a stream of updates from the head, as Stream plays it, to this shard as the
// tail of a chain (Server::Chain). An update the tail refuses must change nothing.
Method<Server> Replicate() {
  Method<Server> m = Stream("Replicate", &ShardReplication::Stub::Replicate);
  m.call = [stream = m.call](Server* s, const std::string& bytes, grpc::Status* status) {
    s->services->core()->gate.SetReplicator(s->Chain());
    const bool called = stream(s, bytes, status);
    s->services->core()->gate.SetReplicator(nullptr);  // every handler has returned (Call)
    return called;
  };
  return m;
}

// Reads are not checked (they change nothing even when they succeed; skipping them keeps
// the fingerprints, which copy every table, off their path). Snapshot is not: its failure
// releases BSP steps the capture held back.
const std::vector<Method<Server>>& Methods() {
  static const auto* methods = new std::vector<Method<Server>>{
      Unary("ShardData", "RegisterWorker"),
      Unary("ShardData", "UnregisterWorker"),
      Unary("ShardAdmin", "CreateTable"),
      Unary("ShardAdmin", "DescribeTable", false),
      Unary("ShardData", "PullDense", false),
      Unary("ShardData", "PushDense"),
      Unary("ShardData", "PullDenseBatch", false),
      Unary("ShardData", "PushDenseBatch"),
      Unary("ShardData", "PushPullDenseBatch"),
      Unary("ShardData", "PullSparse", false),
      Unary("ShardData", "PushSparse"),
      Unary("ShardAdmin", "Stats", false),
      Unary("ShardAdmin", "Snapshot", false),
      Unary("ShardAdmin", "ListSnapshots", false),
      Unary("ShardAdmin", "SnapshotStatus", false),
      Unary("ShardAdmin", "Restore"),
      Stream("PushDenseStream", &ShardData::Stub::PushDenseStream),
      Stream("ImportDense", &ShardAdmin::Stub::ImportDense),
      ServerStream("PullDenseStream", &ShardData::Stub::PullDenseStream),
      ServerStream("ExportDense", &ShardAdmin::Stub::ExportDense),
      Replicate(),
  };
  return *methods;
}

}  // namespace
}  // namespace pscluster::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster::fuzz;
  Server server;
  RunCalls(data, size, Methods(), &server, [](Server* s) { return s->shard.Fingerprint(); });
  return 0;
}
