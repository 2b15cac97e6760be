// The coordinator target's seeds: what its members say to it as a run goes.
#include <cstdint>
#include <string>

#include "fuzz/seeds.h"
#include "proto/coordinator.pb.h"

namespace pscluster::fuzz::seeds {
namespace {

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
  kJoinChain,
  kRecordRun,
  kReportStopped,
  kDecideRollback,
  kShrinkChain,
  kReportUnreachable
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

// Two shards of two replicas and two workers join, train, switch modes and checkpoint;
// everyone is declared dead once.
void JoinTrainSwitchSeed(const fs::path& out) {
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
}

// A replica fails, registers again outside its chain, and joins it by state transfer.
void ReplicaFailsAndJoinsSeed(const fs::path& out) {
  using namespace pscluster::coord;
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

// Rank 0 records the run and starts it; worker 1 dies and comes back, and both roll back
// in the new generation (the name the view gives it: common/cluster_view.h).
void WorkerFailsAndRollsBackSeed(const fs::path& out) {
  using namespace pscluster::coord;
  std::string s;
  RegisterReplicas(&s);
  RegisterRequest worker;
  worker.set_role(WORKER);
  for (int i = 0; i < 2; ++i) {
    worker.set_id(i);
    worker.set_address("worker" + std::to_string(i));
    AppendCall(&s, kCRegister, Bytes(worker));
  }
  RecordRunRequest run;
  run.set_rank(0);
  run.set_incarnation(1);
  run.add_flags("--seed=1");
  run.add_flags("--batch_size=64");
  AppendCall(&s, kRecordRun, Bytes(run));
  run.set_started(true);
  AppendCall(&s, kRecordRun, Bytes(run));
  AppendCall(&s, kCRegister, Bytes(worker));  // rank 1 again: incarnation 2
  const std::string gen = "s0.1-s1.1-w0.1-w1.2-";
  for (int rank : {1, 0}) {
    ReportStoppedRequest stopped;
    stopped.set_rank(rank);
    stopped.set_incarnation(rank == 0 ? 1 : 2);
    stopped.set_generation(gen);
    AppendCall(&s, kReportStopped, Bytes(stopped));
  }
  DecideRollbackRequest decide;
  decide.set_rank(0);
  decide.set_incarnation(1);
  decide.set_generation(gen);
  decide.set_step(0);
  AppendCall(&s, kDecideRollback, Bytes(decide));
  AppendCall(&s, kGetView, Bytes(GetViewRequest()));
  Write(out / "coordinator" / "worker_fails_and_rolls_back", s);
}

// A stranger asks to shrink a chain and to join a replica to it (no member secret: both
// refused), and reports a replica unreachable (nothing probes it here).
void StrangerChangesAChainSeed(const fs::path& out) {
  using namespace pscluster::coord;
  std::string c;
  RegisterReplicas(&c);
  ShrinkChainRequest shrink;
  shrink.set_shard(0);
  shrink.set_replica(0);
  shrink.set_epoch(2);
  AppendCall(&c, kShrinkChain, Bytes(shrink));
  JoinChainRequest join;
  join.set_shard(1);
  join.set_replica(1);
  join.set_epoch(2);
  join.set_caller(1);
  join.set_member_secret("0123456789abcdef0123456789abcdef");
  AppendCall(&c, kJoinChain, Bytes(join));
  ReportUnreachableRequest report;
  report.set_shard(1);
  report.set_address("shard1b:5000");
  AppendCall(&c, kReportUnreachable, Bytes(report));
  AppendCall(&c, kGetView, Bytes(GetViewRequest()));
  Write(out / "coordinator" / "stranger_changes_a_chain", c);
}

}  // namespace

void CoordinatorSeeds(const fs::path& out) {
  JoinTrainSwitchSeed(out);
  ReplicaFailsAndJoinsSeed(out);
  WorkerFailsAndRollsBackSeed(out);
  StrangerChangesAChainSeed(out);
}

}  // namespace pscluster::fuzz::seeds
