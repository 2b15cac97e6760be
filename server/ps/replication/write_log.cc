#include "server/ps/replication/write_log.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::ps {

absl::StatusOr<WriteLog::Entry> WriteLog::Append(const std::string& request_id, absl::Time deadline,
                                                 const std::function<absl::Status()>& apply) {
  // A shard alone has nothing to answer a write without an id from, nor anyone to replay
  // it to: such a write takes no lock and no number (the hot path, as before the log).
  if (!ordered_ && request_id.empty()) {
    RETURN_IF_ERROR(apply());
    return Entry{};
  }
  absl::MutexLockMaybe order(ordered_ ? &order_mu_ : nullptr);
  {
    absl::MutexLock lock(mu_);
    uint64_t seq = 0;
    ASSIGN_OR_RETURN(bool seen, FindOrReserve(request_id, deadline, &seq));
    if (seen) return Entry{seq, true};
  }
  absl::Status s = apply();
  absl::MutexLock lock(mu_);
  if (!s.ok()) {
    if (!request_id.empty()) ids_.Erase(request_id);  // a retry applies it after all
    return s;
  }
  AppliedLocked(applied_ + 1, request_id);
  return Entry{applied_, false};
}

absl::StatusOr<bool> WriteLog::FindOrReserve(const std::string& request_id, absl::Time deadline,
                                             uint64_t* seq) {
  if (request_id.empty()) return false;
  auto settled = [&]() ABSL_SHARED_LOCKS_REQUIRED(*mu_) {
    const uint64_t* known = ids_.Find(request_id);
    return known == nullptr || *known != kApplying;
  };
  if (!mu_->AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::UnavailableError(absl::StrCat(name_, ": an earlier attempt of request ",
                                               request_id, " is still being applied; retry"));
  }
  if (const uint64_t* known = ids_.Find(request_id)) {
    *seq = *known;
    return true;
  }
  if (!ordered_) ids_.Set(request_id, kApplying);
  return false;
}

absl::Status WriteLog::AppendAt(uint64_t seq, const std::string& request_id,
                                const std::function<absl::Status()>& admit,
                                const std::function<absl::Status()>& apply) {
  absl::MutexLock order(&order_mu_);
  {
    absl::MutexLock lock(mu_);
    RETURN_IF_ERROR(admit());
    if (applied_ + 1 != seq) {
      return absl::UnavailableError(
          absl::StrCat(name_, ": update ", seq, " is out of turn (", applied_, " applied); retry"));
    }
  }
  RETURN_IF_ERROR(apply());
  absl::MutexLock lock(mu_);
  AppliedLocked(seq, request_id);
  return absl::OkStatus();
}

void WriteLog::AppliedLocked(uint64_t seq, const std::string& request_id) {
  applied_ = seq;
  if (!request_id.empty()) ids_.Set(request_id, seq);
  if (on_applied_) on_applied_();
}

void WriteLog::Done(uint64_t seq) {
  absl::MutexLock lock(mu_);
  done_above_.insert(seq);
  while (!done_above_.empty() && *done_above_.begin() == done_through_ + 1) {
    done_through_ = *done_above_.begin();
    done_above_.erase(done_above_.begin());
  }
}

bool WriteLog::IsDone(uint64_t seq) const {
  return seq <= done_through_ || done_above_.count(seq) > 0;
}

bool WriteLog::AwaitDone(uint64_t seq, absl::Time deadline) {
  absl::MutexLock lock(mu_);
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(*mu_) { return IsDone(seq); };
  return mu_->AwaitWithDeadline(absl::Condition(&done), deadline);
}

void WriteLog::Reset(uint64_t applied, const std::function<void(RecentIds<uint64_t>*)>& add) {
  applied_ = done_through_ = applied;
  done_above_.clear();
  ids_.Clear();
  if (add) add(&ids_);
  if (on_applied_) on_applied_();
}

void WriteLog::ForEachId(const std::function<void(const std::string&, uint64_t)>& f) const {
  ids_.ForEach([&](const std::string& id, uint64_t seq) {
    if (seq != kApplying) f(id, seq);
  });
}

}  // namespace pscluster::ps
