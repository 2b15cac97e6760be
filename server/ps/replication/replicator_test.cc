// Chain replication in one process: two replicas of one shard, each a ShardServices
// with its Replicator behind a real gRPC server on loopback, and the coordinator played by
// the test (the chain each replica is told of, and the joins it grants).
#include "server/ps/replication/replicator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/ps/shard_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/ps/service/shard_services.h"

namespace pscluster::ps {
namespace {

// One replica: its shard, its service and its gRPC server (the chain is attached later).
struct Replica {
  explicit Replica(int32_t replica, ServiceOptions options = ServiceOptions())
      : replica(replica), shard(ShardOptions()), services(&shard, nullptr, options) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    services.RegisterWith(&builder);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
    stub =
        pscluster::ShardStub::New(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  ~Replica() {
    server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    chain.reset();
  }
  void Follow(ReplicatorOptions o, absl::Duration forward_timeout = absl::Seconds(5)) {
    o.replica = replica;
    o.address = address;
    o.forward_timeout = forward_timeout;
    chain = services.NewReplicator(o);
    chain->Renew(absl::InfiniteFuture());  // the coordinator answers every heartbeat
    services.core()->gate.SetReplicator(chain.get());
  }
  uint32_t Fingerprint() {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    StatsRequest req;
    req.set_fingerprint(true);
    StatsResponse stats;
    EXPECT_TRUE(stub->Stats(&ctx, req, &stats).ok());
    return stats.fingerprint();
  }

  const int32_t replica;
  Shard shard;
  ShardServices services;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::unique_ptr<pscluster::ShardStub> stub;
  std::unique_ptr<Replicator> chain;
};

// Worker 0 registered and table 1 created (64 values, Adam, BSP) on the head.
void RegisterAndCreateTable(pscluster::ShardStub* head) {
  grpc::ClientContext ctx;
  RegisterWorkerRequest req;
  req.set_worker_id(0);
  RegisterWorkerResponse resp;
  ASSERT_TRUE(head->RegisterWorker(&ctx, req, &resp).ok());
  grpc::ClientContext create_ctx;
  CreateTableRequest create;
  TableSpec* spec = create.mutable_spec();
  spec->set_table_id(1);
  spec->set_kind(TableSpec::DENSE);
  spec->set_size(64);
  spec->mutable_optimizer()->set_kind(OptimizerConfig::ADAM);  // BSP by default
  spec->mutable_optimizer()->set_learning_rate(0.01f);
  CreateTableResponse created;
  grpc::Status s = head->CreateTable(&create_ctx, create, &created);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

grpc::Status Push(pscluster::ShardStub* head, int64_t step) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  DenseChunk c;
  c.set_worker_id(0);
  c.set_step(step);
  c.set_table_id(1);
  c.set_total_length(64);
  std::vector<float> grad(64);
  for (size_t i = 0; i < grad.size(); ++i) {
    grad[i] = 0.01f * static_cast<float>((i * 7 + step) % 13) - 0.06f;
  }
  c.set_data(grad.data(), grad.size() * sizeof(float));
  PushDenseResponse resp;
  return head->PushDense(&ctx, c, &resp);
}

// A replica that joined, but heard nothing from the coordinator since (its link to it down
// for a while, as after a network partition heals), is the chain's tail all the same: it
// takes the head's updates in order and holds the head's state, instead of taking itself
// for an outsider and starting its join over with the state it holds dropped.
TEST(ReplicatorTest, AJoinerThatCannotHearTheCoordinatorIsTheTailItJoinedAs) {
  Replica head(1), joiner(0);
  std::atomic<bool> coordinator_reachable{true};
  absl::Notification appended;
  ChainConfig alone{/*epoch=*/3, {1}, {head.address}, /*formed=*/true};

  ReplicatorOptions ho;
  ho.append = [&](int32_t replica, int64_t epoch) -> absl::StatusOr<int64_t> {
    EXPECT_EQ(replica, 0);
    EXPECT_EQ(epoch, 3);
    // The coordinator appends the joiner, tells the head, and from now on the joiner does
    // not reach it.
    coordinator_reachable = false;
    head.chain->Update(ChainConfig{4, {1, 0}, {head.address, joiner.address}, true});
    appended.Notify();
    return 4;
  };
  head.Follow(ho);
  head.chain->Update(alone);

  // The head's state before the join: a worker and a BSP table with a step applied.
  RegisterAndCreateTable(head.stub.get());
  {
    grpc::Status s = Push(head.stub.get(), 0);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  ReplicatorOptions jo;
  jo.refresh = [&] { return coordinator_reachable.load(); };  // the view it holds stays
  joiner.Follow(jo);
  joiner.chain->Update(alone);
  joiner.chain->StartJoining();
  ASSERT_TRUE(appended.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the joiner never completed a state transfer";

  // Updates after the join go down the chain to the joiner (a head that cannot hand one on
  // within forward_timeout stops the process), and both hold the same state.
  for (int64_t step = 1; step <= 20; ++step) {
    grpc::Status s = Push(head.stub.get(), step);
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.error_message();
  }
  EXPECT_EQ(joiner.Fingerprint(), head.Fingerprint());
  EXPECT_EQ(joiner.chain->CheckHead().code(), absl::StatusCode::kUnavailable);
}

// A joiner proves the state it installed (issue 49): the tail hands its fingerprint with
// the state, and appends the joiner only if the joiner names that fingerprint back. One
// that names another (a state lost or changed on the way, or a caller that never read it)
// is refused, dropped as the tail's learner, and the chain does not change.
TEST(ReplicatorTest, ATailAppendsOnlyAJoinerThatProvesTheStateItWasHanded) {
  Replica head(1);
  std::atomic<int> appends{0};
  ReplicatorOptions ho;
  ho.append = [&](int32_t, int64_t) -> absl::StatusOr<int64_t> { return ++appends + 3; };
  head.Follow(ho);
  head.chain->Update(ChainConfig{/*epoch=*/3, {1}, {head.address}, /*formed=*/true});
  RegisterAndCreateTable(head.stub.get());
  ASSERT_TRUE(Push(head.stub.get(), 0).ok());

  auto transfer = [&]() -> StateTransferStart {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    TransferStateRequest req;
    req.set_replica(0);
    req.set_address("127.0.0.1:1");
    req.set_epoch(3);
    auto reader = head.stub->TransferState(&ctx, req);
    StateTransferChunk chunk, first;
    for (bool got_first = false; reader->Read(&chunk);) {
      if (!got_first) first = chunk, got_first = true;
    }
    EXPECT_TRUE(reader->Finish().ok());
    return first.start();
  };
  auto joined = [&](uint32_t fingerprint) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    JoinedChainRequest req;
    req.set_replica(0);
    req.set_epoch(3);
    req.set_state_fingerprint(fingerprint);
    JoinedChainResponse resp;
    return head.stub->JoinedChain(&ctx, req, &resp);
  };
  const StateTransferStart start = transfer();
  EXPECT_EQ(start.fingerprint(), head.Fingerprint());
  grpc::Status wrong = joined(start.fingerprint() ^ 1);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(wrong.error_message().find("not the one handed to it"), std::string::npos)
      << wrong.error_message();
  // Dropped as the learner: naming the right one now is too late; a new transfer is needed.
  EXPECT_EQ(joined(start.fingerprint()).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(appends.load(), 0);
  EXPECT_EQ(transfer().fingerprint(), start.fingerprint());
  EXPECT_TRUE(joined(start.fingerprint()).ok());
  EXPECT_EQ(appends.load(), 1);
}

// Imports of several tables run concurrently (ImportState), each making the chain its head
// alone first: they shrank the chain of the epoch they had all read, and the coordinator
// refused all but the first (every checkpoint of a collective mode failed with replicas).
TEST(ReplicatorTest, ConcurrentStandAlonesShrinkTheChainOnce) {
  Replica head(0);
  absl::Mutex mu;
  int64_t epoch = 2;
  int calls = 0;
  ReplicatorOptions o;
  o.shrink = [&](int32_t replica, int64_t seen) -> absl::StatusOr<int64_t> {
    absl::MutexLock lock(&mu);
    if (++calls == 1) {  // the first waits (bounded) for another caller to come in too
      mu.AwaitWithTimeout(absl::Condition(
                              +[](int* n) { return *n > 1; }, &calls),
                          absl::Seconds(2));
    }
    if (seen != epoch) {
      return absl::FailedPreconditionError(absl::StrCat("replica ", replica,
                                                        " is not the head of chain epoch ", seen,
                                                        " (it is at ", epoch, ")"));
    }
    ++epoch;
    head.chain->Update(ChainConfig{epoch, {0}, {head.address}, true});
    return epoch;
  };
  head.Follow(o);
  head.chain->Update(ChainConfig{2, {0, 1}, {head.address, "127.0.0.1:1"}, true});
  absl::Status first, second;
  std::thread a([&] { first = head.chain->StandAlone("ImportDense"); });
  std::thread b([&] { second = head.chain->StandAlone("ImportDense"); });
  a.join();
  b.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_TRUE(second.ok()) << second;
  absl::MutexLock lock(&mu);
  EXPECT_EQ(calls, 1) << "the second found the chain the head alone already";
}

// A head cut off from its successor and from the coordinator alike (a network partition)
// for longer than forward_timeout does not stop the process: it waits to hear from the
// coordinator, and told then that it was taken out of the chain, it refuses the update it
// could not hand on (UNAVAILABLE, naming the new head) and lives on to join again.
TEST(ReplicatorTest, AHeadCutOffFromEveryoneWaitsForTheCoordinatorInsteadOfStopping) {
  Replica head(0);
  std::string unreachable;  // a successor that answers nothing: its server is gone
  {
    Replica gone(1);
    unreachable = gone.address;
  }
  const absl::Duration forward_timeout = absl::Milliseconds(200);
  absl::Time cut_at = absl::InfiniteFuture();
  absl::Mutex mu;
  int refreshes = 0;
  ReplicatorOptions o;
  // The coordinator cannot be reached until the cut has lasted 5 forward timeouts; then it
  // says what it decided meanwhile: the chain is the successor alone.
  o.refresh = [&] {
    absl::MutexLock lock(&mu);
    ++refreshes;
    if (absl::Now() < cut_at + 5 * forward_timeout) return false;
    head.chain->Update(ChainConfig{3, {1}, {unreachable}, true});
    return true;
  };
  head.Follow(o, forward_timeout);
  head.chain->Update(ChainConfig{1, {0}, {head.address}, true});
  RegisterAndCreateTable(head.stub.get());
  head.chain->Update(ChainConfig{2, {0, 1}, {head.address, unreachable}, true});
  {
    absl::MutexLock lock(&mu);
    cut_at = absl::Now();
  }
  grpc::Status s = Push(head.stub.get(), 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("taken out of its chain"), std::string::npos)
      << s.error_message();
  absl::MutexLock lock(&mu);
  EXPECT_GT(refreshes, 1);
}

// A head whose successor does not take an update for forward_timeout, while the
// coordinator answers and keeps the successor in the chain, must stop (chain replication
// assumes members that fail by stopping). It no longer ends the process from library code:
// the update is refused UNAVAILABLE saying why, `stop` is called once (ps_server's main then
// shuts down and exits 3), and from then on the replica refuses every call.
TEST(ReplicatorTest, AHeadThatCannotHandOnAnUpdateStopsAndRefusesEverything) {
  Replica head(0);
  std::string unreachable;  // a successor that answers nothing: its server is gone
  {
    Replica gone(1);
    unreachable = gone.address;
  }
  std::atomic<int> stops{0};
  ReplicatorOptions o;
  o.refresh = [] { return true; };  // the coordinator answers: the chain stays as it is
  o.stop = [&] { ++stops; };
  head.Follow(o, absl::Milliseconds(200));
  head.chain->Update(ChainConfig{1, {0}, {head.address}, true});
  RegisterAndCreateTable(head.stub.get());
  head.chain->Update(ChainConfig{2, {0, 1}, {head.address, unreachable}, true});
  grpc::Status s = Push(head.stub.get(), 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("had to stop"), std::string::npos) << s.error_message();
  EXPECT_EQ(stops.load(), 1);
  EXPECT_EQ(head.chain->stopped().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(head.chain->CheckHead().code(), absl::StatusCode::kUnavailable);
  grpc::Status again = Push(head.stub.get(), 1);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAVAILABLE) << again.error_message();
  EXPECT_NE(again.error_message().find("had to stop"), std::string::npos) << again.error_message();
  EXPECT_EQ(stops.load(), 1) << "a refused call does not stop it again";
}

// One Replicate call to `to`, as a head makes it: `messages` in order, then the end of the
// stream, or with `end` false none (the sender gone quiet, the call left open).
grpc::Status Send(Replica& to, const std::vector<ReplicatedUpdate>& messages, bool end = true) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  ReplicateResponse resp;
  auto writer = to.stub->Replicate(&ctx, &resp);
  for (const ReplicatedUpdate& m : messages) {
    if (!writer->Write(m)) break;  // the replica ended the call: Finish says why
  }
  if (end) writer->WritesDone();
  return writer->Finish();
}

// Update 1 of chain epoch `epoch`: a streamed push of `total_length` values to table 1, its
// first message and `chunks` more, 16 values each.
std::vector<ReplicatedUpdate> StreamedPush(int64_t epoch, uint64_t total_length, int chunks) {
  std::vector<ReplicatedUpdate> messages(1 + chunks);
  messages[0].set_seq(1);
  messages[0].set_epoch(epoch);
  messages[0].set_stream(true);
  DenseChunk* push = messages[0].mutable_push_dense();
  push->set_table_id(1);
  push->set_total_length(total_length);
  const std::vector<float> values(16, 0.5f);
  push->set_data(values.data(), values.size() * sizeof(float));
  for (int i = 1; i <= chunks; ++i) {
    messages[i].mutable_chunk()->set_data(values.data(), values.size() * sizeof(float));
  }
  return messages;
}

// A tail takes a push's stream from its predecessor: a stream that carries more values than
// its push declares is refused once it does, one that ends short at its end (both
// INVALID_ARGUMENT), and one from a sender whose chain is out of date before its chunks are
// read (FAILED_PRECONDITION); none changes the replica's state.
TEST(ReplicatorTest, ATailRefusesAStreamLongerThanItsPushOrFromAnOldEpoch) {
  Replica tail(1);
  tail.Follow(ReplicatorOptions());
  tail.chain->Update(ChainConfig{3, {0, 1}, {"127.0.0.1:1", tail.address}, true});
  const uint32_t before = tail.Fingerprint();
  grpc::Status longer = Send(tail, StreamedPush(3, 64, 4));  // 16 + 4 x 16 = 80 values
  EXPECT_EQ(longer.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << longer.error_message();
  EXPECT_NE(longer.error_message().find("more than its push's total_length=64"), std::string::npos)
      << longer.error_message();
  grpc::Status shorter = Send(tail, StreamedPush(3, 64, 1));  // 32 values, then the end
  EXPECT_EQ(shorter.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << shorter.error_message();
  EXPECT_NE(shorter.error_message().find("ended after 32 of its push's total_length=64"),
            std::string::npos)
      << shorter.error_message();
  grpc::Status stale = Send(tail, StreamedPush(2, 64, 1000));  // refused at its first message
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << stale.error_message();
  EXPECT_NE(stale.error_message().find("out of date"), std::string::npos) << stale.error_message();
  EXPECT_EQ(tail.Fingerprint(), before);
}

// An update from the replica before this one is held until its sender ends the call, a
// streamed one whole, as a client's push stream: charged to the shard's in-flight budget
// before its chunks are read, and ended after the idle timeout when its sender goes quiet
// (not held for as long as the sender's deadline), nothing of it applied.
TEST(ReplicatorTest, AReplicateCallKeepsToTheShardsBudgetAndIdleTimeout) {
  ServiceOptions options;
  options.max_inflight_request_bytes = 1 << 20;
  options.stream_idle_timeout = absl::Milliseconds(300);
  Replica tail(1, options);
  tail.Follow(ReplicatorOptions());
  tail.chain->Update(ChainConfig{3, {0, 1}, {"127.0.0.1:1", tail.address}, true});
  const uint32_t before = tail.Fingerprint();
  grpc::Status big = Send(tail, StreamedPush(3, uint64_t{1} << 20, 1000));  // 4 MiB declared
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << big.error_message();
  EXPECT_NE(big.error_message().find("--max_inflight_request_bytes"), std::string::npos)
      << big.error_message();
  grpc::Status huge = Send(tail, StreamedPush(3, UINT64_MAX, 0));  // bytes past 64 bits
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << huge.error_message();
  // (DEADLINE_EXCEEDED, 30 s later, had the call been held until the sender's deadline)
  grpc::Status quiet = Send(tail, StreamedPush(3, 64, 1), /*end=*/false);
  EXPECT_EQ(quiet.error_code(), grpc::StatusCode::CANCELLED) << quiet.error_message();
  ReplicatedUpdate join;  // whole in its first message, but the call never ended
  join.set_seq(1);
  join.set_epoch(3);
  join.mutable_register_worker()->set_worker_id(7);
  grpc::Status open = Send(tail, {join}, /*end=*/false);
  EXPECT_EQ(open.error_code(), grpc::StatusCode::CANCELLED) << open.error_message();
  EXPECT_EQ(tail.Fingerprint(), before);
  ASSERT_TRUE(Send(tail, {join}).ok()) << "the same update, ended, is applied";
  EXPECT_NE(tail.Fingerprint(), before);
}

// Updates that arrive before the one they follow wait for their turn parked, holding no
// thread: eight of them on a tail whose replication pool has two threads, then the one they
// all follow; every one is applied, in order, and answered. (Had each held a thread while
// it waited, update 1 would have queued behind them until their deadline.)
TEST(ReplicatorTest, UpdatesAheadOfTheirTurnParkAndAllApplyOnTwoThreads) {
  ServiceOptions options;
  options.replication_threads = 2;
  Replica tail(1, options);
  tail.Follow(ReplicatorOptions());
  tail.chain->Update(ChainConfig{3, {0, 1}, {"127.0.0.1:1", tail.address}, true});
  auto join = [](uint64_t seq) {
    ReplicatedUpdate u;
    u.set_seq(seq);
    u.set_epoch(3);
    u.mutable_register_worker()->set_worker_id(static_cast<int32_t>(seq));
    return u;
  };
  constexpr int kAhead = 8;
  std::vector<grpc::Status> answered(kAhead);
  std::vector<std::thread> senders;
  for (int i = 0; i < kAhead; ++i) {
    senders.emplace_back([&, i] { answered[i] = Send(tail, {join(2 + i)}); });
  }
  // Bounded: an update that could not park would hold a thread, and the ninth would wait.
  for (const absl::Time give_up = absl::Now() + absl::Seconds(20);
       tail.chain->parked() < kAhead && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(tail.chain->parked(), static_cast<size_t>(kAhead));
  grpc::Status first = Send(tail, {join(1)});
  EXPECT_TRUE(first.ok()) << first.error_message();
  for (auto& t : senders) t.join();
  for (int i = 0; i < kAhead; ++i) {
    EXPECT_TRUE(answered[i].ok()) << "update " << 2 + i << ": " << answered[i].error_message();
  }
  EXPECT_EQ(tail.chain->parked(), 0u);
  std::vector<int32_t> workers = tail.shard.Workers();
  std::sort(workers.begin(), workers.end());
  std::vector<int32_t> want;
  for (int32_t w = 1; w <= kAhead + 1; ++w) want.push_back(w);
  EXPECT_EQ(workers, want);
}

}  // namespace
}  // namespace pscluster::ps
