// What a member may register with, checked before the coordinator's state changes: every
// address and name it accepts goes into the cluster view, which each member and client
// reads whole (GetView, RegisterResponse). A 3 MiB shard address once grew the view to
// 9 MiB, past what any default gRPC client receives, and psctl status, the workers and the
// shards all failed with RESOURCE_EXHAUSTED. Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {

// The largest view registrations may build. A gRPC client receives at most 4 MiB by default
// (psctl, the workers, the shards, the Python client); the view travels whole, and a
// RegisterResponse adds a few bytes to it. The last MiB is room for what grows without a
// registration: the checkpoints kept and the mode switches.
inline constexpr size_t kDefaultClientMessageBytes = size_t{4} << 20;
inline constexpr size_t kMaxViewBytes = kDefaultClientMessageBytes - (size_t{1} << 20);

// ModeLimits.model: "mlp", "embedding", "gpt" (shown in messages and on the status page).
inline constexpr size_t kMaxModelNameLength = 64;

// What a registered member's part of the view may still grow by without registering again:
// the progress it reports (step, loss, samples/s, metric, run end), a larger incarnation,
// and its entry in the view's `missing` list once it is declared dead.
inline constexpr size_t kMemberSlackBytes = 128;

// "shard" or "worker rank", for messages.
const char* RoleName(Role role);

// INVALID_ARGUMENT naming the member, the field and the problem: a group size other than
// `expected_group_size` (0: not said, accepted), or what CheckAdvertised refuses.
absl::Status CheckRegistration(const RegisterRequest& r, int expected_group_size);

// The address and model name a member advertises (registered, or saved in the state file):
// a shard's address must be HOST:PORT (common/address.h), since clients dial it; a worker's
// only names its process to operators ("host/pid:N"), so any short printable label, or none;
// the model name (limits.model) at most kMaxModelNameLength printable characters.
// INVALID_ARGUMENT naming the member, the field and the problem.
absl::Status CheckAdvertised(Role role, int32_t id, int32_t replica, const std::string& address,
                             const ModeLimits& limits);

// A new member incarnation's secret (RegisterResponse.member_secret): 128 random bits, hex.
std::string NewMemberSecret();

// At most the bytes registering `r` adds to the view: its member entry with every field at its
// largest (the progress it reports later and kMemberSlackBytes included), and for a shard its
// address again in its chain and in shard_addresses.
size_t MaxViewGrowth(const RegisterRequest& r);

}  // namespace pscluster::coord
