// ps_server's command line: every flag, and ServerFlags built from them.
#include "server/ps/flags.h"

#include <unistd.h>

#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/host_name.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (0.0.0.0 for every interface).");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one (printed at start).");
ABSL_FLAG(uint32_t, shard_id, 0, "This shard's index, in [0, num_shards).");
ABSL_FLAG(uint32_t, num_shards, 1, "Number of shards in the cluster.");
ABSL_FLAG(int, replica, 0,
          "Which copy of the shard this is, in [0, ps_coordinator --replicas): the coordinator "
          "chains the copies (chain replication). Replica R > 0 keeps its snapshots under "
          "--data_dir/replica-R.");
ABSL_FLAG(absl::Duration, forward_timeout, absl::Seconds(20),
          "With --replica (chain replication): how long an update this replica applied may take "
          "to reach its successor while the coordinator answers; past it the replica stops "
          "itself and the chain goes on without it. Cut off from the coordinator as well, it "
          "waits up to 10 minutes to hear from it whether it is still in the chain.");
ABSL_FLAG(int, threads, 64,
          "Most threads that apply and hand on the updates a replica receives from the one "
          "before it, and stream its state to a joiner (at least 2). Every call runs on gRPC's "
          "callback API: one that waits (a BSP/SSP pull, an update waiting for its turn, a "
          "stream whose client is slow) holds no thread.");
ABSL_FLAG(std::string, data_dir, "",
          "Checkpoint root shared by all shards (created if missing); this shard's snapshots "
          "go to DIR/shard-<shard_id>. Without it, snapshot RPCs fail.");
ABSL_FLAG(std::string, restore, "",
          "Before serving, load a snapshot from --data_dir: 'latest' (start empty if none) or a "
          "step. Works across shard counts: each shard takes the rows that now map to it.");
ABSL_FLAG(bool, restore_skip_damaged, false,
          "Start although snapshot files under --data_dir do not verify (they are left in place "
          "and named), and let --restore=latest fall back to the newest snapshot that verifies.");
ABSL_FLAG(int, snapshot_keep_last, 3, "Newest complete snapshots kept (plus the best by metric).");
ABSL_FLAG(std::string, snapshot_metric, "min", "Best snapshot: 'min' or 'max' metric.");
ABSL_FLAG(int, snapshot_full_every, 1,
          "Every K-th snapshot is full; the ones between hold only the sparse rows changed "
          "since the snapshot before (and the ids removed), which they need to restore. "
          "Costs 8 bytes per sparse row. 1: every snapshot is full.");
ABSL_FLAG(std::string, coordinator, "",
          "ps_coordinator address: register this shard there and heartbeat (optional).");
ABSL_FLAG(std::string, advertise_host, "",
          "Host workers reach this shard at, sent to the coordinator (default: --host, or this "
          "machine's host name when --host is a wildcard such as 0.0.0.0).");
ABSL_FLAG(int, advertise_port, 0,
          "The port workers reach this shard at, told to the coordinator, when it is not the "
          "one it listens on (a port mapping or a proxy in between); 0: the listening port.");
ABSL_FLAG(int, snapshot_test_delay_ms, 0, "Tests only: sleep per written block (crash tests).");
ABSL_FLAG(uint64_t, max_chunk_bytes, uint64_t{4} << 20, "Largest dense chunk / sparse payload.");
ABSL_FLAG(uint64_t, max_table_bytes, 0,
          "Largest table slice (values + optimizer state) this shard accepts. 0: a quarter of "
          "the machine's physical memory, at most 16 GiB.");
ABSL_FLAG(uint64_t, max_memory_bytes, 0,
          "Most bytes of values and optimizer state all tables of this shard may hold: a dense "
          "table that would pass it is refused at creation (sparse tables count the rows they "
          "hold, each bounded by --max_table_bytes). 0: half the machine's physical memory.");
ABSL_FLAG(uint64_t, max_inflight_request_bytes, 0,
          "Most bytes the requests in flight may hold at once, shard-wide: a push stream holds "
          "its whole transfer until it is applied, an import or export the table's whole state. "
          "One that would go over is refused with RESOURCE_EXHAUSTED (unary requests, already "
          "received, are counted but never refused). gRPC's own buffers get the same bound "
          "(its resource quota; at least --threads messages of --max_chunk_bytes). 0: a "
          "quarter of the machine's physical memory, at least 1 GiB.");
ABSL_FLAG(uint64_t, sparse_memory_bytes, 0,
          "Most bytes of sparse rows (values, optimizer state, bookkeeping) this shard keeps in "
          "RAM, all tables together; the rows updated longest ago beyond it move to a RocksDB "
          "disk tier in --sparse_tier_dir and come back when a push updates them. 0: no disk "
          "tier, every row in RAM (each table bounded by --max_table_bytes).");
ABSL_FLAG(std::string, sparse_tier_dir, "",
          "With --sparse_memory_bytes: where the disk tier lives, on local disk; this shard's is "
          "DIR/shard-<shard_id> (replica R > 0: DIR/shard-<shard_id>-replica-R), created and "
          "wiped at every start, as the tier holds nothing a restart needs: snapshots do.");
ABSL_FLAG(uint64_t, sparse_tier_reserve_bytes, uint64_t{1} << 30,
          "Free space kept on the disk tier's file system: a push whose rows need more is "
          "refused with RESOURCE_EXHAUSTED (RocksDB must never meet a full disk). The tier's "
          "memtables and compactions are sized to fit in it.");

ABSL_FLAG(absl::Duration, stream_idle_timeout, absl::Seconds(30),
          "A push or import stream that receives nothing for this long is cancelled and "
          "nothing of it applied, freeing its thread and memory (a client stalled mid-stream). "
          "inf: never.");

namespace pscluster::ps {

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                               : uint64_t{4} << 30;  // unknown: assume a small machine
}

uint64_t DefaultInflightRequestBytes() {
  return std::max<uint64_t>(uint64_t{1} << 30, PhysicalMemoryBytes() / 4);
}

namespace {

absl::Status ReadShardFlags(ServerFlags* f) {
  f->shard.shard_id = absl::GetFlag(FLAGS_shard_id);
  f->shard.num_shards = absl::GetFlag(FLAGS_num_shards);
  f->shard.max_table_bytes = absl::GetFlag(FLAGS_max_table_bytes);
  if (f->shard.max_table_bytes == 0) {
    f->shard.max_table_bytes = std::min(uint64_t{16} << 30, PhysicalMemoryBytes() / 4);
  }
  f->shard.max_memory_bytes = absl::GetFlag(FLAGS_max_memory_bytes);
  if (f->shard.max_memory_bytes == 0) f->shard.max_memory_bytes = PhysicalMemoryBytes() / 2;
  if (f->shard.num_shards == 0 || f->shard.shard_id >= f->shard.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_id=", f->shard.shard_id,
                     " must be in [0, --num_shards=", f->shard.num_shards, ")"));
  }
  return absl::OkStatus();
}

// The service's limits and threads.
absl::Status ReadServiceFlags(ServerFlags* f) {
  f->service.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  if (f->service.max_chunk_bytes < 1024 || f->service.max_chunk_bytes > (1u << 30)) {
    return absl::InvalidArgumentError("--max_chunk_bytes must be in [1024, 1 GiB]");
  }
  f->service.max_inflight_request_bytes = absl::GetFlag(FLAGS_max_inflight_request_bytes);
  if (f->service.max_inflight_request_bytes == 0) {
    f->service.max_inflight_request_bytes = DefaultInflightRequestBytes();
  }
  if (f->service.max_inflight_request_bytes < f->service.max_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_request_bytes=", f->service.max_inflight_request_bytes,
        " must be 0 (automatic) or at least --max_chunk_bytes=", f->service.max_chunk_bytes));
  }
  f->service.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  if (f->service.stream_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stream_idle_timeout must be > 0 (or inf), got ",
                     absl::FormatDuration(f->service.stream_idle_timeout)));
  }
  f->host = absl::GetFlag(FLAGS_host);
  f->port = absl::GetFlag(FLAGS_port);
  f->threads = absl::GetFlag(FLAGS_threads);
  if (f->threads < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", f->threads,
                     " must be >= 2: it also bounds gRPC's threads for the synchronous "
                     "services (reflection), where one polls for calls and a call needs "
                     "another to run on"));
  }
  f->service.replication_threads = f->threads;
  return absl::OkStatus();
}

absl::Status ReadSnapshotFlags(ServerFlags* f) {
  f->snapshots.root = absl::GetFlag(FLAGS_data_dir);
  f->restore = absl::GetFlag(FLAGS_restore);
  const std::string metric = absl::GetFlag(FLAGS_snapshot_metric);
  if (f->snapshots.root.empty() && !f->restore.empty()) {
    return absl::InvalidArgumentError("--restore needs --data_dir");
  }
  if (metric != "min" && metric != "max") {
    return absl::InvalidArgumentError("--snapshot_metric must be 'min' or 'max'");
  }
  f->snapshots.keep_last = absl::GetFlag(FLAGS_snapshot_keep_last);
  f->snapshots.skip_damaged = absl::GetFlag(FLAGS_restore_skip_damaged);
  if (f->snapshots.keep_last < 1) {
    return absl::InvalidArgumentError("--snapshot_keep_last must be >= 1");
  }
  f->snapshots.full_every = absl::GetFlag(FLAGS_snapshot_full_every);
  if (f->snapshots.full_every < 1 || f->snapshots.full_every > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--snapshot_full_every must be in [1, 1000], got ", f->snapshots.full_every));
  }
  f->shard.track_row_versions = f->snapshots.full_every > 1;
  f->snapshots.lower_metric_is_better = metric == "min";
  f->snapshots.test_delay_per_block =
      absl::Milliseconds(absl::GetFlag(FLAGS_snapshot_test_delay_ms));
  return absl::OkStatus();
}

// The coordinator, this replica's place, and where the other replicas' snapshots lie.
absl::Status ReadChainFlags(ServerFlags* f) {
  f->coordinator = absl::GetFlag(FLAGS_coordinator);
  if (!f->coordinator.empty()) RETURN_IF_ERROR(CheckHostPort(f->coordinator, "--coordinator"));
  f->replica = absl::GetFlag(FLAGS_replica);
  if (f->replica < 0 || f->replica > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replica=", f->replica, " must be 0, 1 or 2 (ps_coordinator --replicas <= 3)"));
  }
  if (f->replica > 0 && f->coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--replica > 0 needs --coordinator: the coordinator chains the replicas");
  }
  if (!f->snapshots.root.empty() && !f->coordinator.empty()) {
    // Replica r > 0 writes under DIR/replica-r; a restore reads what every replica wrote
    // (whichever was its chain's head then), on this machine or a shared file system.
    const std::string base = f->snapshots.root;
    for (int r = 0; r < 3; ++r) {
      const std::string root = r == 0 ? base : absl::StrCat(base, "/replica-", r);
      if (r == f->replica) {
        f->snapshots.root = root;
      } else {
        f->snapshots.read_roots.push_back(root);  // (a root not there yet holds nothing)
      }
    }
  }
  f->forward_timeout = absl::GetFlag(FLAGS_forward_timeout);
  if (f->forward_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--forward_timeout=", absl::FormatDuration(f->forward_timeout), " must be positive"));
  }
  return absl::OkStatus();
}

// The disk tier of sparse tables.
absl::Status ReadTierFlags(ServerFlags* f) {
  f->disk_tier.memory_bytes = absl::GetFlag(FLAGS_sparse_memory_bytes);
  f->disk_tier.dir = absl::GetFlag(FLAGS_sparse_tier_dir);
  f->disk_tier.reserve_bytes = absl::GetFlag(FLAGS_sparse_tier_reserve_bytes);
  if (f->disk_tier.memory_bytes == 0) return absl::OkStatus();
  if (f->disk_tier.dir.empty()) {
    return absl::InvalidArgumentError(
        "--sparse_memory_bytes needs --sparse_tier_dir: a directory on local disk for the rows "
        "beyond it (wiped at every start)");
  }
  f->disk_tier.dir = absl::StrCat(f->disk_tier.dir, "/shard-", f->shard.shard_id,
                                  f->replica > 0 ? absl::StrCat("-replica-", f->replica) : "");
  if (f->disk_tier.reserve_bytes < (uint64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sparse_tier_reserve_bytes=", f->disk_tier.reserve_bytes,
                     " must be at least 1 MiB: the tier's memtables and compactions fit in it"));
  }
  return absl::OkStatus();
}

// Where clients reach this shard.
absl::Status ReadAdvertiseFlags(ServerFlags* f) {
  f->advertise_host = absl::GetFlag(FLAGS_advertise_host);
  f->advertise_port = absl::GetFlag(FLAGS_advertise_port);
  if (f->advertise_port < 0 || f->advertise_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--advertise_port=", f->advertise_port, " is not a port (0: --port's)"));
  }
  if (f->advertise_host.empty()) f->advertise_host = f->host;
  if (f->advertise_host == "0.0.0.0" || f->advertise_host == "::" || f->advertise_host == "[::]") {
    // A wildcard is where to listen, never where to connect: name this machine instead.
    f->advertise_host = HostName();
    if (f->advertise_host.empty()) {
      return absl::InvalidArgumentError(
          "--host is a wildcard and the host name is unknown: give --advertise_host");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerFlags> ServerFlagsFromCommandLine() {
  ServerFlags f;
  RETURN_IF_ERROR(ReadShardFlags(&f));
  RETURN_IF_ERROR(ReadServiceFlags(&f));
  RETURN_IF_ERROR(ReadSnapshotFlags(&f));
  RETURN_IF_ERROR(ReadChainFlags(&f));
  RETURN_IF_ERROR(ReadAdvertiseFlags(&f));
  RETURN_IF_ERROR(ReadTierFlags(&f));
  return f;
}

}  // namespace pscluster::ps
