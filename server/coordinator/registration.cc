#include "server/coordinator/registration.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/random_id.h"

namespace pscluster::coord {

const char* RoleName(Role role) { return role == SHARD ? "shard" : "worker rank"; }

absl::Status CheckRegistration(const RegisterRequest& r, int expected_group_size) {
  if (r.group_size() != 0 && r.group_size() != expected_group_size) {
    const bool shard = r.role() == SHARD;
    const char* flag = shard ? "--num_shards" : "--world";
    return absl::InvalidArgumentError(absl::StrCat(
        RoleName(r.role()), " ", r.id(), " was started with ", flag, "=", r.group_size(),
        " but this coordinator runs ", shard ? "--num_shards=" : "--num_workers=",
        expected_group_size, ": start it with ", flag, "=", expected_group_size,
        shard ? " (each shard's key ranges follow the number of shards)"
              : " (each worker's share of the data follows the number of workers)"));
  }
  return CheckAdvertised(r.role(), r.id(), r.replica(), r.address(), r.limits());
}

absl::Status CheckAdvertised(Role role, int32_t id, int32_t replica, const std::string& address,
                             const ModeLimits& limits) {
  const std::string who = absl::StrCat(RoleName(role), " ", id,
                                       role == SHARD ? absl::StrCat(" replica ", replica) : "");
  if (role == SHARD) {
    if (address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, " registered without an address: give the HOST:PORT its clients reach it at"));
    }
    if (absl::Status s = CheckHostPort(address, who + "'s address"); !s.ok()) return s;
  } else if (absl::Status s = CheckLabel(address, who + "'s address"); !s.ok()) {
    return s;
  }
  return CheckLabel(limits.model(), who + "'s model name (limits.model)", kMaxModelNameLength);
}

size_t MaxViewGrowth(const RegisterRequest& r) {
  // A field's tag and length prefix: at most 1 byte of tag (numbers below 16) and 3 of
  // length (below 2 MiB) here.
  constexpr size_t kPrefix = 4;
  // Every numeric field of Member at its largest varint (10 bytes) or double (8), each
  // with its tag: role, id, incarnation, alive, last_heartbeat_ms, step, loss,
  // samples_per_sec, has_metric, metric, replica, run_end_step.
  constexpr size_t kNumbers = 12 * (1 + 10);
  const size_t member =
      kPrefix + kNumbers + kPrefix + r.address().size() + kPrefix + r.limits().ByteSizeLong();
  const size_t shard_copies = r.role() == SHARD ? 2 * (kPrefix + r.address().size()) : 0;
  return member + shard_copies + kMemberSlackBytes;
}

std::string NewMemberSecret() { return RandomId(); }

}  // namespace pscluster::coord
