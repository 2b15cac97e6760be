#include "server/ps/replicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/call_metadata.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/ps/snapshot_store.h"
#include "server/ps/snapshotter.h"

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
      serving_(options_.serving != nullptr ? options_.serving : &own_serving_) {}

Replicator::~Replicator() {
  stop_.Notify();
  if (joiner_.joinable()) joiner_.join();
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
  std::printf("ps_server: %s: chain epoch %lld: %s (%s)\n", Name().c_str(),
              static_cast<long long>(config.epoch),
              !now.in_chain ? "not in the chain"
              : now.head    ? (now.successor.empty() ? "head and tail" : "head")
                            : (now.successor.empty() ? "tail" : "middle"),
              absl::StrJoin(config.addresses, " -> ").c_str());
  std::fflush(stdout);
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
  std::printf(
      "ps_server: %s: the chain is this head alone (epoch %lld) for %s; the other "
      "replicas join again\n",
      Name().c_str(), static_cast<long long>(config_.epoch), std::string(what).c_str());
  std::fflush(stdout);
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

ParameterServer::Stub* Replicator::StubFor(const std::string& address) {
  absl::MutexLock lock(&stubs_mu_);
  std::unique_ptr<ParameterServer::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options_.max_message_bytes);
    args.SetMaxSendMessageSize(options_.max_message_bytes);
    stub = ParameterServer::NewStub(options_.security.Channel(address, args));
  }
  return stub.get();
}

grpc::Status Replicator::SendOnce(const std::string& successor, const ReplicatedUpdate& update,
                                  std::vector<std::string>* chunks, absl::Time deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
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

absl::Status Replicator::Forward(ReplicatedUpdate update, std::vector<std::string>* chunks,
                                 bool from_head) {
  const absl::Time start = absl::Now();
  absl::Time deadline = start + options_.forward_timeout;
  Backoff backoff(absl::Milliseconds(1), absl::Milliseconds(50));
  grpc::Status last;
  std::string last_to;
  // Whether the coordinator was asked for the chain since the first failed attempt, and
  // whether it answered the last time: only then does "the successor is still in the
  // chain" come from it rather than from an old view. (The chain it answered with is
  // looked at by the next attempt, before any decision.)
  bool asked = options_.refresh == nullptr, coordinator_answered = asked;
  for (bool said = false, said_cut_off = false;;) {
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
    last = SendOnce(p.successor, update, chunks,
                    p.to_learner ? deadline : std::min(deadline, absl::Now() + absl::Seconds(2)));
    last_to = p.successor;
    if (last.ok()) return absl::OkStatus();
    if (p.to_learner) {  // a joiner that fails an update starts its join over
      DropLearner(p.learner, p.epoch, last);
      continue;
    }
    if (absl::Now() >= deadline && asked) {
      if (coordinator_answered || absl::Now() >= start + options_.cut_off_timeout) break;
      // Cut off from the successor and the coordinator alike (a network partition): the
      // coordinator may well have taken this replica out of the chain meanwhile, which it
      // will say once it can be reached, so wait for it instead of stopping; once it
      // answers, the successor has forward_timeout at most.
      deadline = std::min(start + options_.cut_off_timeout, absl::Now() + options_.forward_timeout);
      if (!said_cut_off) {
        std::fprintf(stderr,
                     "ps_server: %s: update %llu: the coordinator cannot be reached "
                     "either; waiting for it (up to %s) to learn whether %s is still in the "
                     "chain\n",
                     Name().c_str(), static_cast<unsigned long long>(update.seq()),
                     absl::FormatDuration(options_.cut_off_timeout).c_str(), last_to.c_str());
        said_cut_off = true;
      }
    }
    if (!said) {
      std::fprintf(stderr,
                   "ps_server: %s: update %llu not acknowledged by %s (%s); asking the "
                   "coordinator for the chain and retrying for up to %s\n",
                   Name().c_str(), static_cast<unsigned long long>(update.seq()), last_to.c_str(),
                   last.error_message().c_str(),
                   absl::FormatDuration(options_.forward_timeout).c_str());
      said = true;
    }
    if (options_.refresh) {
      coordinator_answered = options_.refresh();
      asked = true;
    }
    absl::SleepFor(backoff.Next());
  }
  return Stop(
      absl::StrCat("update ", update.seq(), " applied here could not be handed to ", last_to,
                   " for ", absl::FormatDuration(absl::Now() - start), " (", last.error_message(),
                   "), while the coordinator ",
                   coordinator_answered ? "keeps it in the chain" : "could not be reached either"));
}

absl::Status Replicator::Stop(const std::string& what) {
  // The coordinator still lists a successor this replica cannot reach: the chain cannot go
  // on with both. Chain replication assumes members that fail by stopping, so stop: the
  // coordinator then takes this replica out and the chain goes on without it.
  const std::string why =
      absl::StrCat(Name(), " had to stop: ", what,
                   "; the chain goes on without this replica (restart it to hold a copy again)");
  std::fprintf(stderr, "ps_server: FATAL: %s\n", why.c_str());
  std::fflush(stderr);
  {
    absl::MutexLock lock(&mu_);
    stopped_ = absl::UnavailableError(why);
  }
  if (options_.stop) options_.stop();
  return absl::UnavailableError(why);
}

grpc::Status Replicator::Receive(grpc::ServerContext* ctx,
                                 grpc::ServerReader<ReplicatedUpdate>* reader,
                                 const StreamHooks& hooks) {
  ReplicatedUpdate update;
  if (!reader->Read(&update)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Replicate carried no update");
  }
  if (absl::Status s = stopped(); !s.ok()) return ToGrpcStatus(s);
  const absl::Time deadline =
      std::min(absl::FromChrono(ctx->deadline()), absl::Now() + options_.forward_timeout);
  std::vector<std::string> chunks;
  if (grpc::Status s = ReadRest(ctx, reader, hooks, update, &chunks); !s.ok()) return s;
  // An update is applied only once its sender has sent all of it and ended the stream: one
  // that gives up before (or is idle too long: the service's watch) changes nothing here.
  if (hooks.read) hooks.read();
  if (ctx->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the Replicate call was cancelled before its sender ended it; "
                        "nothing was applied");
  }
  const uint64_t seq = update.seq();
  absl::StatusOr<Turn> turn = AwaitTurn(update, deadline);
  if (!turn.ok() || *turn == Turn::kHeld) return ToGrpcStatus(turn.status());
  if (*turn == Turn::kApply) {
    absl::ReaderMutexLock serving(serving_);
    absl::Status s = log_.AppendAt(
        seq, update.request_id(),
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CheckSenderLocked(update); },
        [&]() -> absl::Status {
          absl::Status s = apply_(update, &chunks);
          if (s.ok()) return s;
          // Refused here, it changed nothing here: not applied, not acknowledged. Sent by
          // a head that applied it, the head cannot hand it on and stops (Forward), and the
          // chain goes on without it; sent by anyone else, it is refused and this replica
          // goes on.
          return absl::Status(s.code(),
                              absl::StrCat(Name(), ": update ", seq, " refused: ", s.message()));
        });
    if (!s.ok()) return ToGrpcStatus(s);
  }
  absl::Status s = Forward(std::move(update), &chunks, /*from_head=*/false);
  if (s.ok()) log_.Done(seq);
  return ToGrpcStatus(s);
}

absl::Status Replicator::CheckSenderLocked(const ReplicatedUpdate& update) const {
  const Place p = PlaceLocked();
  if (update.epoch() < p.epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(), " is at chain epoch ", p.epoch, "; the update comes from epoch ",
                     update.epoch(), ": the sender's chain is out of date"));
  }
  if (update.epoch() > p.epoch) {
    return absl::UnavailableError(absl::StrCat(Name(), " is at chain epoch ", p.epoch,
                                               ", behind the update's ", update.epoch(),
                                               "; retry once it has caught up"));
  }
  if ((!p.in_chain && !p.learning) || p.head) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(), " takes no updates from another member in chain epoch ", p.epoch,
                     p.head ? " (it is the head)" : " (it is not in the chain, nor joining it)"));
  }
  return absl::OkStatus();
}

grpc::Status Replicator::ReadRest(grpc::ServerContext* ctx,
                                  grpc::ServerReader<ReplicatedUpdate>* reader,
                                  const StreamHooks& hooks, const ReplicatedUpdate& update,
                                  std::vector<std::string>* chunks) {
  if (!update.stream()) {
    if (ReplicatedUpdate more; reader->Read(&more)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a Replicate update that is not a stream is one message; another "
                          "followed it");
    }
    return grpc::Status::OK;
  }
  // A sender this replica takes nothing from (an old head, an outsider) is refused before
  // its stream's chunks are read; the rest hold at most the push's total_length values.
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckSenderLocked(update);
        s.code() == absl::StatusCode::kFailedPrecondition) {
      return ToGrpcStatus(s);
    }
  }
  if (!update.has_push_dense()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a Replicate stream must begin with a push_dense");
  }
  auto hold = [&](uint64_t bytes) {
    return hooks.hold ? ToGrpcStatus(hooks.hold(bytes)) : grpc::Status::OK;
  };
  const uint64_t declared = update.push_dense().total_length();
  uint64_t values = update.push_dense().data().size() / sizeof(float);
  uint64_t held = update.push_dense().data().capacity();
  const uint64_t declared_bytes = declared > UINT64_MAX / sizeof(float)
                                      ? UINT64_MAX  // (no budget holds it)
                                      : declared * sizeof(float);
  if (grpc::Status s = hold(std::max(declared_bytes, held)); !s.ok()) return s;
  for (ReplicatedUpdate c; reader->Read(&c);) {
    if (!c.has_chunk()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a Replicate stream's later messages must hold only a chunk");
    }
    values += c.chunk().data().size() / sizeof(float);
    if (values > declared) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("a Replicate stream carries more than its push's "
                                       "total_length=",
                                       declared, " values"));
    }
    held += c.chunk().data().capacity();
    if (grpc::Status s = hold(held); !s.ok()) return s;
    chunks->push_back(std::move(*c.mutable_chunk()->mutable_data()));
  }
  if (values != declared && !ctx->IsCancelled()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the Replicate stream ended after ", values,
                     " of its push's total_length=", declared, " values; nothing was applied"));
  }
  return grpc::Status::OK;
}

absl::StatusOr<Replicator::Turn> Replicator::AwaitTurn(const ReplicatedUpdate& update,
                                                       absl::Time deadline) {
  absl::Status sender;
  {
    absl::MutexLock lock(&mu_);
    sender = CheckSenderLocked(update);
  }
  // This replica may be behind the sender's chain epoch: ask the coordinator (not under mu_:
  // refresh calls Update).
  if (sender.code() == absl::StatusCode::kUnavailable && options_.refresh) options_.refresh();
  const uint64_t seq = update.seq();
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckSenderLocked(update));
  if (seq <= log_.applied()) {
    // Handed on again after a member failed: it is here already. Not acknowledged yet, its
    // first trip down the chain may still be under way, or may have failed (this replica's
    // place changed meanwhile, as when a joiner becomes the tail): hand it on again; the
    // members after this one skip it if they hold it.
    return log_.IsDone(seq) ? Turn::kHeld : Turn::kHandOn;
  }
  const int64_t epoch = update.epoch();
  auto turn = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return log_.applied() + 1 >= seq || config_.epoch != epoch;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline)) {
    return absl::UnavailableError(absl::StrCat(Name(), ": update ", seq, " waited for update ",
                                               log_.applied() + 1, ", which has not arrived"));
  }
  return Turn::kApply;
}

void Replicator::DropLearner(int32_t replica, int64_t epoch, const grpc::Status& why) {
  absl::MutexLock join(&join_mu_);           // not while JoinedChain appends it
  if (options_.refresh) options_.refresh();  // appended meanwhile? then it is a successor
  absl::MutexLock lock(&mu_);
  if (learner_.replica != replica || learner_.epoch != epoch) return;
  std::fprintf(stderr, "ps_server: %s: joining replica %d failed an update (%s); it starts over\n",
               Name().c_str(), replica, why.error_message().c_str());
  learner_ = Learner();
}

grpc::Status Replicator::TransferState(const TransferStateRequest* req,
                                       grpc::ServerWriter<StateTransferChunk>* writer) {
  if (capture_ == nullptr || !options_.append) {
    return ToGrpcStatus(absl::FailedPreconditionError(Name() + " takes no joining replicas"));
  }
  if (req->replica() == options_.replica) {
    return ToGrpcStatus(absl::InvalidArgumentError(Name() + ": a replica cannot join itself"));
  }
  // The state at a moment no BSP step is half pushed: between steps, while no update
  // applies (the order lock), retried until such a moment comes.
  State state;
  StateTransferStart start;
  const absl::Time give_up = absl::Now() + options_.forward_timeout;
  for (absl::Status busy;;) {
    {
      absl::MutexLock order(log_.order());
      {
        absl::MutexLock lock(&mu_);
        const Place p = PlaceLocked();
        if (!p.tail || req->epoch() != p.epoch) {
          return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
              Name(), " is not the tail of chain epoch ", req->epoch(), " (it is at epoch ",
              p.epoch, p.tail ? ", the tail" : ", not the tail", "): read the chain again")));
        }
      }
      absl::StatusOr<State> captured = capture_();
      if (captured.ok()) {
        state = *std::move(captured);
        absl::MutexLock lock(&mu_);
        start.set_seq(log_.applied());
        log_.ForEachId([&](const std::string& id, uint64_t seq) {
          start.add_request_ids(id);
          start.add_request_seqs(seq);
        });
        learner_ = {req->replica(), req->address(), config_.epoch};
        break;
      }
      if (!absl::IsUnavailable(captured.status())) return ToGrpcStatus(captured.status());
      busy = captured.status();
    }
    if (absl::Now() >= give_up) {
      return ToGrpcStatus(absl::UnavailableError(
          absl::StrCat(Name(), ": no moment between steps to copy the state within ",
                       absl::FormatDuration(options_.forward_timeout), " (", busy.message(), ")")));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  for (int32_t w : state.workers) start.add_workers(w);
  start.set_tables(state.images.size());
  std::printf(
      "ps_server: %s: handing replica %d the state at update %llu (%zu tables) and "
      "every update from now on\n",
      Name().c_str(), req->replica(), static_cast<unsigned long long>(start.seq()),
      state.images.size());
  std::fflush(stdout);
  StateTransferChunk chunk;
  *chunk.mutable_start() = std::move(start);
  bool sent = writer->Write(chunk);
  for (size_t i = 0; sent && i < state.images.size(); ++i) {
    chunk.set_header(state.images[i]->header.SerializeAsString());
    sent = writer->Write(chunk);
    if (!sent) break;
    absl::Status emitted = EmitBlocks(*state.images[i], [&](const std::string& block) {
      chunk.set_block(block);
      return writer->Write(chunk) ? absl::OkStatus()
                                  : absl::UnavailableError("the joiner stopped reading");
    });
    sent = emitted.ok();
  }
  if (!sent) {
    DropLearner(req->replica(), req->epoch(),
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "the state transfer broke off"));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the joiner stopped reading the state");
  }
  return grpc::Status::OK;
}

grpc::Status Replicator::JoinedChain(const JoinedChainRequest* req, JoinedChainResponse* resp) {
  absl::MutexLock join(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (learner_.replica != req->replica() || learner_.epoch != req->epoch() ||
        config_.epoch != req->epoch()) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
          Name(), " is not handing replica ", req->replica(), " the updates of chain epoch ",
          req->epoch(), " (it failed one, or the chain changed): start the transfer again")));
    }
  }
  absl::StatusOr<int64_t> epoch = options_.append(req->replica(), req->epoch());
  if (!epoch.ok()) return ToGrpcStatus(epoch.status());
  if (options_.refresh) options_.refresh();  // the joiner is the successor now
  resp->set_epoch(*epoch);
  return grpc::Status::OK;
}

void Replicator::JoinLoop() {
  absl::Duration wait = absl::Milliseconds(50);
  while (!stop_.WaitForNotificationWithTimeout(wait)) {
    bool in_chain = false, formed = false;
    {
      absl::MutexLock lock(&mu_);
      in_chain = PlaceLocked().in_chain;
      formed = formed_;
    }
    if (!formed) {  // forming: hear of the other replicas now, not at the next heartbeat
      if (options_.refresh) options_.refresh();
      wait = absl::Milliseconds(50);
      continue;
    }
    wait = absl::Milliseconds(500);
    if (in_chain) continue;
    // Join only on the coordinator's word of now: a replica that joined, or whose join the
    // tail completed without this replica hearing the answer, is in the chain already, and
    // joining again would drop the order of the updates it holds.
    if (options_.refresh && !options_.refresh()) continue;
    ChainConfig c;
    {
      absl::MutexLock lock(&mu_);
      c = config_;
      in_chain = PlaceLocked().in_chain;
    }
    if (in_chain || c.addresses.empty()) continue;
    std::printf("ps_server: %s: outside its chain (epoch %lld); joining it from the tail, %s\n",
                Name().c_str(), static_cast<long long>(c.epoch), c.addresses.back().c_str());
    std::fflush(stdout);
    absl::StatusOr<int64_t> joined = JoinOnce(c.addresses.back(), c.epoch);
    {
      absl::MutexLock lock(&mu_);
      learning_epoch_ = -1;
      if (joined.ok()) {
        // The coordinator appended this replica to the chain of c.epoch: it is the tail of
        // the next epoch from now on, whenever its next view of the chain comes.
        c.epoch = *joined;
        c.replicas.push_back(options_.replica);
        c.addresses.push_back(options_.address);
        UpdateLocked(c);
      }
    }
    if (joined.ok()) {
      std::printf("ps_server: %s: joined its chain\n", Name().c_str());
    } else {
      std::fprintf(stderr, "ps_server: %s: joining its chain failed (%s); trying again\n",
                   Name().c_str(), std::string(joined.status().message()).c_str());
    }
    std::fflush(stdout);
    // (No view asked for here: a replica that joined holds its chain already, and one that
    // failed asks before it tries again.)
  }
}

absl::StatusOr<int64_t> Replicator::JoinOnce(const std::string& tail, int64_t epoch) {
  {
    // What this replica held is no longer the chain's: updates handed to it from now on
    // wait (in order) for the state they follow.
    absl::MutexLock order(log_.order());
    absl::MutexLock lock(&mu_);
    if (config_.epoch != epoch || PlaceLocked().in_chain) {
      return absl::AbortedError(
          absl::StrCat("the chain moved on from epoch ", epoch, " before the join began"));
    }
    learning_epoch_ = epoch;
    log_.Reset(0);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.transfer_timeout));
  TransferStateRequest req;
  req.set_replica(options_.replica);
  req.set_address(options_.address);
  req.set_epoch(epoch);
  auto reader = StubFor(tail)->TransferState(&ctx, req);
  StateTransferChunk chunk;
  if (!reader->Read(&chunk) || !chunk.has_start()) {
    grpc::Status s = reader->Finish();
    return absl::UnavailableError(absl::StrCat(
        "the tail ", tail, " sent no state: ", s.ok() ? "no start" : s.error_message()));
  }
  const StateTransferStart start = chunk.start();
  auto staged = std::make_unique<Shard>(options_.shard);
  ShardLoader loader(staged.get());
  TableSnapshotHeader header;
  uint64_t dense_at = 0;
  uint32_t tables = 0;
  auto table_done = [&]() -> absl::Status {
    if (tables > 0 && header.spec().kind() == TableSpec::DENSE &&
        dense_at != header.shard_end() - header.shard_begin()) {
      return absl::DataLossError(
          absl::StrCat("state transfer: table ", header.spec().table_id(), " came with ", dense_at,
                       " of ", header.shard_end() - header.shard_begin(), " values"));
    }
    return absl::OkStatus();
  };
  absl::Status loaded;
  while (loaded.ok() && reader->Read(&chunk)) {
    if (chunk.has_header()) {
      loaded = table_done();
      if (!loaded.ok()) break;
      if (!header.ParseFromString(chunk.header())) {
        loaded = absl::DataLossError("state transfer: a table header does not parse");
        break;
      }
      ++tables;
      dense_at = 0;
      loaded = loader.Header(header);
    } else if (chunk.has_block() && tables > 0) {
      loaded = VisitBlock(header, chunk.block().data(), chunk.block().size(), &dense_at, &loader,
                          "state transfer");
    } else {
      loaded = absl::DataLossError("state transfer: a block before any table header");
    }
  }
  if (!loaded.ok()) ctx.TryCancel();
  grpc::Status finished = reader->Finish();
  RETURN_IF_ERROR(loaded);
  if (!finished.ok()) return FromGrpcStatus(finished, absl::StrCat("the tail ", tail));
  RETURN_IF_ERROR(table_done());
  if (tables != start.tables()) {
    return absl::DataLossError(
        absl::StrCat("state transfer: ", tables, " of ", start.tables(), " tables came"));
  }
  staged->RestoreWorkers({start.workers().begin(), start.workers().end()});
  {
    absl::WriterMutexLock serving(serving_);  // no call uses the tables meanwhile
    absl::MutexLock order(log_.order());
    RETURN_IF_ERROR(install_(std::move(staged)));
    absl::MutexLock lock(&mu_);
    log_.Reset(start.seq(), [&](RecentIds<uint64_t>* ids) {
      for (int i = 0; i < start.request_ids_size() && i < start.request_seqs_size(); ++i) {
        if (!start.request_ids(i).empty()) ids->Set(start.request_ids(i), start.request_seqs(i));
      }
    });
  }
  std::printf("ps_server: %s: installed the state at update %llu (%u tables)\n", Name().c_str(),
              static_cast<unsigned long long>(start.seq()), tables);
  std::fflush(stdout);
  grpc::ClientContext joined_ctx;
  joined_ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.forward_timeout));
  JoinedChainRequest joined;
  joined.set_replica(options_.replica);
  joined.set_epoch(epoch);
  JoinedChainResponse resp;
  RETURN_IF_ERROR(FromGrpcStatus(StubFor(tail)->JoinedChain(&joined_ctx, joined, &resp),
                                 absl::StrCat("the tail ", tail)));
  return resp.epoch();
}

}  // namespace pscluster::ps
