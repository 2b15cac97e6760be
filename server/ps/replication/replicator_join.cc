// Replicator: joining a chain (the joiner) and handing a joiner
// the state (the tail).
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/recent_ids.h"
#include "common/status_macros.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/snapshot/snapshot_store.h"
#include "server/ps/snapshot/snapshotter.h"

namespace pscluster::ps {

void Replicator::DropLearner(int32_t replica, int64_t epoch, const grpc::Status& why) {
  absl::MutexLock join(&join_mu_);           // not while JoinedChain appends it
  if (options_.refresh) options_.refresh();  // appended meanwhile? then it is a successor
  absl::MutexLock lock(&mu_);
  if (learner_.replica != replica || learner_.epoch != epoch) return;
  LogWarning("%s: joining replica %d failed an update (%s); it starts over", Name().c_str(),
             replica, why.error_message().c_str());
  learner_ = Learner();
}

absl::Status Replicator::TransferState(const TransferStateRequest& req, const WriteChunk& write) {
  if (capture_ == nullptr || !options_.append) {
    return absl::FailedPreconditionError(Name() + " takes no joining replicas");
  }
  if (req.replica() == options_.replica) {
    return absl::InvalidArgumentError(Name() + ": a replica cannot join itself");
  }
  State state;
  StateTransferChunk first;
  StateTransferStart* start = first.mutable_start();
  RETURN_IF_ERROR(CaptureForJoiner(req, &state, start));
  // Outside the order lock: the fingerprint sorts every sparse table's keys.
  start->set_fingerprint(state.Fingerprint());
  {
    absl::MutexLock lock(&mu_);
    if (learner_.replica == req.replica() && learner_.epoch == req.epoch()) {
      learner_.fingerprint = start->fingerprint();
    }
  }
  for (int32_t w : state.workers) start->add_workers(w);
  start->set_tables(state.images.size());
  LogInfo(
      "ps_server: %s: handing replica %d the state at update %llu (%zu tables) and "
      "every update from now on",
      Name().c_str(), req.replica(), static_cast<unsigned long long>(start->seq()),
      state.images.size());
  if (!write(first) || !SendState(state, write)) {
    DropLearner(req.replica(), req.epoch(),
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "the state transfer broke off"));
    return absl::UnavailableError("the joiner stopped reading the state");
  }
  return absl::OkStatus();
}

absl::Status Replicator::CaptureForJoiner(const TransferStateRequest& req, State* state,
                                          StateTransferStart* start) {
  // The state at a moment no BSP step is half pushed: between steps, while no update
  // applies (the order lock), retried until such a moment comes.
  const absl::Time give_up = absl::Now() + options_.forward_timeout;
  for (absl::Status busy;;) {
    {
      absl::MutexLock order(log_.order());
      {
        absl::MutexLock lock(&mu_);
        const Place p = PlaceLocked();
        if (!p.tail || req.epoch() != p.epoch) {
          return absl::FailedPreconditionError(absl::StrCat(
              Name(), " is not the tail of chain epoch ", req.epoch(), " (it is at epoch ", p.epoch,
              p.tail ? ", the tail" : ", not the tail", "): read the chain again"));
        }
      }
      absl::StatusOr<State> captured = capture_();
      if (captured.ok()) {
        *state = *std::move(captured);
        absl::MutexLock lock(&mu_);
        start->set_seq(log_.applied());
        log_.ForEachId([&](const std::string& id, uint64_t seq) {
          start->add_request_ids(id);
          start->add_request_seqs(seq);
        });
        learner_ = {req.replica(), req.address(), config_.epoch};
        return absl::OkStatus();
      }
      if (!absl::IsUnavailable(captured.status())) return captured.status();
      busy = captured.status();
    }
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(
          absl::StrCat(Name(), ": no moment between steps to copy the state within ",
                       absl::FormatDuration(options_.forward_timeout), " (", busy.message(), ")"));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

uint32_t Replicator::State::Fingerprint() const {
  std::vector<std::pair<uint32_t, uint32_t>> tables;
  for (const std::unique_ptr<TableImage>& image : images) {
    tables.emplace_back(image->header.spec().table_id(), Table::FingerprintOf(*image));
  }
  return Shard::CombineFingerprints(workers, tables);
}

bool Replicator::SendState(const State& state, const WriteChunk& write) {
  StateTransferChunk chunk;
  for (const std::unique_ptr<TableImage>& image : state.images) {
    chunk.set_header(image->header.SerializeAsString());
    if (!write(chunk)) return false;
    absl::Status emitted = EmitBlocks(*image, [&](const std::string& block) {
      chunk.set_block(block);
      return write(chunk) ? absl::OkStatus() : absl::UnavailableError("the joiner stopped reading");
    });
    if (!emitted.ok()) return false;
  }
  return true;
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
    if (const std::optional<uint32_t> handed = learner_.fingerprint;
        !handed || req->state_fingerprint() != *handed) {
      learner_ = Learner();  // what it holds is not what it was handed: it starts over
      return ToGrpcStatus(absl::FailedPreconditionError(
          absl::StrCat(Name(), ": replica ", req->replica(), " installed a state of fingerprint ",
                       req->state_fingerprint(), ", not the one handed to it (",
                       handed ? absl::StrCat(*handed) : std::string("none yet"),
                       "); it is not added to the chain: start the transfer again")));
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
    LogInfo("%s: outside its chain (epoch %lld); joining it from the tail, %s", Name().c_str(),
            static_cast<long long>(c.epoch), c.addresses.back().c_str());
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
      LogInfo("%s: joined its chain", Name().c_str());
    } else {
      LogWarning("%s: joining its chain failed (%s); trying again", Name().c_str(),
                 std::string(joined.status().message()).c_str());
    }
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
  SignCall(&ctx);
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
  absl::Status loaded = ReadState(reader.get(), start, staged.get());
  if (!loaded.ok()) ctx.TryCancel();
  // (A stream the tail broke off fails ReadState's last checks: the tail says why.)
  grpc::Status finished = reader->Finish();
  if (!finished.ok() && finished.error_code() != grpc::StatusCode::CANCELLED)
    loaded = absl::OkStatus();
  RETURN_IF_ERROR(loaded);
  if (!finished.ok()) return FromGrpcStatus(finished, absl::StrCat("the tail ", tail));
  const uint32_t fingerprint = staged->Fingerprint();
  if (fingerprint != start.fingerprint()) {
    return absl::DataLossError(absl::StrCat("the state read from the tail ", tail,
                                            " has fingerprint ", fingerprint, ", not the ",
                                            start.fingerprint(), " the tail sent: not installed"));
  }
  RETURN_IF_ERROR(InstallState(std::move(staged), start));
  grpc::ClientContext joined_ctx;
  joined_ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.forward_timeout));
  SignCall(&joined_ctx);
  JoinedChainRequest joined;
  joined.set_replica(options_.replica);
  joined.set_epoch(epoch);
  joined.set_state_fingerprint(fingerprint);
  JoinedChainResponse resp;
  RETURN_IF_ERROR(FromGrpcStatus(StubFor(tail)->JoinedChain(&joined_ctx, joined, &resp),
                                 absl::StrCat("the tail ", tail)));
  return resp.epoch();
}

absl::Status Replicator::ReadState(grpc::ClientReaderInterface<StateTransferChunk>* reader,
                                   const StateTransferStart& start, Shard* staged) {
  ShardLoader loader(staged);
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
  for (StateTransferChunk chunk; reader->Read(&chunk);) {
    if (chunk.has_header()) {
      RETURN_IF_ERROR(table_done());
      if (!header.ParseFromString(chunk.header())) {
        return absl::DataLossError("state transfer: a table header does not parse");
      }
      ++tables;
      dense_at = 0;
      RETURN_IF_ERROR(loader.Header(header));
    } else if (chunk.has_block() && tables > 0) {
      RETURN_IF_ERROR(VisitBlock(header, chunk.block().data(), chunk.block().size(), &dense_at,
                                 &loader, "state transfer"));
    } else {
      return absl::DataLossError("state transfer: a block before any table header");
    }
  }
  RETURN_IF_ERROR(table_done());
  if (tables != start.tables()) {
    return absl::DataLossError(
        absl::StrCat("state transfer: ", tables, " of ", start.tables(), " tables came"));
  }
  staged->RestoreWorkers({start.workers().begin(), start.workers().end()});
  return absl::OkStatus();
}

absl::Status Replicator::InstallState(std::unique_ptr<Shard> staged,
                                      const StateTransferStart& start) {
  {
    absl::WriterMutexLock serving(serving_);  // no call uses the tables meanwhile
    absl::MutexLock order(log_.order());
    const uint32_t tables = start.tables();
    RETURN_IF_ERROR(install_(std::move(staged)));
    absl::MutexLock lock(&mu_);
    log_.Reset(start.seq(), [&](RecentIds<uint64_t>* ids) {
      for (int i = 0; i < start.request_ids_size() && i < start.request_seqs_size(); ++i) {
        if (!start.request_ids(i).empty()) ids->Set(start.request_ids(i), start.request_seqs(i));
      }
    });
    LogInfo("%s: installed the state at update %llu (%u tables)", Name().c_str(),
            static_cast<unsigned long long>(start.seq()), tables);
  }
  return absl::OkStatus();
}

}  // namespace pscluster::ps
