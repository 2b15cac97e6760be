// libFuzzer target: sequences of calls to CoordinatorCalls (the work CoordinatorService
// serves) over a fresh cluster state (2 shards, 2 workers expected; a fake clock that only a "tick"
// call advances, so liveness is exercised and every input replays the same), each request arbitrary
// bytes parsed as the method's request. Beyond "no crash, no hang, no leak": a call that fails must
// not change the cluster (no state persisted, the same view).
#include <string>
#include <utility>
#include <vector>

#include "common/grpc_status.h"
#include "fuzz/fuzz_input.h"
#include "grpcpp/grpcpp.h"
#include "server/coordinator/cluster_state.h"
#include "server/coordinator/kv_store.h"
#include "server/coordinator/service.h"

namespace pscluster::fuzz {
namespace {

using namespace pscluster::coord;  // NOLINT: the request and response messages

struct Fixture {
  Fixture()
      : cluster(
            [this] {
              ClusterStateOptions o;
              o.num_shards = 2;
              o.num_workers = 2;
              o.replicas = 2;  // chains: forming, failing over, joining
              o.heartbeat_timeout = absl::Seconds(5);
              o.on_change = [this](const CoordinatorState&) { ++changes; };
              return o;
            }(),
            [this] { return now; }),
        service(&cluster, &kv, /*max_wait=*/absl::Milliseconds(1)) {}
  absl::Time now = absl::FromUnixSeconds(1700000000);
  int64_t changes = 0;
  ClusterState cluster;
  KvStore kv;
  CoordinatorCalls service;
};

template <typename Req, typename Resp>
Method<Fixture> Unary(const char* name,
                      absl::Status (CoordinatorCalls::*handler)(const Req&, Resp*)) {
  return {name, [handler](Fixture* c, const std::string& bytes, grpc::Status* status) {
            Req req;
            if (!req.ParseFromString(bytes)) return false;
            Resp resp;
            *status = ToGrpcStatus((c->service.*handler)(req, &resp));
            return true;
          }};
}

// A read that may wait, made as a blocking call: the fixture's max_wait (1 ms) bounds it.
template <typename Req, typename Resp>
Method<Fixture> Waiting(const char* name,
                        absl::Status (CoordinatorCalls::*handler)(const Req&, const Wait&, Resp*)) {
  return {name, [handler](Fixture* c, const std::string& bytes, grpc::Status* status) {
            Req req;
            if (!req.ParseFromString(bytes)) return false;
            Resp resp;
            Wait how;
            how.deadline = c->service.Deadline(absl::InfiniteFuture());
            *status = ToGrpcStatus((c->service.*handler)(req, how, &resp));
            return true;
          }};
}

// Not an RPC: time passes (the first byte, in quarter seconds) and liveness is checked, as
// ps_coordinator's background thread does.
bool Tick(Fixture* c, const std::string& bytes, grpc::Status* status) {
  c->now += absl::Milliseconds(250) * (bytes.empty() ? 1 : static_cast<uint8_t>(bytes[0]));
  c->cluster.CheckLiveness();
  *status = grpc::Status::OK;
  return true;
}

const std::vector<Method<Fixture>>& Methods() {
  using S = CoordinatorCalls;
  static const auto* methods = new std::vector<Method<Fixture>>{
      Unary("Register", &S::Register),
      Unary("Heartbeat", &S::Heartbeat),
      Unary("ReportProgress", &S::ReportProgress),
      Waiting("GetView", &S::GetView),
      Unary("KvPut", &S::KvPut),
      Waiting("KvGet", &S::KvGet),
      Unary("SwitchMode", &S::SwitchMode),
      Unary("PollSwitch", &S::PollSwitch),
      Unary("ReportSwitch", &S::ReportSwitch),
      Unary("Checkpoint", &S::Checkpoint),
      {"tick", Tick},
      Unary("JoinChain", &S::JoinChain),
      Unary("RecordRun", &S::RecordRun),
      Unary("ReportStopped", &S::ReportStopped),
      Unary("DecideRollback", &S::DecideRollback),
      Unary("ShrinkChain", &S::ShrinkChain),
      Unary("ReportUnreachable", &S::ReportUnreachable),
  };
  return *methods;
}

std::string ViewBytes(const ClusterState& cluster) {
  std::string out;
  cluster.View().SerializeToString(&out);
  return out;
}

}  // namespace
}  // namespace pscluster::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster::fuzz;
  Fixture c;
  // A failed call persists nothing and leaves the view as it was.
  RunCalls(data, size, Methods(), &c,
           [](Fixture* f) { return std::make_pair(f->changes, ViewBytes(f->cluster)); });
  return 0;
}
