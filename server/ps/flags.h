// ps_server's flags, parsed into typed options (server/ps/flags.cc defines every flag).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/ps/service/options.h"
#include "server/ps/snapshot/snapshotter.h"
#include "server/ps/table/disk_tier.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {

struct ServerFlags {
  ShardOptions shard;
  ServiceOptions service;
  std::string host;
  int port = 0;
  int threads = 64;
  SnapshotterOptions snapshots;  // snapshots.root empty: no snapshots (--data_dir)
  std::string restore;           // "", "latest" or a step
  std::string coordinator;       // ps_coordinator address, or empty
  int replica = 0;               // which copy of the shard (chain replication)
  absl::Duration forward_timeout = absl::Seconds(20);  // ReplicatorOptions::forward_timeout
  std::string advertise_host;                          // the host workers reach this shard at
  int advertise_port = 0;                              // and the port (0: the one it listens on)
  DiskTierOptions disk_tier;  // memory_bytes 0: no disk tier (--sparse_memory_bytes)
};

// The machine's physical memory (4 GiB when the system does not say).
uint64_t PhysicalMemoryBytes();
// --max_inflight_request_bytes=0: a quarter of physical memory, at least 1 GiB.
uint64_t DefaultInflightRequestBytes();

// After absl::ParseCommandLine: the flags, checked; INVALID_ARGUMENT naming the flag.
absl::StatusOr<ServerFlags> ServerFlagsFromCommandLine();

}  // namespace pscluster::ps
