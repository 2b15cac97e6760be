// ReplicaProber: confirms a client's report that a shard replica is unreachable
// (ReportUnreachable) by the coordinator's own probe, so that a dead head or tail leaves
// its chain as soon as a client notices, not after the liveness timeout. A report alone
// changes nothing: a replica that answers the probe stays (a client cut off from it alone
// cannot take it out), and one that does not is declared dead as a missed lease would
// have it (ClusterState::DeclareUnreachable). A false verdict (a replica too busy to
// answer within kProbeTimeout) costs what a missed lease costs: the replica registers
// again and rejoins its chain by a state transfer.
// Thread-safe; probes run one at a time on the prober's own thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {

class ReplicaProber {
 public:
  // One probe of the replica at an address: OK when it answered (whatever it said), its
  // error when it could not be reached within the timeout given.
  using Probe = std::function<absl::Status(const std::string& address, absl::Duration timeout)>;
  ReplicaProber(ClusterState* cluster, Probe probe);
  ~ReplicaProber();  // finishes the probe in progress, drops the queued ones

  // Queues a probe of the live replica of `shard` at `address`: true if queued; false when
  // no live replica serves there, or one of it is queued or ended within kQuiet.
  bool Report(int32_t shard, const std::string& address);

  // Probes decided so far: replicas declared dead, and the rest (the replica answered, or
  // it was no longer the incarnation reported).
  int64_t confirmed() const;
  int64_t refuted() const;

  // A replica that does not answer within this is unreachable: well under the default
  // liveness timeout (5 s), well over a busy shard's answer to Stats.
  static constexpr absl::Duration kProbeTimeout = absl::Seconds(1);
  // Many clients report the same replica at once, and each retries: one probe serves them.
  static constexpr absl::Duration kQuiet = absl::Milliseconds(300);

 private:
  void Loop();
  void ProbeOne(const Member& m);

  ClusterState* const cluster_;
  const Probe probe_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Member> queue_ ABSL_GUARDED_BY(mu_);
  // By address: when its last probe ended (InfiniteFuture while queued or running).
  std::map<std::string, absl::Time> last_ ABSL_GUARDED_BY(mu_);
  int64_t confirmed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refuted_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// The probe ps_coordinator uses: a new connection to the replica (TCP, and TLS with HTTP/2's
// handshake, which need the process itself, not only its kernel). No call is made: a
// replica's answers (a backup's refusals, a draining shard's) say nothing of whether it
// lives.
ReplicaProber::Probe ConnectProbe(const Security& security);

}  // namespace pscluster::coord
