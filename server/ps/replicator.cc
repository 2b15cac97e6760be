#include "server/ps/replicator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace pscluster::ps {

std::string RequestId(const grpc::ServerContext* ctx) {
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kRequestIdKey);
  return it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
}

Replicator::Replicator(ReplicatorOptions options, Apply apply)
    : options_(std::move(options)), apply_(std::move(apply)) {}

std::string Replicator::Name() const {
  return absl::StrCat("shard ", options_.shard_id, " replica ", options_.replica);
}

void Replicator::Update(const ChainConfig& config) {
  absl::MutexLock lock(&mu_);
  if (config.epoch <= config_.epoch) return;  // views arrive out of order: keep the newest
  const Place before = PlaceLocked();
  config_ = config;
  formed_ |= config.formed;
  const Place now = PlaceLocked();
  if (before.head != now.head || before.in_chain != now.in_chain ||
      before.successor != now.successor) {
    std::printf("ps_server: %s: chain epoch %lld: %s (%s)\n", Name().c_str(),
                static_cast<long long>(config.epoch),
                !now.in_chain ? "not in the chain"
                : now.head    ? (now.successor.empty() ? "head and tail" : "head")
                              : (now.successor.empty() ? "tail" : "middle"),
                absl::StrJoin(config.addresses, " -> ").c_str());
    std::fflush(stdout);
  }
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
    if (i + 1 < config_.addresses.size()) p.successor = config_.addresses[i + 1];
  }
  return p;
}

absl::Status Replicator::CheckHead() const {
  absl::MutexLock lock(&mu_);
  const Place p = PlaceLocked();
  const std::string chain = absl::StrCat("chain epoch ", p.epoch);
  if (!p.in_chain) {
    return absl::UnavailableError(absl::StrCat(
        Name(), " is not in its shard's chain (", chain,
        p.epoch == 0 ? ": not told yet" : ": taken out; restart it to hold a copy again",
        "); the head is ", p.head_address.empty() ? "unknown" : p.head_address));
  }
  if (!p.head) {
    return absl::UnavailableError(
        absl::StrCat(Name(), " is a backup in ", chain, "; the head is ", p.head_address));
  }
  if (!formed_) {
    return absl::UnavailableError(absl::StrCat(
        Name(), " is the head of a chain still forming as far as it knows (", chain, ", ",
        p.size, " replica(s)): it hears of the others at its next heartbeat; if they never "
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

absl::Status Replicator::CheckAlone(absl::string_view what) const {
  absl::MutexLock lock(&mu_);
  if (config_.replicas.size() <= 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " is not replicated yet: ", Name(), " is in a chain of ", config_.replicas.size(),
      " replicas (ps_coordinator --replicas); it works on a chain of one"));
}

void Replicator::AppliedLocked(uint64_t seq, const std::string& request_id) {
  applied_ = seq;
  if (request_id.empty()) return;
  if (request_seq_.emplace(request_id, seq).second) request_order_.push_back(request_id);
  while (request_order_.size() > options_.max_request_ids) {
    request_seq_.erase(request_order_.front());
    request_order_.pop_front();
  }
}

bool Replicator::DoneLocked(uint64_t seq) const {
  return seq <= done_through_ || done_above_.count(seq) > 0;
}

void Replicator::Done(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  done_above_.insert(seq);
  while (!done_above_.empty() && *done_above_.begin() == done_through_ + 1) {
    done_through_ = *done_above_.begin();
    done_above_.erase(done_above_.begin());
  }
}

absl::Status Replicator::AwaitDone(uint64_t seq, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return DoneLocked(seq); };
  if (mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      Name(), ": update ", seq, " (this request, made before) has not reached the chain's tail "
      "yet; retry"));
}

absl::Status Replicator::Write(const std::string& request_id, ReplicatedUpdate update,
                               std::vector<std::string>* chunks,
                               const std::function<absl::Status()>& apply, bool* duplicate) {
  uint64_t seq = 0;
  bool seen = false;
  {
    absl::MutexLock order(&apply_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (!request_id.empty()) {
        if (auto it = request_seq_.find(request_id); it != request_seq_.end()) {
          seen = true;
          seq = it->second;
        }
      }
    }
    if (!seen) {
      // A refused update changed nothing (every handler checks before it applies), so it
      // stays here.
      if (absl::Status s = apply(); !s.ok()) return s;
      absl::MutexLock lock(&mu_);
      seq = applied_ + 1;
      AppliedLocked(seq, request_id);
    }
  }
  if (duplicate != nullptr) *duplicate = seen;
  if (seen) return AwaitDone(seq, absl::Now() + options_.forward_timeout);
  update.set_seq(seq);
  update.set_request_id(request_id);
  absl::Status s = Forward(std::move(update), chunks);
  if (s.ok()) Done(seq);
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
  bool sent = writer->Write(update);
  if (chunks != nullptr) {
    // The chunks' bytes are lent to one reused message and taken back after each Write
    // (a synchronous Write has serialized the message when it returns).
    ReplicatedUpdate chunk;
    for (size_t i = 0; sent && i < chunks->size(); ++i) {
      chunk.mutable_chunk()->mutable_data()->swap((*chunks)[i]);
      sent = writer->Write(chunk);
      chunk.mutable_chunk()->mutable_data()->swap((*chunks)[i]);
    }
  }
  if (sent) writer->WritesDone();
  return writer->Finish();
}

absl::Status Replicator::Forward(ReplicatedUpdate update, std::vector<std::string>* chunks) {
  const absl::Time deadline = absl::Now() + options_.forward_timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  grpc::Status last;
  std::string last_to;
  for (bool said = false;;) {
    Place p;
    {
      absl::MutexLock lock(&mu_);
      p = PlaceLocked();
    }
    if (!p.in_chain) {
      return absl::UnavailableError(absl::StrCat(
          Name(), " was taken out of its chain (epoch ", p.epoch, ") before update ",
          update.seq(), " reached the tail; retry on the head, ", p.head_address));
    }
    if (p.successor.empty()) return absl::OkStatus();  // the tail
    update.set_epoch(p.epoch);
    last = SendOnce(p.successor, update, chunks,
                    std::min(deadline, absl::Now() + absl::Seconds(2)));
    last_to = p.successor;
    if (last.ok()) return absl::OkStatus();
    if (absl::Now() >= deadline) break;
    if (!said) {
      std::fprintf(stderr, "ps_server: %s: update %llu not acknowledged by %s (%s); asking the "
                   "coordinator for the chain and retrying for up to %s\n",
                   Name().c_str(), static_cast<unsigned long long>(update.seq()), last_to.c_str(),
                   last.error_message().c_str(),
                   absl::FormatDuration(options_.forward_timeout).c_str());
      said = true;
    }
    if (options_.refresh) options_.refresh();
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Milliseconds(50));
  }
  // The coordinator still lists a successor this replica cannot reach: the chain cannot go
  // on with both. Chain replication assumes members that fail by stopping, so stop: the
  // coordinator then takes this replica out and the chain goes on without it.
  std::fprintf(stderr,
               "ps_server: %s: FATAL: update %llu applied here could not be handed to %s for %s "
               "(%s), while the coordinator keeps it in the chain; stopping so the chain goes "
               "on without this replica (restart it to hold a copy again)\n",
               Name().c_str(), static_cast<unsigned long long>(update.seq()), last_to.c_str(),
               absl::FormatDuration(options_.forward_timeout).c_str(),
               last.error_message().c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

grpc::Status Replicator::Receive(grpc::ServerContext* ctx,
                                 grpc::ServerReader<ReplicatedUpdate>* reader) {
  ReplicatedUpdate update;
  if (!reader->Read(&update)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Replicate carried no update");
  }
  std::vector<std::string> chunks;
  if (update.stream()) {
    for (ReplicatedUpdate c; reader->Read(&c);) {
      if (!c.has_chunk()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "a Replicate stream's later messages must hold only a chunk");
      }
      chunks.push_back(std::move(*c.mutable_chunk()->mutable_data()));
    }
  }
  const uint64_t seq = update.seq();
  const absl::Time deadline =
      std::min(absl::FromChrono(ctx->deadline()), absl::Now() + options_.forward_timeout);
  // The checks a member makes of an update, here and again once it holds the order lock.
  auto check = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    const Place p = PlaceLocked();
    if (update.epoch() < p.epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(), " is at chain epoch ", p.epoch, "; the update comes from epoch ",
          update.epoch(), ": the sender's chain is out of date"));
    }
    if (update.epoch() > p.epoch) {
      return absl::UnavailableError(absl::StrCat(Name(), " is at chain epoch ", p.epoch,
                                                 ", behind the update's ", update.epoch(),
                                                 "; retry once it has caught up"));
    }
    if (!p.in_chain || p.head) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(), " takes no updates from another member in chain epoch ", p.epoch,
          p.head ? " (it is the head)" : " (it is not in the chain)"));
    }
    return absl::OkStatus();
  };
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = check();
    if (s.code() == absl::StatusCode::kUnavailable && options_.refresh) {
      mu_.Unlock();
      options_.refresh();
      mu_.Lock();
      s = check();
    }
    if (!s.ok()) return ToGrpcStatus(s);
    if (seq <= applied_) {  // handed on again after a member failed: it is here already
      mu_.Unlock();
      absl::Status done = AwaitDone(seq, deadline);
      mu_.Lock();
      return ToGrpcStatus(done);
    }
    const int64_t epoch = update.epoch();
    auto turn = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return applied_ + 1 >= seq || config_.epoch != epoch;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline)) {
      return ToGrpcStatus(absl::UnavailableError(
          absl::StrCat(Name(), ": update ", seq, " waited for update ", applied_ + 1,
                       ", which has not arrived")));
    }
  }
  {
    absl::MutexLock order(&apply_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status s = check(); !s.ok()) return ToGrpcStatus(s);
      if (applied_ + 1 != seq) {
        return ToGrpcStatus(absl::UnavailableError(absl::StrCat(
            Name(), ": update ", seq, " is out of turn (", applied_, " applied); retry")));
      }
    }
    absl::Status s = apply_(update, &chunks);
    if (!s.ok()) {
      // The head applied it and this replica cannot: the copies would differ.
      std::fprintf(stderr,
                   "ps_server: %s: FATAL: update %llu, applied by the head, fails here (%s); "
                   "stopping so the chain goes on without this replica\n",
                   Name().c_str(), static_cast<unsigned long long>(seq),
                   std::string(s.message()).c_str());
      std::fflush(stderr);
      std::_Exit(3);
    }
    absl::MutexLock lock(&mu_);
    AppliedLocked(seq, update.request_id());
  }
  absl::Status s = Forward(std::move(update), &chunks);
  if (s.ok()) Done(seq);
  return ToGrpcStatus(s);
}

uint64_t Replicator::applied() const {
  absl::MutexLock lock(&mu_);
  return applied_;
}

}  // namespace pscluster::ps
