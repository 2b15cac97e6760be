// Chain replication of one shard (ps_server --replica, ps_coordinator --replicas > 1).
//
// The coordinator owns the chain (proto Chain: the shard's replicas in order, numbered by
// an epoch) and this replica follows it (Update). The head takes every client call; each
// update it applies gets the next sequence number and goes down the chain (Write); every
// other member applies the updates it receives in sequence order, hands them on, and
// answers once the members after it have (Receive). The tail's answer travels back up, so
// the client's call succeeds only once every member holds the update. All members apply
// the same updates in the same order, so they hold bitwise the same state.
//
// Failures: a member that cannot reach its successor (dead, cut off, or of another epoch)
// asks the coordinator for the chain again and retries, bounded by forward_timeout (by
// cut_off_timeout while the coordinator cannot be reached either: a member cut off from
// both learns from the coordinator, once it hears it again, whether it is still in the
// chain): once the coordinator has taken a dead member out, the update reaches the new
// successor (who skips what it already holds, by sequence number) or this member is the
// tail, or this member learns it was taken out and joins again. A head
// that dies before answering leaves its clients to retry on the next head with the same
// request id (gRPC metadata ps-request-id), which answers from what the first call did
// instead of applying it again.
//
// Joining: a replica outside a live chain (a replacement, or a member taken out that came
// back) asks the chain's tail for its state (TransferState). The tail copies its whole
// state at a moment no BSP step is half pushed, from then on hands the joiner every update
// as it would a successor, and streams the state; the joiner installs it, applies the
// updates that queued meanwhile, and says so (JoinedChain); the tail then has the
// coordinator append it as the new tail. Training goes on throughout; updates wait while
// the state is in transit. Any change of the chain meanwhile, or an update the joiner
// fails, starts the join over.
//
// Replacing the whole state (Restore, ImportDense) is not an update the chain carries: the
// head first has the coordinator shrink the chain to itself (StandAlone), replaces its state
// with no joins in progress (HoldJoins, AloneNow), and the others join again.
//
// Reads: the head serves pulls, and only while its lease holds: a heartbeat answered by the
// coordinator less than `lease` ago (well under the coordinator's liveness timeout), so a
// head the coordinator may have replaced (cut off from it) stops serving before the new head
// starts. A chain of one member needs no lease: the coordinator never removes the last.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/parking.h"
#include "common/security.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.grpc.pb.h"
#include "server/ps/replication/write_log.h"
#include "server/ps/table/shard.h"
#include "server/ps/table/table.h"

namespace pscluster::ps {

// This replica's place in its shard's chain, as the coordinator last said.
struct ChainConfig {
  int64_t epoch = 0;
  std::vector<int32_t> replicas;  // head first
  std::vector<std::string> addresses;
  // The chain has had all its replicas once (or started over after losing them all): a
  // head serves only then, so no update is acknowledged by a chain still being joined.
  bool formed = false;
};

struct ReplicatorOptions {
  uint32_t shard_id = 0;
  int32_t replica = 0;
  absl::Duration lease = absl::Seconds(3);             // see the file comment
  absl::Duration forward_timeout = absl::Seconds(20);  // an update's trip down the chain
  // An update's trip down the chain while neither the successor nor the coordinator can be
  // reached (this replica cut off): the coordinator decides whether the successor is still
  // in the chain, so forward_timeout runs only while it answers.
  absl::Duration cut_off_timeout = absl::Minutes(10);
  int max_message_bytes = 4 << 20;
  size_t max_request_ids = 1 << 16;  // request ids remembered for retries after a failover
  Security security;
  // Asks the coordinator for the chain now (after a successor failed or spoke of a newer
  // epoch); calls Update itself. Bounded; false when the coordinator did not answer (the
  // chain known here may be out of date). May be null.
  std::function<bool()> refresh;
  // Tells the coordinator that the successor at `address` did not take an update, before
  // each refresh of a failed trip: the coordinator probes it and, if it does not answer
  // either, takes it out at once instead of after the liveness timeout. May be null.
  std::function<void(const std::string& address)> report_unreachable;
  // The shard's chain key (common/call_metadata.h), sent with every call to another replica
  // and required of every replication call taken. Null or empty: none sent or required.
  std::function<std::string()> chain_key;
  std::string address;  // where this replica serves (a joiner tells the tail)
  ShardOptions shard;   // a joiner loads the tail's state into a shard of these options
  // The tail: asks the coordinator to append a joiner that holds the chain's state and
  // every update since (CoordinatorClient::JoinChain); the new epoch. Null: no joins.
  std::function<absl::StatusOr<int64_t>(int32_t replica, int64_t epoch)> append;
  // The head: asks the coordinator to make the chain this head alone
  // (CoordinatorClient::ShrinkChain); the new epoch. Null: Restore needs a chain of one.
  std::function<absl::StatusOr<int64_t>(int32_t replica, int64_t epoch)> shrink;
  absl::Duration transfer_timeout = absl::Minutes(10);  // one state transfer, whole
  // Held shared by every call that uses the shard's tables, exclusively to replace them
  // (ShardCore's ServingGate): updates apply under it shared, a joiner installs its new
  // state under it exclusively. Locks are taken in the order serving, then the order lock.
  absl::Mutex* serving = nullptr;
  // The replica must stop: an update it applied cannot be handed down the chain while the
  // coordinator keeps the successor in it (chain replication assumes members that fail by
  // stopping). From then on it refuses every call (stopped()); `stop` ends the process
  // (ps_server: a graceful shutdown, exit status 3). May be null.
  std::function<void()> stop;
};

class Replicator {
 public:
  // Applies one update that came down the chain (the first message and, for a stream, the
  // later chunks' data), as the head applied it.
  using Apply = std::function<absl::Status(const ReplicatedUpdate&, std::vector<std::string>*)>;
  // The shard's state as it is now, for a joiner: every table's image (Table::CaptureNow:
  // UNAVAILABLE while a BSP step is half pushed) and the registered workers.
  struct State {
    std::vector<std::unique_ptr<TableImage>> images;
    std::vector<int32_t> workers;
    // Shard::Fingerprint of this state, computed from it.
    uint32_t Fingerprint() const;
  };
  using Capture = std::function<absl::StatusOr<State>()>;
  // Replaces the shard's tables and workers with `staged`'s (a joiner's new state).
  using Install = std::function<absl::Status(std::unique_ptr<Shard> staged)>;

  Replicator(ReplicatorOptions options, Apply apply, Capture capture = nullptr,
             Install install = nullptr);
  ~Replicator();  // stops joining

  // From now on, whenever this replica is outside its live chain, it joins it (a thread).
  void StartJoining();

  void Update(const ChainConfig& config);
  // A heartbeat sent at `sent` was answered: the lease runs from then.
  void Renew(absl::Time sent);

  // OK when this replica serves clients now: the head of its chain, its lease valid.
  // Otherwise UNAVAILABLE naming the head (clients go there).
  absl::Status CheckHead() const;
  // UNAVAILABLE once this replica had to stop (ReplicatorOptions::stop); else OK.
  absl::Status stopped() const;
  // Before the head replaces its whole state (`what`: Restore, ImportDense), which the chain
  // does not carry as an update: the chain becomes the head alone (the coordinator's
  // ShrinkChain), and the others join again by a state transfer of the new state. One at
  // a time: concurrent imports of several tables shrank the chain of the epoch they had
  // all read, and every one but the first was refused.
  absl::Status StandAlone(absl::string_view what);
  // Whether the chain is this replica alone with no joiner: checked again, and any joiner
  // dropped, once the caller holds `serving` exclusively (no transfer can start then).
  bool AloneNow();
  // Held by a transfer to a joiner, by JoinedChain, and by a head replacing its whole state
  // (one at a time), before `serving`.
  std::unique_ptr<absl::MutexLock> HoldJoins() {
    return std::make_unique<absl::MutexLock>(&transfer_mu_);
  }

  // A client's update on the head. `apply` runs in the chain's order (one at a time), then
  // `update` (its payload; seq and epoch are set here) goes down the chain with `chunks`
  // (a stream's later chunk data, moved out). A request id seen before skips `apply` and
  // waits for the first call's update to be acknowledged.
  absl::Status Write(const std::string& request_id, ReplicatedUpdate update,
                     std::vector<std::string>* chunks, const std::function<absl::Status()>& apply);

  // Every replication call taken (Replicate, TransferState, JoinedChain): PERMISSION_DENIED
  // unless its caller sent this shard's chain key, which only the shard's replicas hold.
  absl::Status CheckPeer(const grpc::ServerContextBase& ctx, const char* call) const;
  // The same key on a call to another replica.
  void SignCall(grpc::ClientContext* ctx) const;

  // The Replicate RPC, whose stream the service reads (server/ps/service/replicate_stream.h).
  // Its first message: whether this replica reads the rest at all (it refuses a sender it
  // takes nothing from before a stream's chunks are read).
  absl::Status CheckFirst(const ReplicatedUpdate& first);
  // The whole update, once its sender ended the call (a stream's later chunk data in
  // *chunks): waits for the updates before it, applies it and hands it on. With
  // wait.waiter, an update whose turn has not come parks: Parked() at once, and the waiter
  // is woken when its turn comes (the call then runs Receive again). Bounded by
  // wait.deadline (OperationDeadline()).
  absl::Status Receive(ReplicatedUpdate* update, std::vector<std::string>* chunks,
                       const Wait& wait);
  // How long from now a received update may wait for its turn and its trip down the chain.
  absl::Time OperationDeadline() const { return absl::Now() + options_.forward_timeout; }
  // The tail's side of a join (the TransferState and JoinedChain RPCs). `write` sends one
  // message of the state, false once the joiner stopped reading.
  using WriteChunk = std::function<bool(const StateTransferChunk&)>;
  absl::Status TransferState(const TransferStateRequest& req, const WriteChunk& write);
  absl::Duration transfer_timeout() const { return options_.transfer_timeout; }
  // Received updates parked now, waiting for their turn.
  size_t parked() const {
    absl::MutexLock lock(&mu_);
    return turns_.size();
  }
  grpc::Status JoinedChain(const JoinedChainRequest* req, JoinedChainResponse* resp);

 private:
  struct Place {
    int64_t epoch = 0;
    bool in_chain = false, head = false;
    bool tail = false;        // in the chain, last
    bool to_learner = false;  // the successor is a joiner this tail hands updates to
    bool learning = false;    // outside the chain, taking a tail's updates while joining
    int32_t learner = -1;     // to_learner: the joiner's replica
    size_t size = 0;
    std::string successor, head_address;
  };
  Place PlaceLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Sends the update (seq set) to the successor until it answers OK or this replica is the
  // tail, bounded by forward_timeout. `from_head`: a client's update this replica applied as
  // the head (not done once it left the chain, even to join it again).
  absl::Status Forward(ReplicatedUpdate update, std::vector<std::string>* chunks, bool from_head);
  struct Trip;
  // After a failed attempt of Trip: false to give up (the successor stays in the chain, or
  // the coordinator stayed out of reach for cut_off_timeout); else waits a backoff.
  bool TryAgain(Trip* trip, uint64_t seq);
  // This replica must stop (`what` says why): it refuses everything from now on and calls
  // ReplicatorOptions::stop. Returns the UNAVAILABLE the update it could not hand on gets.
  absl::Status Stop(const std::string& what);
  grpc::Status SendOnce(const std::string& successor, const ReplicatedUpdate& update,
                        std::vector<std::string>* chunks, absl::Time deadline);
  // Waits (bounded) until seq is done: the chain after this replica holds it.
  absl::Status AwaitDone(uint64_t seq, absl::Time deadline);
  ShardReplication::Stub* StubFor(const std::string& address);
  // The joiner's side: the thread, and one attempt at joining the chain of `epoch`.
  void JoinLoop();
  // The chain's epoch once this replica was appended to it.
  absl::StatusOr<int64_t> JoinOnce(const std::string& tail, int64_t epoch);
  // JoinOnce's parts: the tables (and workers) the tail streams, into `staged`; and their
  // install, the log then starting at the tail's update.
  absl::Status ReadState(grpc::ClientReaderInterface<StateTransferChunk>* reader,
                         const StateTransferStart& start, Shard* staged);
  absl::Status InstallState(std::unique_ptr<Shard> staged, const StateTransferStart& start);
  // TransferState's parts: the state at a moment between steps (retried, bounded), with
  // the log's place and ids in *start, this tail handing the joiner every update from then
  // on; and its tables, streamed (false: the joiner stopped reading).
  absl::Status CaptureForJoiner(const TransferStateRequest& req, State* state,
                                StateTransferStart* start);
  bool SendState(const State& state, const WriteChunk& write);
  void UpdateLocked(const ChainConfig& config) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tail stops handing updates to a joiner it could not reach.
  void DropLearner(int32_t replica, int64_t epoch, const grpc::Status& why);
  // Receive's parts. Whether this replica takes `update` from its sender (epochs, place).
  absl::Status CheckSenderLocked(const ReplicatedUpdate& update) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a received update needs once the ones before it are here (bounded by
  // wait.deadline; Parked() when it parked): to be applied, to be handed on again
  // (applied, not yet acknowledged), or nothing.
  enum class Turn { kApply, kHandOn, kHeld };
  absl::StatusOr<Turn> AwaitTurn(const ReplicatedUpdate& update, const Wait& wait);
  // Applies a received update in its turn (the order lock held meanwhile).
  absl::Status ApplyInTurn(const ReplicatedUpdate& update, std::vector<std::string>* chunks);
  // Wakes the updates parked for a turn that has come, or for a chain that has changed.
  void WakeTurnsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Name() const;

  const ReplicatorOptions options_;
  const Apply apply_;
  const Capture capture_;
  const Install install_;
  absl::Mutex own_serving_;  // when options_.serving is null
  absl::Mutex* const serving_;
  mutable absl::Mutex mu_;
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);  // see ReplicatorOptions::stop
  // Received updates parked until their turn: by sequence number and chain epoch.
  struct TurnKey {
    uint64_t seq = 0;
    int64_t epoch = 0;
  };
  Waiters<TurnKey> turns_ ABSL_GUARDED_BY(mu_);
  ChainConfig config_ ABSL_GUARDED_BY(mu_);
  bool formed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time lease_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Updates applied here, in seq order (its order lock comes before mu_), and the request
  // ids of the last max_request_ids.
  WriteLog log_{Name(), &mu_, options_.max_request_ids, /*ordered=*/true};
  // The tail: the joiner it hands every update to (replica -1: none), for one epoch.
  struct Learner {
    int32_t replica = -1;
    std::string address;
    int64_t epoch = -1;
    std::optional<uint32_t> fingerprint;  // of the state handed to it, once computed
  };
  Learner learner_ ABSL_GUARDED_BY(mu_);
  int64_t learning_epoch_ ABSL_GUARDED_BY(mu_) = -1;  // a joiner: the epoch it joins
  absl::Mutex join_mu_;  // a tail's JoinedChain against dropping that joiner
  absl::Mutex transfer_mu_;
  absl::Mutex stand_alone_mu_;  // StandAlone, one at a time (before mu_)
  absl::Notification stop_;
  std::thread joiner_;
  absl::Mutex stubs_mu_;
  std::map<std::string, std::unique_ptr<ShardReplication::Stub>> stubs_ ABSL_GUARDED_BY(stubs_mu_);
};

// The request id of a client call (metadata kRequestIdKey; "" when absent).
std::string RequestId(const grpc::ServerContextBase* ctx);

}  // namespace pscluster::ps
