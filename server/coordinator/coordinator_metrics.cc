#include "server/coordinator/coordinator_metrics.h"

#include <string>

#include "absl/time/clock.h"
#include "common/training_mode.h"

namespace pscluster::coord {
namespace {

// Each member's gauges; counts[role][alive] of the members (role 1: workers).
void CollectMembers(const ClusterView& view, absl::Time now, MetricFamilies* f, double alive[2],
                    double dead[2]) {
  for (const Member& m : view.members()) {
    const int role = m.role() == WORKER ? 1 : 0;
    const MetricLabels labels = {{"role", role ? "worker" : "shard"},
                                 {"id", std::to_string(m.id())}};
    (m.alive() ? alive : dead)[role]++;
    f->Gauge("pscluster_coordinator_member_up", "1 while a member is alive, 0 once declared dead.",
             labels, m.alive() ? 1 : 0);
    f->Gauge("pscluster_coordinator_heartbeat_age_seconds",
             "Seconds since each member's last heartbeat.", labels,
             m.last_heartbeat_ms() > 0
                 ? absl::ToDoubleSeconds(now - absl::FromUnixMillis(m.last_heartbeat_ms()))
                 : 0);
    f->Gauge("pscluster_coordinator_member_incarnation",
             "How many times each member has registered.", labels, m.incarnation());
    if (role == 1) {
      const MetricLabels worker = {{"worker", std::to_string(m.id())}};
      f->Gauge("pscluster_coordinator_worker_step", "The last step each worker reported.", worker,
               m.step());
      f->Gauge("pscluster_coordinator_worker_epoch_loss",
               "The mean training loss over the epoch so far, as each worker reported it last "
               "(pscluster_worker_loss on the worker is the last step's).",
               worker, m.loss());
      f->Gauge("pscluster_coordinator_worker_samples_per_second",
               "The throughput each worker reported last.", worker, m.samples_per_sec());
      if (m.has_metric()) {
        f->Gauge("pscluster_coordinator_worker_test_metric",
                 "The validation metric each worker reported last.", worker, m.metric());
      }
    }
  }
}

void Collect(const ClusterView& view, absl::Time now, MetricFamilies* f) {
  double alive[2] = {0, 0}, dead[2] = {0, 0};
  CollectMembers(view, now, f, alive, dead);
  for (int role = 0; role < 2; ++role) {
    const char* name = role ? "worker" : "shard";
    f->Gauge("pscluster_coordinator_members", "Registered members by role and state.",
             {{"role", name}, {"state", "alive"}}, alive[role]);
    f->Gauge("pscluster_coordinator_members", "Registered members by role and state.",
             {{"role", name}, {"state", "dead"}}, dead[role]);
  }
  f->Gauge("pscluster_coordinator_expected_members", "Members the cluster expects, by role.",
           {{"role", "shard"}}, view.num_shards());
  f->Gauge("pscluster_coordinator_expected_members", "Members the cluster expects, by role.",
           {{"role", "worker"}}, view.num_workers());
  f->Gauge("pscluster_coordinator_complete", "1 when every expected member is alive.", {},
           view.complete() ? 1 : 0);
  f->Gauge("pscluster_coordinator_view_version", "The cluster view's version.", {}, view.version());
  f->Gauge("pscluster_coordinator_global_step", "The highest step every live worker reported.", {},
           view.global_step());
  for (TrainingMode mode : kTrainingModes) {
    f->Gauge("pscluster_coordinator_mode", "1 for the training mode in effect.",
             {{"mode", ModeName(mode)}}, view.mode() == mode ? 1 : 0);
  }
  f->Counter("pscluster_coordinator_mode_switches_total", "Mode switches done.", {},
             view.switches_size());
  f->Gauge("pscluster_coordinator_mode_switches_pending", "Mode switches scheduled, not done.", {},
           view.pending_switches_size());
  if (view.switches_size() > 0) {
    f->Gauge("pscluster_coordinator_last_switch_handoff_seconds",
             "The last switch's longest worker hand-over.", {},
             view.switches(view.switches_size() - 1).handoff_seconds());
  }
  f->Gauge("pscluster_coordinator_checkpoints", "Complete cluster checkpoints kept.", {},
           view.checkpoints_size());
  f->Gauge("pscluster_coordinator_last_checkpoint_step",
           "Step of the newest complete checkpoint (-1: none).", {},
           view.checkpoints().empty() ? -1 : view.checkpoints().rbegin()->step());
  if (!view.checkpoints().empty()) {
    f->Gauge("pscluster_coordinator_last_checkpoint_timestamp_seconds",
             "When the newest complete checkpoint was taken (unix time).", {},
             view.checkpoints().rbegin()->unix_ms() / 1e3);
  }
  f->Counter("pscluster_coordinator_rollbacks_total",
             "Rollbacks the workers agreed on since the run started.", {}, view.run().rollbacks());
  f->Gauge("pscluster_coordinator_rollback_stopped_workers",
           "Workers stopped for the rollback in progress (0: none in progress).", {},
           view.rollback().decided() ? 0 : view.rollback().stopped_ranks_size());
}

}  // namespace

void AddCoordinatorMetrics(const ClusterState* cluster, Metrics* metrics) {
  metrics->AddCollector([cluster](MetricFamilies* f) { Collect(cluster->View(), absl::Now(), f); });
}

}  // namespace pscluster::coord
