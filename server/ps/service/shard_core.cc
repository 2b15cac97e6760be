#include "server/ps/service/shard_core.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/call_metadata.h"

namespace pscluster::ps {
namespace {

// A call's ps-client-id ("" without), at most kMaxClientIdBytes of it: an id only tells
// clients apart (Shard::Visit).
std::string ClientId(const grpc::ServerContextBase* ctx) {
  if (ctx == nullptr) return "";
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kClientIdKey);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), std::min(it->second.size(), kMaxClientIdBytes));
}

}  // namespace

ShardCore::ShardCore(Shard* shard, Snapshotter* snapshotter, ServiceOptions options)
    : shard(shard),
      snapshotter(snapshotter),
      options(options),
      gate(shard->options().shard_id, options.max_wait),
      commands(shard, options.max_chunk_bytes),
      watchdog(options.stream_idle_timeout),
      buffers(std::min(options.buffer_pool_bytes, options.max_inflight_request_bytes / 4)),
      budget(options.max_inflight_request_bytes),
      replication_pool(std::max(options.replication_threads, 1)),
      releaser(&budget, &buffers, options.release_idle_memory_after, options.release_min_bytes) {}

ShardCore::Scope::Scope(ShardCore* core, const grpc::ServerContextBase* ctx)
    : in_flight_(&core->in_flight),
      serving_(core->gate.serving_mu()),
      visit_(core->shard, ClientId(ctx)) {}

}  // namespace pscluster::ps
