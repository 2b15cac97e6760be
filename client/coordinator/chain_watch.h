// ChainWatch: a PsClient's resolve_chain (client/ps/ps_client_options.h) over the
// coordinator's view, so that clients follow the chains the coordinator forms instead of
// the addresses they read at start. After a replica did not take a call it reports it to
// the coordinator (ReportUnreachable), waits a moment for a view newer than any it has
// seen (a watch on the view's version: a chain change reaches the client as it happens),
// then answers the shard's chain in the newest view, or
// why the shard's state is gone (coord::StillSameCluster: every replica declared dead, a
// chain started over, a worker registered again): the caller rolls back at once instead
// of retrying dead addresses until its deadline.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator/coordinator_client.h"
#include "proto/coordinator.pb.h"

namespace pscluster {

class ChainWatch {
 public:
  // `base`: the view the client's chains were read from; `self`: this worker's rank (its
  // own new incarnation is not a change; -1 for a client that is no worker).
  ChainWatch(CoordinatorClient* coordinator, coord::ClusterView base, int32_t self = -1);

  // Shard `shard`'s chain, head first (empty: the view has no chain for it). `unreachable`
  // (if not empty): the replica that did not take a call, reported to the coordinator
  // first, which probes it and takes it out of its chain at once if it does not answer
  // either, instead of after the liveness timeout.
  absl::StatusOr<std::vector<std::string>> Chain(int shard, const std::string& unreachable);

  // How long one question waits for a newer view: short, because when nothing changed the
  // caller tries the next replica, and a replica becoming head is no view change.
  static constexpr absl::Duration kWatch = absl::Milliseconds(200);

 private:
  CoordinatorClient* const coordinator_;
  const coord::ClusterView base_;
  const int32_t self_;
  absl::Mutex mu_;
  coord::ClusterView newest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster
