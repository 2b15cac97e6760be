#include "server/coordinator/cluster_state.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/training_mode.h"
#include "server/coordinator/progress_report.h"

namespace pscluster::coord {
namespace {

SwitchScheduleOptions ScheduleOptions(const ClusterStateOptions& o) {
  SwitchScheduleOptions s;
  s.initial_mode = o.mode;
  s.num_shards = o.num_shards;
  s.num_workers = o.num_workers;
  return s;
}

}  // namespace

ClusterState::ClusterState(ClusterStateOptions options, std::function<absl::Time()> now)
    : options_(options),
      now_(std::move(now)),
      switches_(ScheduleOptions(options_)),
      recovery_(options_.num_workers) {}

absl::Status ClusterState::CheckId(Role role, int32_t id, int32_t replica) const {
  if (role != SHARD && role != WORKER) {
    return absl::InvalidArgumentError(absl::StrCat("role ", static_cast<int>(role), " is unknown"));
  }
  const int limit = role == SHARD ? options_.num_shards : options_.num_workers;
  if (id < 0 || id >= limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        RoleName(role), " ", id, " is outside [0, ", limit, "): this coordinator expects ",
        role == SHARD ? "--num_shards=" : "--num_workers=", limit));
  }
  const int replicas = role == SHARD ? options_.replicas : 1;
  if (replica < 0 || replica >= replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat(RoleName(role), " ", id, " replica ", replica, " is outside [0, ", replicas,
                     "): this coordinator expects --replicas=", options_.replicas));
  }
  return absl::OkStatus();
}

Member* ClusterState::FindLocked(Role role, int32_t id, int32_t replica) {
  auto it = members_.find({role, id, replica});
  return it == members_.end() ? nullptr : &it->second;
}

absl::StatusOr<RegisterResponse> ClusterState::Register(const RegisterRequest& r) {
  if (absl::Status s = CheckId(r.role(), r.id(), r.replica()); !s.ok()) return s;
  const int expected = r.role() == SHARD ? options_.num_shards : options_.num_workers;
  if (absl::Status s = CheckRegistration(r, expected); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Member* m = FindLocked(r.role(), r.id(), r.replica());
  if (m != nullptr && m->alive() && (r.address().empty() || m->address() != r.address())) {
    return absl::AlreadyExistsError(absl::StrCat(
        RoleName(r.role()), " ", r.id(), " is held by a live member at '", m->address(),
        "' (incarnation ", m->incarnation(), "); use another id or stop that process"));
  }
  if (absl::Status s = CheckViewRoomLocked(r, m); !s.ok()) return s;
  if (m == nullptr) {
    m = &members_[{r.role(), r.id(), r.replica()}];
    m->set_role(r.role());
    m->set_id(r.id());
    m->set_replica(r.replica());
  }
  if (r.role() == SHARD) {
    // A replica registering again has lost its state: out of the chain (unless it is all
    // the chain has left: then JoinChainLocked starts a new generation with it).
    m->set_alive(false);
    LeaveChainLocked(*m, /*keep_last=*/true);
    if (options_.replicas == 1 && m->address() != r.address()) shard_map_version_ = version_ + 1;
  }
  m->set_address(r.address());
  if (r.has_limits()) {
    *m->mutable_limits() = r.limits();
  } else {
    m->clear_limits();
  }
  m->set_incarnation(m->incarnation() + 1);
  m->clear_step();  // a new incarnation has reported nothing yet
  m->clear_loss();
  m->clear_samples_per_sec();
  m->clear_has_metric();
  m->clear_metric();
  m->clear_finished();
  m->set_alive(true);
  m->set_last_heartbeat_ms(absl::ToUnixMillis(now_()));
  if (r.role() == SHARD) JoinChainLocked(*m);
  ChangedLocked();
  RegisterResponse response;
  response.set_member_secret(secrets_[{r.role(), r.id(), r.replica()}] = NewMemberSecret());
  if (r.role() == SHARD) {
    std::string& key = chain_keys_[r.id()];
    if (key.empty()) key = NewMemberSecret();
    response.set_chain_key(key);
  }
  response.set_incarnation(m->incarnation());
  response.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(options_.heartbeat_timeout));
  *response.mutable_view() = ViewLocked();
  return response;
}

absl::StatusOr<HeartbeatResponse> ClusterState::Heartbeat(const HeartbeatRequest& r) {
  if (absl::Status s = CheckId(r.role(), r.id(), r.replica()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Member* m = FindLocked(r.role(), r.id(), r.replica());
  if (m == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(RoleName(r.role()), " ", r.id(), " is not registered; call Register first"));
  }
  if (r.incarnation() != m->incarnation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        RoleName(r.role()), " ", r.id(), " incarnation ", r.incarnation(),
        " was replaced by incarnation ", m->incarnation(), "; this process must register again"));
  }
  if (!m->alive()) {
    // Declared dead, yet running (stopped, or cut off, past the deadline): the others may
    // already have moved on without it, so it comes back only as a new incarnation.
    return absl::NotFoundError(absl::StrCat(
        RoleName(r.role()), " ", r.id(), " incarnation ", r.incarnation(),
        " was declared dead (no heartbeat for ", absl::FormatDuration(options_.heartbeat_timeout),
        "); register again as a new incarnation"));
  }
  m->set_last_heartbeat_ms(absl::ToUnixMillis(now_()));
  HeartbeatResponse response;
  response.set_view_version(version_);
  return response;
}

absl::StatusOr<Member*> ClusterState::FindWorkerLocked(int32_t rank, int64_t incarnation) {
  Member* m = FindLocked(WORKER, rank);
  if (m == nullptr || m->incarnation() != incarnation) {
    return absl::NotFoundError(
        absl::StrCat("worker rank ", rank, " incarnation ", incarnation, " is not registered"));
  }
  return m;
}

absl::Status ClusterState::ReportProgress(const ReportProgressRequest& r) {
  if (absl::Status s = CheckId(WORKER, r.rank()); !s.ok()) return s;
  if (absl::Status s = CheckProgressReport(r); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Member*> found = FindWorkerLocked(r.rank(), r.incarnation());
  if (!found.ok()) return found.status();
  Member* m = *found;
  if (r.view_version() < shard_map_version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "view version ", r.view_version(), " is stale: the shard map changed at version ",
        shard_map_version_, " (current ", version_, "); re-read the view"));
  }
  m->set_step(r.step());
  if (r.run_end_step() > 0 && r.run_end_step() != m->run_end_step()) {
    m->set_run_end_step(r.run_end_step());
    // A switch scheduled before the workers said where their run ends (SwitchMode refuses
    // one past it after) that the run never reaches would stay pending after it: dropped
    // from the view (ps_coordinator says so).
    if (switches_.DropFrom(r.run_end_step()) > 0) ChangedLocked();
  }
  // A finished report carries no figures, and a metric's report (rate 0) no rate or loss
  // (as the curves take them): the last ones stay shown.
  if (!r.finished() && !(r.has_metric() && r.samples_per_sec() == 0)) {
    m->set_loss(r.loss());
    m->set_samples_per_sec(r.samples_per_sec());
  }
  if (r.has_step_time()) *m->mutable_step_time() = r.step_time();
  if (r.has_metric()) {
    m->set_has_metric(true);
    m->set_metric(r.metric());
    m->set_metric_step(r.step());
  }
  if (r.finished() && !m->finished()) {
    m->set_finished(true);
    ChangedLocked();
  }
  return absl::OkStatus();
}

absl::StatusOr<SwitchModeResponse> ClusterState::SwitchMode(const SwitchModeRequest& r) {
  absl::MutexLock lock(&mu_);
  // A switch the run never reaches would stay pending after it: refused while the live
  // workers have said where their run ends.
  const Member* ends_first = nullptr;
  for (const auto& [key, m] : members_) {
    if (m.role() == WORKER && m.alive() && m.run_end_step() > 0 &&
        (ends_first == nullptr || m.run_end_step() < ends_first->run_end_step())) {
      ends_first = &m;
    }
  }
  const int64_t at = r.at_step() == 0 ? switches_.max_polled() + 1 : r.at_step();  // Schedule's
  if (ends_first != nullptr && at >= ends_first->run_end_step()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the run ends at step ", ends_first->run_end_step(), " (worker ",
                     ends_first->id(), " trains the steps before it): a switch at step ", at,
                     " would never happen; nothing was scheduled. Pick a step below ",
                     ends_first->run_end_step(), ", or start the workers with more --epochs"));
  }
  // Refused here, not at the switch: a worker whose model cannot take the mode would stop
  // there, and the others with it.
  for (const auto& [key, m] : members_) {
    if (m.role() != WORKER || !m.has_limits()) continue;
    if (absl::Status s = CheckModeFits(r.mode(), m.limits(), options_.num_workers); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", m.id(), "'s model cannot switch: ", s.message()));
    }
    if (m.limits().embedding_tables() && r.mode() != PS) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", m.id(), "'s model cannot switch: the ", m.limits().model(),
          " model has embedding tables, which the shards cannot hand to the workers yet: it "
          "trains in ps mode only"));
    }
  }
  absl::StatusOr<SwitchModeResponse> response =
      switches_.Schedule(r.mode(), r.at_step(), absl::ToUnixMillis(now_()));
  if (response.ok() && !response->no_op()) ChangedLocked();
  return response;
}

absl::StatusOr<PollSwitchResponse> ClusterState::PollSwitch(const PollSwitchRequest& r) {
  if (absl::Status s = CheckId(WORKER, r.rank()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindWorkerLocked(r.rank(), r.incarnation()).status(); !s.ok()) return s;
  return switches_.Poll(r.rank(), r.step(), r.horizon());
}

absl::StatusOr<ReportSwitchResponse> ClusterState::ReportSwitch(const ReportSwitchRequest& r) {
  if (absl::Status s = CheckId(WORKER, r.rank()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindWorkerLocked(r.rank(), r.incarnation()).status(); !s.ok()) return s;
  absl::StatusOr<SwitchSchedule::AckResult> ack =
      switches_.Acknowledge(r, absl::ToUnixMillis(now_()));
  if (!ack.ok()) return ack.status();
  if (ack->changed) ChangedLocked();
  ReportSwitchResponse response;
  response.set_done(ack->done);
  return response;
}

bool ClusterState::CheckLiveness() {
  absl::MutexLock lock(&mu_);
  const int64_t cutoff = absl::ToUnixMillis(now_() - options_.heartbeat_timeout);
  bool changed = false;
  for (auto& [key, m] : members_) {
    if (m.alive() && m.last_heartbeat_ms() < cutoff) {
      DeclareDeadLocked(&m);
      changed = true;
    }
  }
  if (changed) ChangedLocked();
  return changed;
}

void ClusterState::DeclareDeadLocked(Member* m) {
  m->set_alive(false);
  if (m->role() == SHARD) LeaveChainLocked(*m, /*keep_last=*/true);
}

bool ClusterState::CompleteLocked() const {
  int alive_workers = 0;
  for (const auto& [key, m] : members_) {
    if (m.alive() && m.role() == WORKER) ++alive_workers;
  }
  // Every shard's chain formed once and holds a live member.
  for (int s = 0; s < options_.num_shards; ++s) {
    if (!formed_.count(s) || !ChainAliveLocked(s)) return false;
  }
  return alive_workers == options_.num_workers;
}

std::string ClusterState::MissingLocked() const {
  std::string out;
  for (int s = 0; s < options_.num_shards; ++s) {
    if (formed_.count(s) && ChainAliveLocked(s)) continue;
    for (int r = 0; r < options_.replicas; ++r) {
      auto it = members_.find({SHARD, s, r});
      if (it != members_.end() && it->second.alive()) continue;
      absl::StrAppend(&out, out.empty() ? "" : ", ", "shard ", s,
                      options_.replicas > 1 ? absl::StrCat(" replica ", r) : "",
                      it == members_.end() ? " (never registered)" : " (dead)");
    }
  }
  for (int id = 0; id < options_.num_workers; ++id) {
    auto it = members_.find({WORKER, id, 0});
    if (it == members_.end() || !it->second.alive()) {
      absl::StrAppend(&out, out.empty() ? "" : ", ", "worker rank ", id,
                      it == members_.end() ? " (never registered)" : " (dead)");
    }
  }
  return out;
}

absl::Status ClusterState::CheckViewRoomLocked(const RegisterRequest& r,
                                               const Member* replaced) const {
  // What the view is now, what the members in it may still add (their slack), and the most
  // this registration adds; a member registering again replaces its own entry.
  const size_t others = members_.size() - (replaced != nullptr ? 1 : 0);
  const size_t now = ViewLocked().ByteSizeLong() - (replaced ? replaced->ByteSizeLong() : 0);
  const size_t worst = now + others * kMemberSlackBytes + MaxViewGrowth(r);
  if (worst <= options_.max_view_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      RoleName(r.role()), " ", r.id(), "'s registration could grow the cluster view to ", worst,
      " bytes, past its bound of ", options_.max_view_bytes,
      " bytes (every member and client reads the view whole, in one message; a default gRPC "
      "client takes at most ",
      kDefaultClientMessageBytes,
      "): refused; give the members shorter addresses, or run fewer per coordinator"));
}

ClusterView ClusterState::ViewLocked() const {
  ClusterView v;
  v.set_version(version_);
  v.set_num_shards(options_.num_shards);
  v.set_num_workers(options_.num_workers);
  v.set_replicas(options_.replicas);
  for (int s = 0; s < options_.num_shards; ++s) {
    Chain* chain = v.add_chains();
    chain->set_shard(s);
    if (auto it = chains_.find(s); it != chains_.end()) *chain = it->second;
    chain->set_formed(formed_.count(s) > 0);
    for (int32_t r : chain->replicas()) {
      auto it = members_.find({SHARD, s, r});
      chain->add_addresses(it == members_.end() ? "" : it->second.address());
    }
    v.add_shard_addresses(chain->addresses().empty() ? "" : chain->addresses(0));
  }
  int64_t global_step = -1;
  int finished = 0;
  for (const auto& [key, m] : members_) {
    *v.add_members() = m;
    if (m.role() == WORKER && (m.alive() || m.finished())) {  // a finished run keeps its step
      global_step = global_step < 0 ? m.step() : std::min(global_step, m.step());
    }
    if (m.role() == WORKER && m.finished()) ++finished;
  }
  v.set_global_step(std::max<int64_t>(global_step, 0));
  v.set_finished(options_.num_workers > 0 && finished == options_.num_workers);
  v.set_complete(CompleteLocked());
  if (!v.complete()) v.set_missing(MissingLocked());
  for (const Checkpoint& c : checkpoints_) *v.add_checkpoints() = c;
  switches_.FillView(&v);
  recovery_.FillView(&v);
  v.set_checkpoint_every_steps(options_.checkpoint_every_steps);
  return v;
}

void ClusterState::SetCheckpoints(const std::vector<Checkpoint>& checkpoints) {
  absl::MutexLock lock(&mu_);
  checkpoints_ = checkpoints;
  ChangedLocked();
}

void ClusterState::RolledBackTo(int64_t step, const std::vector<Checkpoint>& checkpoints) {
  absl::MutexLock lock(&mu_);
  checkpoints_ = checkpoints;
  switches_.Rewind(step);
  ChangedLocked();
}

void ClusterState::ChangedLocked() {
  ++version_;
  view_waiters_.WakeReady([this](const std::pair<int64_t, bool>& wanted)
                              ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under mu_, as ChangedLocked
                                return version_ >= wanted.first &&
                                       (!wanted.second || CompleteLocked());
                              });
  if (!options_.on_change) return;
  CoordinatorState state;
  state.set_version(version_);
  state.set_shard_map_version(shard_map_version_);
  for (const auto& [key, m] : members_) *state.add_members() = m;
  for (const auto& [key, secret] : secrets_) {
    MemberSecret* saved = state.add_member_secrets();
    saved->set_role(static_cast<Role>(std::get<0>(key)));
    saved->set_id(std::get<1>(key));
    saved->set_replica(std::get<2>(key));
    saved->set_secret(secret);
  }
  for (const auto& [shard, chain] : chains_) *state.add_chains() = chain;
  state.mutable_chain_keys()->insert(chain_keys_.begin(), chain_keys_.end());
  for (int32_t shard : formed_) state.add_formed_chains(shard);
  switches_.Save(&state);
  recovery_.Save(&state);
  options_.on_change(state);
}

absl::Status ClusterState::Restore(const CoordinatorState& state) {
  absl::MutexLock lock(&mu_);
  std::map<Key, Member> members;
  for (const Member& m : state.members()) {
    // Restarted with fewer shards, workers or replicas.
    if (!CheckId(m.role(), m.id(), m.replica()).ok()) continue;
    // Saved by a coordinator that did not check addresses: the member registers again.
    if (absl::Status s = CheckAdvertised(m.role(), m.id(), m.replica(), m.address(), m.limits());
        !s.ok()) {
      LogWarning("dropped a saved member: %s", s.ToString().c_str());
      continue;
    }
    Member& kept = members[{m.role(), m.id(), m.replica()}] = m;
    kept.set_alive(true);
    // A grace before the first liveness verdict: members reconnect with backoff (up to
    // 1 s) after our restart. Without it a live member is declared dead and must come back
    // as a new incarnation, which costs the workers a rollback.
    kept.set_last_heartbeat_ms(
        absl::ToUnixMillis(now_() + std::max(absl::Seconds(10), options_.heartbeat_timeout)));
  }
  if (absl::Status s = switches_.Restore(state); !s.ok()) return s;
  recovery_.Restore(state);
  members_ = std::move(members);
  secrets_.clear();
  chain_keys_.clear();
  for (const auto& [shard, key] : state.chain_keys()) {
    if (shard >= 0 && shard < options_.num_shards) chain_keys_[shard] = key;
  }
  for (const MemberSecret& m : state.member_secrets()) {
    if (members_.count({m.role(), m.id(), m.replica()})) {
      secrets_[{m.role(), m.id(), m.replica()}] = m.secret();
    }
  }
  chains_.clear();
  formed_.clear();
  for (const Chain& c : state.chains()) {
    if (c.shard() < 0 || c.shard() >= options_.num_shards) continue;
    Chain& kept = chains_[c.shard()] = c;
    kept.clear_addresses();
  }
  for (int32_t shard : state.formed_chains()) {
    if (chains_.count(shard)) formed_.insert(shard);
  }
  // A state saved before chains existed (or with other counts): every shard's registered
  // replicas form its chain again.
  for (const auto& [key, m] : members_) {
    if (m.role() == SHARD && !chains_.count(m.id())) JoinChainLocked(m);
  }
  version_ = std::max(version_, state.version());
  shard_map_version_ = std::max<int64_t>(1, state.shard_map_version());
  ChangedLocked();
  return absl::OkStatus();
}

ClusterView ClusterState::View() const {
  absl::MutexLock lock(&mu_);
  return ViewLocked();
}

absl::StatusOr<ClusterView> ClusterState::AwaitView(int64_t min_version, bool complete,
                                                    const Wait& how) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return version_ >= min_version && (!complete || CompleteLocked());
  };
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return shutdown_ || ready(); };
  if (AwaitOrPark(&mu_, absl::Condition(&done), how, std::make_pair(min_version, complete),
                  &view_waiters_)) {
    return Parked();
  }
  if (ready()) return ViewLocked();
  if (shutdown_) {
    return absl::UnavailableError(absl::StrCat(
        "the coordinator is shutting down while waiting for cluster view version >= ", min_version,
        complete ? " and complete" : "", "; retry against its restart"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("waited for cluster view version >= ", min_version,
                   complete ? " and complete" : "", "; current version ", version_,
                   complete ? absl::StrCat(", missing: ", MissingLocked()) : ""));
}

void ClusterState::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  view_waiters_.WakeAll(absl::OkStatus());  // each asks again, and hears of the shutdown
}

}  // namespace pscluster::coord
