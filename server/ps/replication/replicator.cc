#include "server/ps/replication/replicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/call_metadata.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/ps/snapshot/snapshot_store.h"
#include "server/ps/snapshot/snapshotter.h"

namespace pscluster::ps {

std::string RequestId(const grpc::ServerContextBase* ctx) {
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kRequestIdKey);
  return it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
}

Replicator::Replicator(ReplicatorOptions options, Apply apply, Capture capture, Install install)
    : options_(std::move(options)),
      apply_(std::move(apply)),
      capture_(std::move(capture)),
      install_(std::move(install)),
      serving_(options_.serving != nullptr ? options_.serving : &own_serving_) {
  log_.SetOnApplied([this] {
    mu_.AssertHeld();
    WakeTurnsLocked();
  });
}

Replicator::~Replicator() {
  stop_.Notify();
  if (joiner_.joinable()) joiner_.join();
  absl::MutexLock lock(&mu_);
  turns_.WakeAll(absl::UnavailableError(Name() + " is shutting down"));
}

void Replicator::StartJoining() {
  if (install_ != nullptr && !joiner_.joinable()) joiner_ = std::thread([this] { JoinLoop(); });
}

std::string Replicator::Name() const {
  return absl::StrCat("shard ", options_.shard_id, " replica ", options_.replica);
}

void Replicator::Update(const ChainConfig& config) {
  absl::MutexLock lock(&mu_);
  UpdateLocked(config);
}

void Replicator::UpdateLocked(const ChainConfig& config) {
  if (config.epoch <= config_.epoch) return;  // views arrive out of order: keep the newest
  config_ = config;
  formed_ |= config.formed;
  if (learner_.replica >= 0 && learner_.epoch != config.epoch) learner_ = Learner();
  const Place now = PlaceLocked();
  LogInfo("%s: chain epoch %lld: %s (%s)", Name().c_str(), static_cast<long long>(config.epoch),
          !now.in_chain ? "not in the chain"
          : now.head    ? (now.successor.empty() ? "head and tail" : "head")
                        : (now.successor.empty() ? "tail" : "middle"),
          absl::StrJoin(config.addresses, " -> ").c_str());
  WakeTurnsLocked();  // an update parked for its turn in the old chain is refused now
}

void Replicator::Renew(absl::Time sent) {
  absl::MutexLock lock(&mu_);
  lease_until_ = std::max(lease_until_, sent + options_.lease);
}

Replicator::Place Replicator::PlaceLocked() const {
  Place p;
  p.epoch = config_.epoch;
  p.size = config_.replicas.size();
  if (!config_.addresses.empty()) p.head_address = config_.addresses[0];
  for (size_t i = 0; i < config_.replicas.size(); ++i) {
    if (config_.replicas[i] != options_.replica) continue;
    p.in_chain = true;
    p.head = i == 0;
    p.tail = i + 1 == config_.replicas.size();
    if (i + 1 < config_.addresses.size()) p.successor = config_.addresses[i + 1];
  }
  if (p.tail && learner_.replica >= 0 && learner_.epoch == config_.epoch) {
    p.successor = learner_.address;
    p.to_learner = true;
    p.learner = learner_.replica;
  }
  p.learning = !p.in_chain && learning_epoch_ >= 0 && learning_epoch_ == config_.epoch;
  return p;
}

absl::Status Replicator::stopped() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

absl::Status Replicator::CheckHead() const {
  absl::MutexLock lock(&mu_);
  if (!stopped_.ok()) return stopped_;
  const Place p = PlaceLocked();
  const std::string chain = absl::StrCat("chain epoch ", p.epoch);
  if (!p.in_chain) {
    return absl::UnavailableError(absl::StrCat(
        Name(), " is not in its shard's chain (", chain,
        p.epoch == 0 ? ": not told yet" : ": taken out; it joins again by a state transfer",
        "); the head is ", p.head_address.empty() ? "unknown" : p.head_address));
  }
  if (!p.head) {
    return absl::UnavailableError(
        absl::StrCat(Name(), " is a backup in ", chain, "; the head is ", p.head_address));
  }
  if (!formed_) {
    return absl::UnavailableError(absl::StrCat(
        Name(), " is the head of a chain still forming as far as it knows (", chain, ", ", p.size,
        " replica(s)): it hears of the others at its next heartbeat; if they never "
        "come, start them"));
  }
  if (p.size > 1 && absl::Now() >= lease_until_) {
    return absl::UnavailableError(absl::StrCat(
        Name(), " is the head of ", chain,
        " but its lease ran out (the coordinator answered no heartbeat for ",
        absl::FormatDuration(options_.lease), "): another replica may be the head now"));
  }
  return absl::OkStatus();
}

absl::Status Replicator::StandAlone(absl::string_view what) {
  absl::MutexLock serial(&stand_alone_mu_);
  int64_t epoch = 0;
  {
    absl::MutexLock lock(&mu_);
    const Place p = PlaceLocked();
    if (!p.head) {
      return absl::UnavailableError(absl::StrCat(what, ": ", Name(), " is not the head"));
    }
    if (p.size <= 1) return absl::OkStatus();
    epoch = p.epoch;
  }
  if (!options_.shrink) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", Name(), " is in a chain of several replicas and cannot shrink it"));
  }
  absl::StatusOr<int64_t> shrunk = options_.shrink(options_.replica, epoch);
  if (!shrunk.ok()) {
    return absl::Status(shrunk.status().code(),
                        absl::StrCat(what, ": making the chain the head alone failed: ",
                                     shrunk.status().message()));
  }
  if (options_.refresh) options_.refresh();
  absl::MutexLock lock(&mu_);
  if (config_.epoch < *shrunk) {
    return absl::UnavailableError(
        absl::StrCat(what, ": ", Name(), " has not heard of chain epoch ", *shrunk, " yet; retry"));
  }
  LogInfo(
      "ps_server: %s: the chain is this head alone (epoch %lld) for %s; the other "
      "replicas join again",
      Name().c_str(), static_cast<long long>(config_.epoch), std::string(what).c_str());
  return absl::OkStatus();
}

bool Replicator::AloneNow() {
  absl::MutexLock lock(&mu_);
  learner_ = Learner();  // a joiner's copy would be of the state about to be replaced
  return config_.replicas.size() <= 1;
}

absl::Status Replicator::AwaitDone(uint64_t seq, absl::Time deadline) {
  if (log_.AwaitDone(seq, deadline)) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(Name(), ": update ", seq,
                   " (this request, made before) has not reached the chain's tail "
                   "yet; retry"));
}

absl::Status Replicator::Write(const std::string& request_id, ReplicatedUpdate update,
                               std::vector<std::string>* chunks,
                               const std::function<absl::Status()>& apply) {
  // A refused update changed nothing (every handler checks before it applies): the log
  // gives it no number.
  const absl::Time deadline = absl::Now() + options_.forward_timeout;
  ASSIGN_OR_RETURN(const WriteLog::Entry entry, log_.Append(request_id, deadline, apply));
  if (entry.repeat) return AwaitDone(entry.seq, deadline);
  update.set_seq(entry.seq);
  update.set_request_id(request_id);
  absl::Status s = Forward(std::move(update), chunks, /*from_head=*/true);
  if (s.ok()) log_.Done(entry.seq);
  return s;
}

ShardReplication::Stub* Replicator::StubFor(const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  std::unique_ptr<ShardReplication::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options_.max_message_bytes);
    args.SetMaxSendMessageSize(options_.max_message_bytes);
    stub = ShardReplication::NewStub(options_.security.Channel(address, args));
  }
  return stub.get();
}

grpc::Status Replicator::SendOnce(const std::string& successor, const ReplicatedUpdate& update,
                                  std::vector<std::string>* chunks, absl::Time deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  SignCall(&ctx);
  ReplicateResponse resp;
  auto writer = StubFor(successor)->Replicate(&ctx, &resp);
  const bool more = chunks != nullptr && !chunks->empty();
  // (The successor applies the update once the stream has ended: end it with the update
  // itself when there is nothing more.)
  bool sent =
      writer->Write(update, more ? grpc::WriteOptions() : grpc::WriteOptions().set_last_message());
  if (more) {
    // The chunks' bytes are lent to one reused message and taken back after each Write
    // (a synchronous Write has serialized the message when it returns).
    ReplicatedUpdate chunk;
    for (size_t i = 0; sent && i < chunks->size(); ++i) {
      chunk.mutable_chunk()->mutable_data()->swap((*chunks)[i]);
      sent = writer->Write(chunk);
      chunk.mutable_chunk()->mutable_data()->swap((*chunks)[i]);
    }
  }
  if (sent && more) writer->WritesDone();
  return writer->Finish();
}

// One update's trip down the chain, across Forward's attempts.
struct Replicator::Trip {
  explicit Trip(const ReplicatorOptions& o)
      : deadline(start + o.forward_timeout),
        asked(o.refresh == nullptr),
        coordinator_answered(asked) {}
  const absl::Time start = absl::Now();
  absl::Time deadline;
  Backoff backoff{absl::Milliseconds(1), absl::Milliseconds(50)};
  grpc::Status last;
  std::string last_to;
  // Whether the coordinator was asked for the chain since the first failed attempt, and
  // whether it answered the last time: only then does "the successor is still in the
  // chain" come from it rather than from an old view. (The chain it answered with is
  // looked at by the next attempt, before any decision.)
  bool asked, coordinator_answered;
  bool said = false, said_cut_off = false;
};

absl::Status Replicator::Forward(ReplicatedUpdate update, std::vector<std::string>* chunks,
                                 bool from_head) {
  Trip trip(options_);
  for (;;) {
    Place p;
    {
      absl::MutexLock lock(&mu_);
      p = PlaceLocked();
    }
    // A joiner is the end of the line for the updates the tail hands it; an update this
    // replica applied as the head before it left the chain reached no one.
    if (p.learning && !from_head) return absl::OkStatus();
    if (!p.in_chain) {
      return absl::UnavailableError(
          absl::StrCat(Name(), " was taken out of its chain (epoch ", p.epoch, ") before update ",
                       update.seq(), " reached the tail; retry on the head, ", p.head_address));
    }
    if (p.successor.empty()) return absl::OkStatus();  // the tail
    update.set_epoch(p.epoch);
    // A joiner may still be installing the state the updates queue behind: give it time.
    trip.last = SendOnce(
        p.successor, update, chunks,
        p.to_learner ? trip.deadline : std::min(trip.deadline, absl::Now() + absl::Seconds(2)));
    trip.last_to = p.successor;
    if (trip.last.ok()) return absl::OkStatus();
    if (p.to_learner) {  // a joiner that fails an update starts its join over
      DropLearner(p.learner, p.epoch, trip.last);
      continue;
    }
    if (!TryAgain(&trip, update.seq())) break;
  }
  return Stop(absl::StrCat(
      "update ", update.seq(), " applied here could not be handed to ", trip.last_to, " for ",
      absl::FormatDuration(absl::Now() - trip.start), " (", trip.last.error_message(),
      "), while the coordinator ",
      trip.coordinator_answered ? "keeps it in the chain" : "could not be reached either"));
}

bool Replicator::TryAgain(Trip* trip, uint64_t seq) {
  const std::string update = std::to_string(seq);
  if (absl::Now() >= trip->deadline && trip->asked) {
    if (trip->coordinator_answered || absl::Now() >= trip->start + options_.cut_off_timeout) {
      return false;
    }
    // Cut off from the successor and the coordinator alike (a network partition): the
    // coordinator may well have taken this replica out of the chain meanwhile, which it
    // will say once it can be reached, so wait for it instead of stopping; once it
    // answers, the successor has forward_timeout at most.
    trip->deadline =
        std::min(trip->start + options_.cut_off_timeout, absl::Now() + options_.forward_timeout);
    if (!trip->said_cut_off) {
      LogWarning(
          "%s: update %s: the coordinator cannot be reached either; waiting "
          "for it (up to %s) to learn whether %s is still in the chain",
          Name().c_str(), update.c_str(), absl::FormatDuration(options_.cut_off_timeout).c_str(),
          trip->last_to.c_str());
      trip->said_cut_off = true;
    }
  }
  if (!trip->said) {
    LogWarning(
        "%s: update %s not acknowledged by %s (%s); asking the "
        "coordinator for the chain and retrying for up to %s",
        Name().c_str(), update.c_str(), trip->last_to.c_str(), trip->last.error_message().c_str(),
        absl::FormatDuration(options_.forward_timeout).c_str());
    trip->said = true;
  }
  if (options_.report_unreachable) options_.report_unreachable(trip->last_to);
  if (options_.refresh) {
    trip->coordinator_answered = options_.refresh();
    trip->asked = true;
  }
  absl::SleepFor(trip->backoff.Next());
  return true;
}

absl::Status Replicator::Stop(const std::string& what) {
  // The coordinator still lists a successor this replica cannot reach: the chain cannot go
  // on with both. Chain replication assumes members that fail by stopping, so stop: the
  // coordinator then takes this replica out and the chain goes on without it.
  const std::string why =
      absl::StrCat(Name(), " had to stop: ", what,
                   "; the chain goes on without this replica (restart it to hold a copy again)");
  LogError("FATAL: %s", why.c_str());
  {
    absl::MutexLock lock(&mu_);
    stopped_ = absl::UnavailableError(why);
    turns_.WakeAll(stopped_);
  }
  if (options_.stop) options_.stop();
  return absl::UnavailableError(why);
}

}  // namespace pscluster::ps
