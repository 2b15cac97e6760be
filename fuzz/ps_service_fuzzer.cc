// libFuzzer target: sequences of calls to a ParameterServerService over a fresh shard (with
// snapshots in memory), each request arbitrary bytes parsed as the method's request, as
// gRPC would hand it to the handler. Every unary handler is reachable; the streaming ones
// (PullDenseStream, PushDenseStream, ExportDense, ImportDense) need a live call and are
// left to the tests. Beyond "no crash, no hang, no leak": a call that fails must leave the
// shard exactly as it was (Shard::Fingerprint; checked for the calls that change state),
// except Snapshot, whose failure releases BSP steps the capture held back.
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/memory_snapshot_store.h"
#include "server/ps/service.h"
#include "server/ps/snapshotter.h"

namespace pscluster::fuzz {
namespace {

using namespace pscluster::ps;  // NOLINT: the request and response messages

struct Server {
  // Small tables: the fingerprints before and after each call copy them.
  Server() : shard(ShardOptions{0, 1, /*max_table_bytes=*/64 << 10, /*max_sparse_dim=*/64}) {
    SnapshotterOptions so;
    so.root = "/fuzz";
    so.storage = &storage;
    snapshotter = *Snapshotter::Create(&shard, so);
    ServiceOptions vo;
    vo.max_chunk_bytes = 64 << 10;
    vo.max_wait = absl::Milliseconds(1);  // BSP/SSP pulls that would wait fail at once
    vo.max_inflight_request_bytes = 16 << 20;
    vo.release_idle_memory_after = absl::InfiniteDuration();
    service = std::make_unique<ParameterServerService>(&shard, snapshotter.get(), vo);
  }
  MemorySnapshotStorage storage;
  Shard shard;
  std::unique_ptr<Snapshotter> snapshotter;
  std::unique_ptr<ParameterServerService> service;
};

template <typename Req, typename Resp>
Method<Server> Unary(const char* name,
                     grpc::Status (ParameterServerService::*handler)(grpc::ServerContext*,
                                                                     const Req*, Resp*),
                     bool checked = true) {
  return {name,
          [handler](Server* s, const std::string& bytes, grpc::Status* status) {
            Req req;
            if (!req.ParseFromString(bytes)) return false;
            Resp resp;
            grpc::ServerContext ctx;
            *status = (s->service.get()->*handler)(&ctx, &req, &resp);
            return true;
          },
          checked};
}

// Reads are not checked (they change nothing even when they succeed; skipping them keeps
// the fingerprints, which copy every table, off their path). Snapshot is not: its failure
// releases BSP steps the capture held back.
const std::vector<Method<Server>>& Methods() {
  using S = ParameterServerService;
  static const auto* methods = new std::vector<Method<Server>>{
      Unary("RegisterWorker", &S::RegisterWorker),
      Unary("UnregisterWorker", &S::UnregisterWorker),
      Unary("CreateTable", &S::CreateTable),
      Unary("DescribeTable", &S::DescribeTable, false),
      Unary("PullDense", &S::PullDense, false),
      Unary("PushDense", &S::PushDense),
      Unary("PullDenseBatch", &S::PullDenseBatch, false),
      Unary("PushDenseBatch", &S::PushDenseBatch),
      Unary("PushPullDenseBatch", &S::PushPullDenseBatch),
      Unary("PullSparse", &S::PullSparse, false),
      Unary("PushSparse", &S::PushSparse),
      Unary("Stats", &S::Stats, false),
      Unary("Snapshot", &S::Snapshot, false),
      Unary("ListSnapshots", &S::ListSnapshots, false),
      Unary("SnapshotStatus", &S::SnapshotStatus, false),
      Unary("Restore", &S::Restore),
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
