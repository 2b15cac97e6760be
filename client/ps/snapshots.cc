// PsClient: shard statistics, snapshots and restore.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ps/ps_client.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {

absl::StatusOr<std::vector<ps::StatsResponse>> PsClient::Stats(
    const std::vector<std::string>& except_clients) {
  ps::StatsRequest req;
  req.mutable_except_clients()->Add(except_clients.begin(), except_clients.end());
  return calls_.All(&ps::ShardAdmin::Stub::Stats, req);
}

absl::Status PsClient::Snapshot(int64_t step, const ps::SnapshotRequest& extra) {
  ps::SnapshotRequest req = extra;
  req.set_step(step);
  // A capture waits in the shard for its BSP tables to reach `step`: in slices, as pulls do,
  // so that wait_check can end it when what the step waits for is gone. A slice that runs
  // out is asked again: the shard let the step go without a capture, or, had it captured
  // just then, answers ALREADY_EXISTS (which the coordinator's checkpointer takes as done).
  return calls_.ForEach([&](int s) {
    ps::SnapshotResponse resp;
    return calls_.Waiting(s, [&](grpc::ClientContext* ctx, int) {
      return calls_.stub(s)->Snapshot(ctx, req, &resp);
    });
  });
}

absl::StatusOr<std::vector<ps::SnapshotStatusResponse>> PsClient::SnapshotStatus(
    bool wait_until_idle) {
  ps::SnapshotStatusRequest req;
  req.set_wait_until_idle(wait_until_idle);
  return calls_.All(&ps::ShardAdmin::Stub::SnapshotStatus, req);
}

absl::StatusOr<std::vector<ps::ListSnapshotsResponse>> PsClient::ListSnapshots() {
  return calls_.All(&ps::ShardAdmin::Stub::ListSnapshots, ps::ListSnapshotsRequest());
}

absl::StatusOr<std::vector<ps::SnapshotInfo>> PsClient::CompleteSnapshots() {
  auto lists = ListSnapshots();
  if (!lists.ok()) return lists.status();
  std::map<int64_t, std::pair<int, ps::SnapshotInfo>> by_step;  // shards holding it, summary
  for (const auto& list : *lists) {
    for (const auto& s : list.snapshots()) {
      if (!s.complete()) continue;
      auto& [count, info] = by_step[s.step()];
      if (count++ == 0) {
        info = s;
      } else {
        info.set_bytes(info.bytes() + s.bytes());
      }
    }
  }
  std::vector<ps::SnapshotInfo> out;
  for (const auto& [step, entry] : by_step) {
    if (entry.first == num_shards()) out.push_back(entry.second);
  }
  return out;
}

absl::StatusOr<int64_t> PsClient::LatestCompleteSnapshot() {
  auto complete = CompleteSnapshots();
  if (!complete.ok()) return complete.status();
  if (complete->empty()) return absl::NotFoundError("no snapshot is complete on every shard");
  return complete->back().step();
}

absl::StatusOr<int64_t> PsClient::CheckpointStep() {
  auto stats = Stats();
  if (!stats.ok()) return stats.status();
  int64_t bsp = -1, other = 0;
  for (const auto& shard : *stats) {
    for (const auto& t : shard.tables()) {
      const bool is_bsp = t.info().spec().consistency().mode() == ps::ConsistencyConfig::BSP;
      int64_t& step = is_bsp ? bsp : other;
      step = std::max(step, t.info().applied_steps());
    }
  }
  return bsp >= 0 ? bsp : other;
}

absl::Status PsClient::Restore(int64_t step, bool drop_later, std::vector<int>* rolled_back) {
  ps::RestoreRequest req;
  req.set_step(step);
  req.set_drop_later(drop_later);
  std::vector<absl::Status> each(num_shards());
  calls_
      .ForEach([&](int s) {
        ps::RestoreResponse resp;
        each[s] = calls_.Unary(s, &ps::ShardAdmin::Stub::Restore, req, &resp);
        return absl::OkStatus();
      })
      .IgnoreError();  // each shard's own status, below
  std::vector<int> done;
  const absl::Status* failed = nullptr;
  for (int s = 0; s < num_shards(); ++s) {
    if (each[s].ok()) {
      done.push_back(s);
    } else if (failed == nullptr) {
      failed = &each[s];
    }
  }
  if (rolled_back != nullptr) *rolled_back = done;
  if (failed == nullptr || done.empty()) return failed == nullptr ? absl::OkStatus() : *failed;
  // Some shards rolled back and others did not: the tables are of two timelines now.
  return absl::Status(
      failed->code(),
      absl::StrCat(failed->message(), "; shard(s) ", absl::StrJoin(done, ", "),
                   " did roll back to step ", step,
                   " and the others did not: the tables are mixed until every shard is "
                   "restored to it; restore step ",
                   step, " again once the failed shard answers"));
}

}  // namespace pscluster
