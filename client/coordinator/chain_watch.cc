#include "client/coordinator/chain_watch.h"

#include <utility>

#include "common/cluster_view.h"
#include "common/status_macros.h"

namespace pscluster {

ChainWatch::ChainWatch(CoordinatorClient* coordinator, coord::ClusterView base, int32_t self)
    : coordinator_(coordinator), base_(base), self_(self), newest_(std::move(base)) {}

absl::StatusOr<std::vector<std::string>> ChainWatch::Chain(int shard,
                                                           const std::string& unreachable) {
  // Best effort: without an answer the liveness timeout still takes a dead replica out.
  if (!unreachable.empty())
    coordinator_->ReportUnreachable(shard, unreachable, kWatch).IgnoreError();
  int64_t known;
  {
    absl::MutexLock lock(&mu_);
    known = newest_.version();
  }
  // DEADLINE_EXCEEDED: nothing changed within kWatch; any other error: the coordinator
  // cannot say now (its client has retried a restarting one): the newest view stands.
  absl::StatusOr<coord::ClusterView> now = coordinator_->AwaitView(known + 1, false, kWatch);
  coord::ClusterView view;
  {
    absl::MutexLock lock(&mu_);
    if (now.ok() && now->version() > newest_.version()) newest_ = *std::move(now);
    view = newest_;
  }
  RETURN_IF_ERROR(coord::StillSameCluster(base_, view, self_));
  return coord::ChainAddresses(view, shard);
}

}  // namespace pscluster
