// Trainer: surviving a failed shard or worker (see trainer.h): wait for the healed view,
// agree on the newest complete checkpoint with the others, roll back and resume.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cluster_view.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/modes/trainer.h"

namespace pscluster::modes {
namespace {

// How long a rollback waits on another worker between two looks at the cluster.
constexpr absl::Duration kRollbackSlice = absl::Seconds(2);

}  // namespace

Mode RollbackMode(const coord::ClusterView& view, int64_t step) {
  return coord::ModeAt(view, step - 1);
}

void RecordSwitch(std::vector<SwitchDone>* switches, SwitchDone done) {
  switches->erase(std::remove_if(switches->begin(), switches->end(),
                                 [&](const SwitchDone& s) { return s.step >= done.step; }),
                  switches->end());
  switches->push_back(std::move(done));
}

namespace {

// --bucket_mb as the shortest decimal that BucketBytes turns into the same bytes, so that a
// refusal shows the value given (0.1, not 0.0999994). 17 digits always round-trip.
std::string BucketMb(size_t bytes) {
  std::string mb;
  for (int digits = 1; digits <= 17; ++digits) {
    mb = absl::StrFormat("%.*g", digits, bytes / double{1 << 20});
    if (BucketBytes(std::strtod(mb.c_str(), nullptr)) == bytes) break;
  }
  return mb;
}

// The training flags every worker of a run must share beyond what the tables' specs hold
// (the model's sizes, the optimizer, the consistency), as "--name=value" words.
std::vector<std::string> SharedFlags(const TrainerOptions& o) {
  return {absl::StrCat("--batch_size=", o.batch_size), absl::StrCat("--epochs=", o.epochs),
          absl::StrCat("--max_steps=", o.max_steps), absl::StrCat("--seed=", o.seed),
          absl::StrCat("--micro_batches=", o.micro_batches),
          // ALLREDUCE's buckets and FSDP's gathers: ranks that differ make other collective
          // calls, which may have the same sizes and sum floats of different tensors.
          absl::StrCat("--bucket_mb=", BucketMb(o.bucket_bytes)),
          absl::StrCat("--fsdp_reshard_after_forward=",
                       o.fsdp_reshard_after_forward ? "true" : "false"),
          absl::StrCat("--lr=", o.optimizer.learning_rate()),
          absl::StrCat("--lr_decay=", o.lr_decay)};
}

// The coordinator's ABORTED (that generation is over) as a peer's failure: the rollback
// starts over in the new generation.
absl::Status Superseded(absl::Status s) {
  if (!absl::IsAborted(s)) return s;
  return absl::UnavailableError(s.message());
}

}  // namespace

// Rank 0 records its shared flags; every other worker, and a rank 0 that replaces a failed
// one, compares its own with the record (in `now`, or waited for): a run whose workers
// differ (batch sizes summed unweighted, other data splits) is refused, naming the flags.
absl::Status Trainer::CheckSameFlags(const coord::ClusterView& now) {
  const std::vector<std::string> mine = SharedFlags(options_);
  if (options_.rank == 0 && !now.run().started()) {
    return options_.coordinator->RecordRun(mine, false);
  }
  coord::ClusterView v = now;
  if (v.run().flags().empty()) {
    ASSIGN_OR_RETURN(
        v,
        AwaitRecovery([](const coord::ClusterView& v) { return !v.run().flags().empty(); },
                      [](const coord::ClusterView&) { return "worker rank 0 to record its flags"; },
                      options_.rpc_timeout, /*check_liveness=*/false));
  }
  std::vector<std::string> differ;
  for (const std::string& w : mine) {
    if (std::find(v.run().flags().begin(), v.run().flags().end(), w) == v.run().flags().end()) {
      differ.push_back(w);
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("worker ", options_.rank, " was started with ", absl::StrJoin(differ, " "),
                   " but the run's rank 0 with ", absl::StrJoin(v.run().flags(), " "),
                   ": start every worker with the same flags"));
}

absl::StatusOr<int64_t> Trainer::Start() {
  CoordinatorClient* c = options_.coordinator;
  if (c != nullptr) {
    // A worker that replaces a failed one finds the run started: it joins the rollback.
    ASSIGN_OR_RETURN(const coord::ClusterView now, c->AwaitView(0, false, options_.rpc_timeout));
    RETURN_IF_ERROR(CheckSameFlags(now));
    if (now.run().started()) {
      absl::StatusOr<int64_t> back_to = Rejoin(Generation(view_));
      if (back_to.ok() || !PeerFailure(back_to.status())) return back_to;
      return Recover(std::nullopt, back_to.status());  // the cluster changed meanwhile
    }
  }
  if (options_.connect) {
    RETURN_IF_ERROR(ConnectCommunicator(coord::RendezvousPrefix(Generation(view_))));
  }
  ASSIGN_OR_RETURN(placement_, MakePlacement(options_.mode, Context()));
  if (options_.mode != coord::PS) {  // the PS tables start from the same initializers
    RETURN_IF_ERROR(placement_->Load(InitialState(model_->spec(), *optimizer_), 0));
  }
  if (c != nullptr && options_.rank == 0) {
    // A checkpoint of the initial state, before any step: a failure at any later moment
    // can roll back at least to the start (BSP shards hold step 0 for it).
    if (client_ != nullptr) {
      auto taken = c->Checkpoint(std::nullopt, options_.rpc_timeout);
      if (taken.ok()) {
        LogInfo("worker 0: checkpoint of the initial state (step %lld) taken",
                static_cast<long long>(taken->step()));
      } else {
        LogInfo(
            "worker 0: no checkpoint of the initial state (%s); a failure before the "
            "first later checkpoint cannot be rolled back",
            taken.status().ToString().c_str());
      }
    }
    absl::Status marked = c->RecordRun(SharedFlags(options_), /*started=*/true);
    // NOT_FOUND: this worker registered again meanwhile (the coordinator restarted and
    // lost it), a new generation: it rolls back with the others, and marks the start then.
    if (absl::IsNotFound(marked)) return Recover(0, marked);
    RETURN_IF_ERROR(marked);
  }
  return 0;
}

absl::StatusOr<int64_t> Trainer::Rejoin(const std::string& gen) {
  CoordinatorClient* c = options_.coordinator;
  placement_.reset();
  comm_.reset();
  RETURN_IF_ERROR(Superseded(c->ReportStopped(gen).status()));
  if (!view_.shard_addresses().empty()) {
    RETURN_IF_ERROR(Connect({view_.shard_addresses().begin(), view_.shard_addresses().end()}));
  }
  int64_t back_to = 0;
  if (options_.rank == 0) {  // once every worker has stopped, roll every shard back
    ASSIGN_OR_RETURN(back_to, RollBackShards(gen));
    RETURN_IF_ERROR(Superseded(c->DecideRollback(gen, back_to).status()));
    // A start interrupted before rank 0 marked it (Start) is marked now; else a no-op.
    RETURN_IF_ERROR(c->RecordRun(SharedFlags(options_), /*started=*/true));
  } else {
    ASSIGN_OR_RETURN(
        const coord::ClusterView v,
        AwaitRecovery(
            [&](const coord::ClusterView& v) {
              return v.rollback().generation() == gen && v.rollback().decided();
            },
            [](const coord::ClusterView&) { return "worker rank 0 to pick the checkpoint"; },
            options_.recovery_timeout, /*check_liveness=*/true));
    back_to = v.rollback().step();
  }
  if (options_.connect) {
    RETURN_IF_ERROR(ConnectCommunicator(coord::RendezvousPrefix(gen)));
  }
  // The mode the cluster trained the checkpoint's step in (every worker reads the same
  // switch history); the switches after it are replayed as the steps come round again.
  const Mode mode = RollbackMode(view_, back_to);
  ASSIGN_OR_RETURN(placement_, MakePlacement(mode, Context()));
  if (mode != coord::PS) {
    ASSIGN_OR_RETURN(auto from_shards, MakePlacement(coord::PS, Context()));
    ASSIGN_OR_RETURN(ModelState state, from_shards->Gather(back_to, /*with_slots=*/true));
    RETURN_IF_ERROR(placement_->Load(state, back_to));
  }
  return back_to;
}

absl::StatusOr<int64_t> Trainer::RollBackShards(const std::string& gen) {
  const int world = options_.world;
  RETURN_IF_ERROR(AwaitRecovery(
                      [&](const coord::ClusterView& v) {
                        return v.rollback().generation() == gen &&
                               coord::RanksNotStopped(v.rollback(), world).empty();
                      },
                      [&](const coord::ClusterView& v) {
                        return absl::StrCat(
                            "worker ranks ",
                            absl::StrJoin(coord::RanksNotStopped(v.rollback(), world), ", "),
                            " to stop");
                      },
                      options_.recovery_timeout, /*check_liveness=*/true)
                      .status());
  if (client_ == nullptr) {
    return absl::FailedPreconditionError(
        "no checkpoint to roll back to: this cluster has no shards (start it with shards and "
        "a coordinator --data_dir to survive a worker failure)");
  }
  // The coordinator's manifest is the one list of complete checkpoints.
  ASSIGN_OR_RETURN(const coord::ClusterView now,
                   options_.coordinator->AwaitView(0, false, options_.rpc_timeout));
  if (now.checkpoints().empty()) {
    return absl::FailedPreconditionError(
        "no checkpoint to roll back to: the coordinator lists none; run with "
        "--snapshot_every_epochs or a coordinator --checkpoint_every_steps");
  }
  // The newest checkpoint every shard can restore: one a shard lost its part of (a file
  // deleted or damaged, a disk replaced) is skipped, said, for the one before it.
  // Snapshots after it are of the timeline the failure ended (a checkpoint some shards
  // wrote before it): gone, so the resumed run's checkpoints of those steps are its own.
  absl::Status restored;
  int64_t back_to = 0;
  for (auto it = now.checkpoints().rbegin(); it != now.checkpoints().rend(); ++it) {
    back_to = it->step();
    restored = client_->Restore(back_to, /*drop_later=*/true);
    if (restored.ok() || !(absl::IsNotFound(restored) || absl::IsDataLoss(restored))) break;
    LogInfo("worker 0: the checkpoint of step %lld cannot be restored (%s)%s",
            static_cast<long long>(back_to), restored.ToString().c_str(),
            std::next(it) == now.checkpoints().rend() ? "" : "; trying the one before it");
  }
  RETURN_IF_ERROR(restored);
  return back_to;
}

absl::StatusOr<coord::ClusterView> Trainer::AwaitRecovery(
    const std::function<bool(const coord::ClusterView&)>& ready,
    const std::function<std::string(const coord::ClusterView&)>& waited_for, absl::Duration timeout,
    bool check_liveness) {
  CoordinatorClient* c = options_.coordinator;
  const absl::Time end = absl::Now() + timeout;
  ASSIGN_OR_RETURN(coord::ClusterView v, c->AwaitView(0, false, options_.rpc_timeout));
  while (!ready(v)) {
    // Each look blocks until the view's next change (a report, a decision, a failure).
    const absl::Duration slice = std::min(kRollbackSlice, end - absl::Now());
    absl::StatusOr<coord::ClusterView> next = c->AwaitView(v.version() + 1, false, slice);
    if (next.ok()) {
      v = *std::move(next);
      continue;
    }
    if (!absl::IsDeadlineExceeded(next.status())) return next.status();
    if (absl::Now() >= end) {
      return absl::DeadlineExceededError(absl::StrCat(
          "waited ", absl::FormatDuration(timeout), " for ", waited_for(v),
          " (the coordinator's view, version ", v.version(), "); is that worker running?"));
    }
    if (check_liveness) RETURN_IF_ERROR(CheckLiveness());
  }
  return v;
}

absl::StatusOr<coord::ClusterView> Trainer::AwaitHealedView() {
  const std::string before = Generation(view_);
  const absl::Time deadline = absl::Now() + options_.recovery_timeout;
  // A failure no member's death explains (every member alive, the generation unchanged, for
  // longer than the coordinator takes to declare one dead): this worker starts a new
  // generation itself, in which every worker rolls back.
  const absl::Duration quiet = 2 * options_.coordinator->heartbeat_timeout() + kWaitSlice;
  absl::Time start_one_at = absl::Now() + quiet;
  bool started_one = false;
  int64_t version = view_.version();
  std::set<std::pair<int, int>> named;  // members already reported down
  while (true) {                        // each AwaitView blocks until the next change of the view
    const absl::Time until = started_one ? deadline : std::min(deadline, start_one_at);
    absl::StatusOr<coord::ClusterView> next =
        options_.coordinator->AwaitView(version + 1, false, until - absl::Now());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("waited ", absl::FormatDuration(options_.recovery_timeout),
                       " for the cluster to be whole again (the members named down above were not "
                       "replaced: start them again, or raise the recovery timeout)"));
    }
    if (!started_one && absl::Now() >= start_one_at && absl::IsDeadlineExceeded(next.status())) {
      if (absl::Status s = StartGenerationIfWhole(before); s.ok()) {
        started_one = true;
      } else {  // the coordinator did not answer, say: the next quiet spell tries again
        start_one_at = absl::Now() + quiet;
        LogInfo("worker %d: could not start a new generation (%s); trying again in %s",
                options_.rank, s.ToString().c_str(), absl::FormatDuration(quiet).c_str());
      }
      continue;
    }
    if (!next.ok()) return next.status();
    const coord::ClusterView& v = *next;
    for (const auto& m : v.members()) {  // name what failed, as the coordinator saw it
      if (m.alive() || (m.role() == coord::SHARD && coord::ShardHolds(v, m.id())) ||
          !named.insert({m.role(), m.id()}).second) {
        continue;
      }
      LogInfo("worker %d: %s %d is down (its heartbeats stopped); waiting for a replacement",
              options_.rank, m.role() == coord::SHARD ? "shard" : "worker rank", m.id());
    }
    if (v.complete() && Generation(v) != before) return v;
    version = v.version();
  }
}

absl::Status Trainer::StartGenerationIfWhole(const std::string& before) {
  ASSIGN_OR_RETURN(const coord::ClusterView now,
                   options_.coordinator->AwaitView(0, false, options_.rpc_timeout));
  if (!now.complete() || Generation(now) != before) return absl::OkStatus();  // it is changing
  LogInfo(
      "worker %d: every member is alive and none was declared dead: registering again, so "
      "that every worker rolls back to the newest checkpoint in a new generation",
      options_.rank);
  return options_.coordinator->RegisterAgain().status();
}

absl::StatusOr<int64_t> Trainer::Recover(std::optional<int64_t> failed_step, absl::Status cause) {
  const absl::Time end = absl::Now() + options_.recovery_timeout;
  while (true) {
    if (failed_step) {
      LogInfo("worker %d: step %lld failed (%s); waiting for the cluster to be whole again",
              options_.rank, static_cast<long long>(*failed_step), cause.ToString().c_str());
    } else {
      LogInfo(
          "worker %d: the rollback it joined was interrupted (%s); waiting for the "
          "cluster to be whole again",
          options_.rank, cause.ToString().c_str());
    }
    ASSIGN_OR_RETURN(view_, AwaitHealedView());
    placement_.reset();
    absl::StatusOr<int64_t> back_to = Rejoin(Generation(view_));
    if (back_to.ok()) {
      known_.reset();  // the switches from the checkpoint on are asked for again
      if (failed_step) {
        LogInfo("worker %d: rolled back from step %lld to the checkpoint of step %lld",
                options_.rank, static_cast<long long>(*failed_step),
                static_cast<long long>(*back_to));
      }
      return back_to;
    }
    // A member failed or came back (again) before the rollback was agreed: start over in
    // the newer generation, as the others do.
    if (!(PeerFailure(back_to.status()) || DeclaredDead()) || absl::Now() >= end) {
      return back_to.status();
    }
    cause = back_to.status();
  }
}

}  // namespace pscluster::modes
