#include "server/coordinator/checkpointer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps/ps_client.h"
#include "common/atomic_file.h"
#include "common/cluster_view.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pscluster::coord {
namespace {

// Rank 0 when it has reported a validation metric (the checkpoints' metric), else null.
const Member* MeasuringRankZero(const ClusterView& view) {
  for (const Member& m : view.members()) {
    if (m.role() == WORKER && m.id() == 0 && m.has_metric()) return &m;
  }
  return nullptr;
}

// Rank 0's validation metric when it was measured at `step`.
std::optional<double> MetricMeasuredAt(const ClusterView& view, int64_t step) {
  const Member* m = MeasuringRankZero(view);
  if (m == nullptr || m->metric_step() != step) return std::nullopt;
  return m->metric();
}

// The code of a shard's SnapshotStatus.last_error ("RESOURCE_EXHAUSTED: ...", as
// absl::Status::ToString writes it), so that a full or read-only disk reaches psctl as what
// it is; INTERNAL when it names none.
absl::StatusCode ErrorCode(const std::string& error) {
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StartsWith(error, absl::StrCat(absl::StatusCodeToString(code), ":"))) return code;
  }
  return absl::StatusCode::kInternal;
}

namespace fs = std::filesystem;

std::string ManifestPath(const std::string& dir) {
  return (fs::path(dir) / "manifest.pb").string();
}

// A client of the view's shards; with replicas, of each chain, head first, so a call
// follows a failover as the workers' do.
PsClientOptions ShardsOf(const ClusterView& view, const CheckpointerOptions& options) {
  PsClientOptions o;
  o.shard_addresses.assign(view.shard_addresses().begin(), view.shard_addresses().end());
  if (view.replicas() > 1) {
    for (const Chain& chain : view.chains()) {
      o.shard_replicas.emplace_back(chain.addresses().begin(), chain.addresses().end());
    }
  }
  o.worker_id = -1;
  o.rpc_timeout = options.timeout;
  o.security = options.security;
  return o;
}

// A failover's new chain, from the coordinator's own view (nothing to report: the
// liveness timeout and the workers' reports take dead replicas out).
std::function<absl::StatusOr<std::vector<std::string>>(int, const std::string&)> FollowChains(
    ClusterState* cluster, const ClusterView& view) {
  return
      [cluster, view](int shard, const std::string&) -> absl::StatusOr<std::vector<std::string>> {
        const ClusterView now = cluster->View();
        RETURN_IF_ERROR(StillSameCluster(view, now));
        return ChainAddresses(now, shard);
      };
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(ClusterState* cluster,
                                                                   CheckpointerOptions options) {
  std::unique_ptr<Checkpointer> c(new Checkpointer(cluster, std::move(options)));
  if (c->options_.data_dir.empty()) return c;
  std::error_code ec;
  fs::create_directories(c->options_.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create --data_dir=", c->options_.data_dir, ": ", ec.message()));
  }
  absl::MutexLock lock(&c->mu_);
  std::ifstream in(ManifestPath(c->options_.data_dir), std::ios::binary);
  if (in) {
    CheckpointManifest manifest;
    if (!manifest.ParseFromIstream(&in)) {
      return absl::DataLossError(absl::StrCat(ManifestPath(c->options_.data_dir),
                                              " is unreadable; move it away to start afresh"));
    }
    c->checkpoints_.assign(manifest.checkpoints().begin(), manifest.checkpoints().end());
    cluster->SetCheckpoints(c->checkpoints_);
  }
  return c;
}

Checkpointer::Checkpointer(ClusterState* cluster, CheckpointerOptions options)
    : cluster_(cluster), options_(std::move(options)) {}

bool Checkpointer::Better(double a, double b) const {
  return options_.higher_metric_is_better ? a > b : a < b;
}

std::vector<Checkpoint> Checkpointer::checkpoints() const {
  absl::MutexLock lock(&mu_);
  return checkpoints_;
}

absl::Status Checkpointer::MaybeCheckpoint() {
  absl::MutexLock lock(&mu_);
  const ClusterView view = cluster_->View();
  RETURN_IF_ERROR(TakeMetricLocked(view));
  if (!view.complete()) return absl::OkStatus();
  // In the collective modes the shards hold the state only when the workers hand it over:
  // they do at the multiples of every_steps (ClusterView) and ask for the checkpoint then.
  const bool due = options_.every_steps > 0 && view.mode() == PS &&
                   view.global_step() >= (checkpoints_.empty() ? 0 : checkpoints_.back().step()) +
                                             options_.every_steps;
  if (!due) return absl::OkStatus();
  return CheckpointLocked(std::nullopt).status();
}

absl::Status Checkpointer::TakeMetricLocked(const ClusterView& view) {
  const Member* m = MeasuringRankZero(view);
  if (m == nullptr || m->metric_step() == metric_step_seen_) return absl::OkStatus();
  const int64_t step = m->metric_step();
  const double metric = m->metric();
  // Measured on the parameters of its step: filed under the checkpoint of that step (rank 0
  // asks for one at each epoch's end, before it evaluates), best or not, never under a later
  // step's. Filing takes no snapshot, so it needs no complete cluster: the run's last metric
  // comes after the other workers finished and left (it was dropped, and the final
  // checkpoint never carried the final accuracy).
  if (std::any_of(checkpoints_.begin(), checkpoints_.end(),
                  [&](const Checkpoint& c) { return c.step() == step; })) {
    metric_step_seen_ = step;
    return FileMetricLocked(step, metric);
  }
  if (!view.complete()) return absl::OkStatus();  // taken once the cluster is whole again
  metric_step_seen_ = step;
  const bool best = std::all_of(checkpoints_.begin(), checkpoints_.end(), [&](const Checkpoint& c) {
    return !c.has_metric() || Better(metric, c.metric());
  });
  if (!best) return absl::OkStatus();
  absl::StatusOr<Checkpoint> taken = CheckpointLocked(metric, step);
  if (!taken.ok()) {
    LogInfo("the metric %g of step %lld is filed under no checkpoint: %s", metric,
            static_cast<long long>(step), taken.status().ToString().c_str());
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::FileMetricLocked(int64_t step, double metric) {
  std::vector<Checkpoint> all = checkpoints_;
  for (Checkpoint& c : all) {
    if (c.step() != step) continue;
    c.set_has_metric(true);
    c.set_metric(metric);
  }
  checkpoints_ = Retain(std::move(all));
  RETURN_IF_ERROR(WriteManifest());
  cluster_->SetCheckpoints(checkpoints_);
  LogInfo("checkpoint of step %lld filed with metric %g", static_cast<long long>(step), metric);
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> Checkpointer::CheckpointNow(std::optional<double> metric) {
  absl::MutexLock lock(&mu_);
  return CheckpointLocked(metric);
}

absl::StatusOr<Checkpoint> Checkpointer::CheckpointLocked(std::optional<double> metric,
                                                          std::optional<int64_t> at) {
  const ClusterView view = cluster_->View();
  if (!view.complete()) {
    return absl::FailedPreconditionError(
        "the cluster is incomplete (psctl status names who is missing); no checkpoint taken");
  }
  PsClientOptions shard_options = ShardsOf(view, options_);
  // A capture waits in a shard for a BSP step, in slices: it ends once a worker the step may
  // wait for is gone (declared dead, or come back), and the workers roll back instead.
  shard_options.wait_check = [this, view] { return StillSameCluster(view, cluster_->View()); };
  if (view.replicas() > 1) shard_options.resolve_chain = FollowChains(cluster_, view);
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> shards, PsClient::Create(shard_options));
  int64_t step = -1;
  ASSIGN_OR_RETURN(std::optional<Checkpoint> earlier,
                   SnapshotShards(view, shards.get(), at, &metric, &step));
  if (earlier) return *earlier;
  return File(view, shards.get(), step, metric);
}

// Snapshot the step the tables have reached, when they stand still (a worker waits on
// this checkpointer: rank 0 reporting its metric or asking for a checkpoint; the run
// stopped). BSP tables may pass it before the request lands, and then some shards capture
// and others refuse: wait for those writes to end and ask again. Passed twice, the run
// goes on without us (psctl checkpoint during training): aim ahead, at a step the tables
// will reach, further each time they pass it first; not with a metric, measured on the
// step reached. An ahead capture waits for pushes: if what moved the tables stops (the
// run ends, or rank 0 now waits on this checkpointer and cannot push them) it gives up
// after kAheadWait, and the tables, standing still, are taken where they are. (Ahead
// captures were the only kind once: a 10 s stall at epoch ends, seen by the red team.)
absl::StatusOr<std::optional<Checkpoint>> Checkpointer::SnapshotShards(
    const ClusterView& view, PsClient* shards, std::optional<int64_t> at,
    std::optional<double>* metric, int64_t* step) {
  constexpr absl::Duration kAheadWait = absl::Seconds(2);
  std::unique_ptr<PsClient> soon;  // the ahead captures' calls, deadline kAheadWait
  int64_t ahead = 0;               // steps past the reached one this attempt aims at
  absl::Status s;
  for (int attempt = 0; attempt < (at ? 1 : 8); ++attempt) {
    RETURN_IF_ERROR(shards->SnapshotStatus(/*wait_until_idle=*/true).status());
    ASSIGN_OR_RETURN(std::optional<Checkpoint> earlier,
                     ChooseStep(shards, at, ahead, *metric, step));
    if (earlier) return earlier;
    const ps::SnapshotRequest request = RequestFor(view, *step, metric);
    if (ahead > 0 && soon == nullptr) {
      PsClientOptions o = ShardsOf(view, options_);
      o.rpc_timeout = std::min(o.rpc_timeout, kAheadWait);
      ASSIGN_OR_RETURN(soon, PsClient::Create(o));
    }
    s = (ahead > 0 ? soon.get() : shards)->Snapshot(*step, request);
    if (s.ok() || s.code() == absl::StatusCode::kAlreadyExists) return std::nullopt;
    if (s.code() == absl::StatusCode::kUnavailable) {  // a member is gone, or a shard is
      return absl::Status(s.code(),
                          absl::StrCat("checkpoint of step ", *step, " abandoned: ", s.message()));
    }
    // Passed before the request landed (twice: further ahead), or an ahead capture waited in
    // vain (the tables stand still now).
    const bool passed = s.code() == absl::StatusCode::kFailedPrecondition;
    ahead = passed && attempt >= 1 && !*metric ? std::max<int64_t>(2, 2 * ahead) : 0;
  }
  return s;
}

absl::StatusOr<std::optional<Checkpoint>> Checkpointer::ChooseStep(PsClient* shards,
                                                                   std::optional<int64_t> at,
                                                                   int64_t ahead,
                                                                   std::optional<double> metric,
                                                                   int64_t* step) {
  if (at) {
    *step = *at;
    if (!checkpoints_.empty() && *step <= checkpoints_.back().step()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", *step, " is not after the newest checkpoint's, ", checkpoints_.back().step()));
    }
    return std::nullopt;
  }
  ASSIGN_OR_RETURN(const int64_t reached, shards->CheckpointStep());
  *step = reached + ahead;
  if (checkpoints_.empty() || *step > checkpoints_.back().step()) return std::nullopt;
  Checkpoint& newest = checkpoints_.back();
  if (metric && *step == newest.step()) {  // measured at its step: filed under it
    newest.set_has_metric(true);
    newest.set_metric(*metric);
    RETURN_IF_ERROR(WriteManifest());
    cluster_->SetCheckpoints(checkpoints_);
  }
  Checkpoint answer = newest;
  answer.set_earlier(true);
  return answer;
}

ps::SnapshotRequest Checkpointer::RequestFor(const ClusterView& view, int64_t step,
                                             std::optional<double>* metric) {
  ps::SnapshotRequest request;
  // A step rank 0 has measured already carries its metric, best or not (its report came
  // before the checkpoint: the final one never carried the run's final accuracy).
  if (!*metric) *metric = MetricMeasuredAt(view, step);
  if (*metric) {
    request.set_has_metric(true);
    request.set_metric(**metric);
  }
  // Our retention, decided before the shards write: they keep exactly what we will list.
  for (const Checkpoint& c : Retained(step, *metric)) request.add_keep_steps(c.step());
  return request;
}

absl::StatusOr<Checkpoint> Checkpointer::File(const ClusterView& view, PsClient* shards,
                                              int64_t step, std::optional<double> metric) {
  ASSIGN_OR_RETURN(auto done, shards->SnapshotStatus(/*wait_until_idle=*/true));
  for (size_t i = 0; i < done.size(); ++i) {
    const ps::SnapshotStatusResponse& d = done[i];
    if (d.last_complete_step() < step || !d.last_error().empty()) {
      return absl::Status(ErrorCode(d.last_error()),
                          absl::StrCat("checkpoint of step ", step, " failed on shard ", i, " (",
                                       view.shard_addresses(i), "): ",
                                       d.last_error().empty() ? "not written" : d.last_error()));
    }
  }
  checkpoints_ = Retained(step, metric);
  Checkpoint& c = checkpoints_.back();  // the new one: retention always keeps the newest
  c.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  RETURN_IF_ERROR(WriteManifest());
  cluster_->SetCheckpoints(checkpoints_);
  LogInfo("checkpoint of step %lld complete on %d shard(s)%s", static_cast<long long>(step),
          shards->num_shards(), metric ? absl::StrCat(", metric ", *metric).c_str() : "");
  return c;
}

absl::Status Checkpointer::RefuseUnderActiveClients(PsClient& shards,
                                                    const std::string& client_id) {
  // Every client's calls but the caller's: the live ps_workers refused the restore already,
  // and those that ended (or died) ended their calls then. A client without an id (psctl,
  // an older client) names no calls of its own.
  std::vector<std::string> except;
  if (!client_id.empty()) except.push_back(client_id);
  ASSIGN_OR_RETURN(std::vector<ps::StatsResponse> stats, shards.Stats(except));
  struct Active {
    int64_t idle_ms;
    int calls;
  };
  std::map<int32_t, Active> active;  // worker -> least idle ms and most calls over the shards
  for (const ps::StatsResponse& s : stats) {
    for (const ps::WorkerClock& w : s.workers()) {
      if (w.idle_ms() < 0 || w.idle_ms() >= absl::ToInt64Milliseconds(options_.client_active)) {
        continue;
      }
      auto [it, added] = active.emplace(w.worker_id(), Active{w.idle_ms(), w.calls()});
      if (!added) {
        it->second.idle_ms = std::min(it->second.idle_ms, w.idle_ms());
        it->second.calls = std::max(it->second.calls, w.calls());
      }
    }
  }
  if (active.empty()) return absl::OkStatus();
  constexpr size_t kNamed = 8;  // the error stays well within gRPC's metadata limit
  std::vector<std::string> named;
  for (const auto& [w, a] : active) {
    if (named.size() == kNamed) {
      named.push_back(absl::StrCat("and ", active.size() - kNamed, " more"));
      break;
    }
    named.push_back(a.calls > 0 ? absl::StrCat("worker ", w, " (", a.calls, " call(s) now)")
                                : absl::StrCat("worker ", w, " (", a.idle_ms, " ms ago)"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "other clients push and pull as ", absl::StrJoin(named, ", "),
      " (Python workers, or ps_workers that just ended): rolling the tables back under them "
      "would mix two runs. Stop them first (then wait ",
      absl::ToInt64Milliseconds(options_.client_active),
      " ms), or force it (psctl restore --force)"));
}

absl::StatusOr<Checkpoint> Checkpointer::Restore(int64_t step, bool force,
                                                 const std::string& client_id,
                                                 absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(checkpoints_.begin(), checkpoints_.end(),
                         [&](const Checkpoint& c) { return c.step() == step; });
  if (it == checkpoints_.end()) {
    std::vector<int64_t> steps;
    for (const Checkpoint& c : checkpoints_) steps.push_back(c.step());
    return absl::NotFoundError(absl::StrCat("no checkpoint of step ", step, "; the manifest lists ",
                                            steps.empty() ? "none" : absl::StrJoin(steps, ", ")));
  }
  const ClusterView view = cluster_->View();
  std::vector<std::string> alive;
  for (const Member& m : view.members()) {
    if (m.role() == WORKER && m.alive()) alive.push_back(absl::StrCat("rank ", m.id()));
  }
  if (!alive.empty() && !force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "workers are alive (", absl::StrJoin(alive, ", "),
        "): rolling the tables back under "
        "them would mix two runs. Stop them first (restarted, they resume from the checkpoint "
        "restored), or force it (psctl restore --force)"));
  }
  std::vector<int32_t> dead;
  for (int32_t s = 0; s < view.shard_addresses_size(); ++s) {
    if (!ShardHolds(view, s)) dead.push_back(s);
  }
  if (!dead.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard(s) ", absl::StrJoin(dead, ", "),
        " have no live replica (psctl status): nothing was restored; restore once they are "
        "back"));
  }
  PsClientOptions o = ShardsOf(view, options_);
  // Within the caller's deadline, so that it hears which shards rolled back (a shard that
  // does not answer, stopped, may still roll back later: restoring again mends it).
  o.rpc_timeout = std::max(absl::Seconds(1),
                           std::min(o.rpc_timeout, deadline - absl::Now() - absl::Seconds(1)));
  ASSIGN_OR_RETURN(auto shards, PsClient::Create(o));
  if (!force) RETURN_IF_ERROR(RefuseUnderActiveClients(*shards, client_id));
  std::vector<int> rolled_back;
  const absl::Status restored = shards->Restore(step, /*drop_later=*/true, &rolled_back);
  if (!restored.ok() && rolled_back.empty()) return restored;
  // Some shard rolled back and deleted its later snapshots: the later checkpoints are gone,
  // also when another shard failed (it is restored to `step` again, which stays listed).
  checkpoints_.erase(std::next(it), checkpoints_.end());
  RETURN_IF_ERROR(WriteManifest());
  if (!restored.ok()) {
    cluster_->SetCheckpoints(checkpoints_);
    return restored;
  }
  cluster_->RolledBackTo(step, checkpoints_);
  LogInfo(
      "ps_coordinator: every shard rolled back to the checkpoint of step %lld; the "
      "later ones are gone",
      static_cast<long long>(step));
  return checkpoints_.back();
}

std::vector<Checkpoint> Checkpointer::Retained(int64_t step, std::optional<double> metric) const {
  std::vector<Checkpoint> all = checkpoints_;
  Checkpoint& added = all.emplace_back();
  added.set_step(step);
  added.set_has_metric(metric.has_value());
  added.set_metric(metric.value_or(0));
  return Retain(std::move(all));
}

std::vector<Checkpoint> Checkpointer::Retain(std::vector<Checkpoint> all) const {
  const Checkpoint* best = nullptr;
  for (const Checkpoint& c : all) {
    if (c.has_metric() && (best == nullptr || !Better(best->metric(), c.metric()))) best = &c;
  }
  const int64_t best_step = best ? best->step() : -1;
  std::vector<Checkpoint> kept;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i + options_.keep_last >= all.size() || all[i].step() == best_step) kept.push_back(all[i]);
  }
  return kept;
}

absl::Status Checkpointer::WriteManifest() const {
  if (options_.data_dir.empty()) return absl::OkStatus();
  CheckpointManifest manifest;
  for (const Checkpoint& c : checkpoints_) *manifest.add_checkpoints() = c;
  // Atomic: a crash leaves the old or the new manifest.
  RETURN_IF_ERROR(
      WriteFileAtomically(ManifestPath(options_.data_dir), manifest.SerializeAsString()));
  // Also a JSON copy for scripts.
  std::ofstream json((fs::path(options_.data_dir) / "checkpoints.json").string());
  json << "[";
  for (size_t i = 0; i < checkpoints_.size(); ++i) {
    json << (i ? ", " : "") << checkpoints_[i].step();
  }
  json << "]\n";
  return absl::OkStatus();
}

}  // namespace pscluster::coord
