#include "server/ps/shard_metrics.h"

#include <string>

namespace pscluster::ps {
namespace {

// A sparse table's rows: moved, and let in, kept out and swept by its SparseRowPolicy.
void CollectRows(const TableStats& t, const MetricLabels& table, MetricFamilies* f) {
  f->Counter("pscluster_ps_pushed_rows_total", "Sparse rows pushed, per table.", table,
             t.rows_pushed());
  f->Counter("pscluster_ps_pulled_rows_total", "Sparse rows pulled, per table.", table,
             t.rows_pulled());
  f->Counter("pscluster_ps_rows_admitted_total",
             "Sparse rows created, their id admitted (TableSpec.rows), per table.", table,
             t.rows_admitted());
  f->Counter("pscluster_ps_rows_not_admitted_total",
             "Sparse row updates dropped, their id not admitted yet, per table.", table,
             t.rows_not_admitted());
  f->Counter("pscluster_ps_rows_evicted_total",
             "Sparse rows removed for going unused (TableSpec.rows), per table.", table,
             t.rows_evicted());
}

// A sparse table's rows on a shard with a disk tier (ps_server --sparse_memory_bytes): where
// they are, how often a stored row was found in RAM, and how many moved.
void CollectDiskTier(const TableStats& t, const MetricLabels& table, MetricFamilies* f) {
  f->Gauge("pscluster_ps_rows_on_disk", "Sparse rows in the disk tier, per table.", table,
           t.rows_on_disk());
  f->Gauge("pscluster_ps_disk_tier_bytes", "Bytes of the disk tier's files, per table.", table,
           t.disk_bytes());
  f->Counter("pscluster_ps_ram_tier_hits_total",
             "Stored rows a pull or push found in RAM (hit rate: over hits + disk reads).", table,
             t.ram_hits());
  f->Counter("pscluster_ps_disk_tier_reads_total",
             "Stored rows a pull or push read from the disk tier, per table.", table,
             t.disk_reads());
  f->Counter("pscluster_ps_rows_to_disk_total", "Sparse rows moved from RAM to disk.", table,
             t.rows_to_disk());
  f->Counter("pscluster_ps_rows_from_disk_total", "Sparse rows moved from disk to RAM.", table,
             t.rows_from_disk());
}

void CollectTables(const Shard& shard, MetricFamilies* f) {
  const bool tier = shard.options().disk_tier != nullptr;
  const StatsResponse stats = shard.Stats();
  for (const TableStats& t : stats.tables()) {
    const bool sparse = t.info().spec().kind() == TableSpec::SPARSE;
    // The id joins with the shards' logs and stats; the name is what a dashboard shows.
    const MetricLabels table = {{"table", std::to_string(t.info().spec().table_id())},
                                {"table_name", t.info().spec().name()}};
    MetricLabels kind = table;
    kind["kind"] = sparse ? "sparse" : "dense";
    f->Counter("pscluster_ps_pushes_total", "Pushes applied or accepted, per table.", table,
               t.pushes());
    f->Counter("pscluster_ps_pulls_total", "Pulls served, per table.", table, t.pulls());
    f->Counter("pscluster_ps_pushed_bytes_total", "Gradient bytes pushed, per table.", table,
               t.bytes_pushed());
    f->Counter("pscluster_ps_pulled_bytes_total", "Value bytes pulled, per table.", table,
               t.bytes_pulled());
    if (sparse) CollectRows(t, table, f);
    if (sparse && tier) CollectDiskTier(t, table, f);
    f->Counter("pscluster_ps_rejected_requests_total",
               "Requests refused by a table's checks (bad step, shape, NaN, ...).", table,
               t.rejected_requests());
    f->Counter("pscluster_ps_nonfinite_pushes_skipped_total",
               "Pushes with non-finite gradients skipped (skip_nonfinite tables).", table,
               t.nonfinite_pushes_skipped());
    f->Gauge("pscluster_ps_table_rows",
             "Rows held: values of this shard's range (dense) or rows materialised (sparse).", kind,
             sparse ? t.info().num_rows() : t.info().shard_end() - t.info().shard_begin());
    f->Gauge("pscluster_ps_table_memory_bytes",
             "Bytes of values and optimizer state held (sparse: without the row index).", kind,
             t.memory_bytes());
    f->Gauge("pscluster_ps_table_applied_steps",
             "Steps whose every worker's push the table holds (BSP: applied), per table.", table,
             t.info().applied_steps());
    f->Counter("pscluster_ps_pull_waits_total",
               "Pulls that waited for their consistency bound (BSP/SSP), per table.", table,
               t.pulls_waited());
    f->Counter("pscluster_ps_pull_wait_seconds_total",
               "Seconds pulls spent waiting for their consistency bound, per table.", table,
               t.pull_wait_seconds());
    f->Summary("pscluster_ps_pull_staleness_steps",
               "Steps of the slowest worker a pull's values lacked (0 under BSP), per table.",
               table, t.pulls(), static_cast<double>(t.staleness_sum()));
    f->Gauge("pscluster_ps_pull_staleness_max_steps", "The largest staleness a pull saw.", table,
             t.staleness_max());
    f->Gauge("pscluster_ps_pulls_parked",
             "Pulls waiting for their consistency bound now (parked: no thread held), per table.",
             table, t.pulls_parked());
  }
  for (const WorkerClock& w : stats.workers()) {
    f->Gauge("pscluster_ps_worker_clock", "Steps each registered worker has pushed.",
             {{"worker", std::to_string(w.worker_id())}}, w.clock());
  }
}

void CollectSnapshots(const Snapshotter& snapshotter, MetricFamilies* f) {
  const SnapshotCounters c = snapshotter.Counters();
  const SnapshotStatusResponse s = snapshotter.Status();
  f->Counter("pscluster_ps_snapshots_total", "Snapshots by result.", {{"result", "ok"}},
             c.completed);
  f->Counter("pscluster_ps_snapshots_total", "Snapshots by result.", {{"result", "failed"}},
             c.failed);
  // Not failures: a request for a step the tables had passed, which the coordinator repeats.
  f->Counter("pscluster_ps_snapshots_total", "Snapshots by result.", {{"result", "refused"}},
             c.refused);
  f->Summary("pscluster_ps_snapshot_write_seconds", "Background write time of each snapshot.", {},
             c.completed, c.write_seconds_sum);
  f->Gauge("pscluster_ps_snapshot_last_write_seconds", "The last complete snapshot's write time.",
           {}, c.last_write_seconds);
  f->Gauge("pscluster_ps_snapshot_last_bytes", "Bytes of the last complete snapshot.", {},
           c.last_bytes);
  f->Gauge("pscluster_ps_snapshot_last_pause_seconds",
           "Longest time a table was locked for the last snapshot's capture.", {},
           c.last_pause_seconds);
  f->Gauge("pscluster_ps_snapshot_last_success_timestamp_seconds",
           "When the last snapshot completed (unix time; 0: none since start).", {},
           c.last_success_unix_seconds);
  f->Gauge("pscluster_ps_snapshot_in_progress", "1 while a snapshot is being written.", {},
           c.in_progress ? 1 : 0);
  f->Gauge("pscluster_ps_snapshot_last_complete_step",
           "Step of the newest complete snapshot (-1: none).", {}, s.last_complete_step());
}

}  // namespace

void AddShardMetrics(const Shard* shard, const Snapshotter* snapshotter, Metrics* metrics) {
  metrics->AddCollector([shard, snapshotter](MetricFamilies* f) {
    CollectTables(*shard, f);
    if (snapshotter != nullptr) CollectSnapshots(*snapshotter, f);
  });
}

}  // namespace pscluster::ps
