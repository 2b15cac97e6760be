// libFuzzer target: sequences of calls to a ParameterServerService over a fresh shard (with
// snapshots in memory), each request arbitrary bytes parsed as the method's request, as
// gRPC would hand it to the handler. Every unary handler is reachable; the streaming ones
// (PullDenseStream, PushDenseStream, ExportDense, ImportDense) need a live call and are
// left to the tests. Beyond "no crash, no hang, no leak": a call that fails must leave the
// shard exactly as it was (Shard::Fingerprint; checked for the calls that change state),
// except Snapshot, whose failure releases BSP steps the capture held back.
#include <cstdio>
#include <cstdlib>
#include <functional>
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

// One method: parses the request and calls the handler; false when the bytes do not parse
// (gRPC would refuse them before any handler ran).
using Method = std::function<bool(ParameterServerService*, const std::string&, grpc::Status*)>;

template <typename Req, typename Resp>
Method Unary(grpc::Status (ParameterServerService::*handler)(grpc::ServerContext*, const Req*,
                                                             Resp*)) {
  return [handler](ParameterServerService* s, const std::string& bytes, grpc::Status* status) {
    Req req;
    if (!req.ParseFromString(bytes)) return false;
    Resp resp;
    grpc::ServerContext ctx;
    *status = (s->*handler)(&ctx, &req, &resp);
    return true;
  };
}

struct Entry {
  const char* name;
  Method call;
  bool mutates = true;               // false: a read (never checked, for speed)
  bool unchanged_on_failure = true;  // checked when it fails
};

const std::vector<Entry>& Methods() {
  using S = ParameterServerService;
  static const auto* methods = new std::vector<Entry>{
      {"RegisterWorker", Unary(&S::RegisterWorker)},
      {"UnregisterWorker", Unary(&S::UnregisterWorker)},
      {"CreateTable", Unary(&S::CreateTable)},
      {"DescribeTable", Unary(&S::DescribeTable), false},
      {"PullDense", Unary(&S::PullDense), false},
      {"PushDense", Unary(&S::PushDense)},
      {"PullDenseBatch", Unary(&S::PullDenseBatch), false},
      {"PushDenseBatch", Unary(&S::PushDenseBatch)},
      {"PushPullDenseBatch", Unary(&S::PushPullDenseBatch)},
      {"PullSparse", Unary(&S::PullSparse), false},
      {"PushSparse", Unary(&S::PushSparse)},
      {"Stats", Unary(&S::Stats), false},
      {"Snapshot", Unary(&S::Snapshot), true, /*unchanged_on_failure=*/false},
      {"ListSnapshots", Unary(&S::ListSnapshots), false},
      {"SnapshotStatus", Unary(&S::SnapshotStatus), false},
      {"Restore", Unary(&S::Restore)},
  };
  return *methods;
}

}  // namespace
}  // namespace pscluster::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster::fuzz;
  Server server;
  CallReader calls(data, size);
  uint8_t m;
  std::string request;
  for (int n = 0; n < 64 && calls.Next(&m, &request); ++n) {
    const Entry& e = Methods()[m % Methods().size()];
    const bool check = e.mutates && e.unchanged_on_failure;
    const uint32_t before = check ? server.shard.Fingerprint() : 0;
    grpc::Status status;
    if (!e.call(server.service.get(), request, &status)) continue;
    if (check && !status.ok() && server.shard.Fingerprint() != before) {
      std::fprintf(stderr, "%s failed (%d: %s) but changed the shard\n", e.name,
                   static_cast<int>(status.error_code()), status.error_message().c_str());
      std::abort();
    }
  }
  return 0;
}
