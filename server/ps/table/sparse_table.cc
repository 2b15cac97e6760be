#include "server/ps/table/sparse_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"

namespace pscluster::ps {

namespace {
// How far ahead a loop over a request's keys prefetches their index entries.
constexpr size_t kPrefetchAhead = 8;
}  // namespace

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(
    const TableSpec& spec, uint32_t shard_id, uint32_t num_shards, uint64_t max_rows,
    bool track_versions, DiskTier* tier) {
  auto optimizer = core::MakeOptimizer(spec.optimizer());
  if (!optimizer.ok()) return optimizer.status();
  std::unique_ptr<ColdRows> cold;
  if (tier != nullptr) {
    auto rows = tier->NewTable(spec.table_id(), spec.dim() * (1 + (*optimizer)->num_slots()));
    if (!rows.ok()) return rows.status();
    cold = *std::move(rows);
  }
  return std::unique_ptr<SparseTable>(new SparseTable(spec, *std::move(optimizer), shard_id,
                                                      num_shards, max_rows, track_versions,
                                                      std::move(cold)));
}

uint64_t SparseTable::RowBytes(const TableSpec& spec, int num_slots, bool track_versions) {
  // The floats, the key and update count beside them, and the index at its sparsest
  // (RowStore: 4-byte slots and a control byte, 7/16 full right after it grows).
  // With eviction, the step of its last update.
  const uint64_t step = spec.rows().evict_after_steps() > 0 ? 8 : 0;
  return uint64_t{spec.dim()} * (1 + num_slots) * sizeof(float) + 16 + 12 + step +
         (track_versions ? 8 : 0);
}

SparseTable::SparseTable(const TableSpec& spec, std::unique_ptr<core::Optimizer> optimizer,
                         uint32_t shard_id, uint32_t num_shards, uint64_t max_rows,
                         bool track_versions, std::unique_ptr<ColdRows> cold)
    : Table(spec, std::move(optimizer)),
      shard_id_(shard_id),
      num_shards_(num_shards),
      dim_(spec.dim()),
      // A row's number in the store is 32 bits.
      max_rows_(std::min<uint64_t>(max_rows, UINT32_MAX)),
      lifecycle_(spec.rows()),
      // The disk tier picks the rows to move out by their last update's step.
      rows_(dim_ * (1 + optimizer_->num_slots()), lifecycle_.tracks_steps() || cold != nullptr,
            track_versions),
      cold_(std::move(cold)),
      row_bytes_(RowBytes(spec, optimizer_->num_slots(), track_versions) +
                 (cold_ != nullptr && !lifecycle_.tracks_steps() ? 8 : 0)) {}

SparseTable::~SparseTable() {
  if (cold_ != nullptr) cold_->tier().ChargeRam(-ABSL_TS_UNCHECKED_READ(charged_));
}

std::vector<float> SparseTable::InitialRow(uint64_t key) const {
  std::vector<float> row(dim_ * (1 + optimizer_->num_slots()));
  core::InitSparseRow(spec_.initializer(), key, absl::MakeSpan(row.data(), dim_));
  for (int k = 0; k < optimizer_->num_slots(); ++k) {
    std::fill_n(row.begin() + dim_ * (1 + k), dim_, optimizer_->slot_initial_value(k));
  }
  return row;
}

absl::Status SparseTable::CheckRoomLocked(uint64_t new_rows) const {
  const uint64_t after = rows_.size() + staged_new_rows_ + new_rows;
  if (new_rows > 0 && after > max_rows_) {
    return Reject(absl::ResourceExhaustedError(absl::StrCat(
        "table ", id(), ": the push would store ", new_rows, " new rows beside ", rows_.size(),
        " stored and ", staged_new_rows_, " staged; this shard holds at most ", max_rows_,
        " rows of this table (ps_server --max_table_bytes)")));
  }
  return absl::OkStatus();
}

const uint64_t* SparseTable::FirstOverflowLocked(const Grads& grads, float g_scale) const {
  const float large = LargeGradientThreshold() / g_scale;
  for (size_t i = 0; i < grads.size(); ++i) {
    const float* g = grads.row(i);
    float biggest = 0;
    for (size_t j = 0; j < dim_; ++j) biggest = std::max(biggest, std::fabs(g[j]));
    if (biggest < large) continue;
    const uint64_t& key = grads.key(i);
    std::vector<float> row;
    int64_t updates = 0;
    if (RowStore::Row stored = rows_.Find(key)) {
      row.assign(stored.data, stored.data + rows_.width());
      updates = *stored.updates;
    } else {
      row = InitialRow(key);
    }
    const float* slots[8];
    for (int k = 0; k < optimizer_->num_slots(); ++k) slots[k] = row.data() + dim_ * (1 + k);
    if (core::FirstOverflow(*optimizer_, row.data(), g, slots, dim_, updates + 1, g_scale) < dim_) {
      return &key;
    }
  }
  return nullptr;
}

absl::Status SparseTable::CheckKeys(absl::Span<const uint64_t> keys) const {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (spec_.key_space() != 0 && keys[i] >= spec_.key_space()) {
      return Reject(
          absl::OutOfRangeError(absl::StrCat("table ", id(), ": keys[", i, "]=", keys[i],
                                             " is outside key_space ", spec_.key_space())));
    }
    if (uint32_t owner = SparseShardOf(keys[i], num_shards_); owner != shard_id_) {
      return Reject(absl::InvalidArgumentError(
          absl::StrCat("table ", id(), ": keys[", i, "]=", keys[i], " belongs to shard ", owner,
                       ", not shard ", shard_id_, " (route keys with SparseShardOf)")));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseTable::CheckRequest(absl::Span<const uint64_t> keys,
                                       absl::Span<const float> grads, uint32_t part,
                                       uint32_t parts) const {
  if (parts > 1 && part >= parts) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat("table ", id(), ": part ", part, " of ", parts, " (parts count from 0)")));
  }
  if (grads.size() != keys.size() * dim_) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat("table ", id(), ": grads holds ", grads.size(), " values, expected keys (",
                     keys.size(), ") x dim (", dim_, ") = ", keys.size() * dim_)));
  }
  return CheckKeys(keys);
}

absl::Status SparseTable::CheckPartLocked(int32_t worker, int64_t step, uint32_t part,
                                          uint32_t parts, Parts** so_far) {
  *so_far = nullptr;
  if (auto s = parts_.find(step); s != parts_.end()) {
    if (auto w = s->second.find(worker); w != s->second.end()) *so_far = &w->second;
  }
  if (*so_far == nullptr) return absl::OkStatus();
  if ((*so_far)->count != parts) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat("table ", id(), ": worker ", worker, "'s push of step ", step, " in ", parts,
                     " parts, but its earlier parts said ", (*so_far)->count)));
  }
  if ((*so_far)->got.count(part)) {
    return Reject(absl::FailedPreconditionError(absl::StrCat("table ", id(), ": worker ", worker,
                                                             " already pushed step ", step,
                                                             " (part ", part, " of ", parts, ")")));
  }
  return absl::OkStatus();
}

absl::Status SparseTable::CheckUpdateLocked(const Parts* so_far, Grads* grads, uint64_t* new_rows,
                                            bool* drop) const {
  // One look-up per key in the earlier parts: their rows summed in, or a row to store.
  *new_rows = 0;
  for (size_t i = 0; i < grads->size(); ++i) {
    if (i + kPrefetchAhead < grads->size()) {
      rows_.Prefetch(grads->key(i + kPrefetchAhead));
      if (so_far != nullptr) so_far->grads.Prefetch(grads->key(i + kPrefetchAhead));
    }
    const float* earlier = so_far == nullptr ? nullptr : so_far->grads.Find(grads->key(i));
    if (earlier == nullptr) {
      *new_rows += !rows_.Contains(grads->key(i));
      continue;
    }
    float* g = grads->row(i);
    for (size_t j = 0; j < dim_; ++j) g[j] = earlier[j] + g[j];
  }
  RETURN_IF_ERROR(CheckRoomLocked(*new_rows));
  // Under BSP each push is checked alone, scaled by the number of workers whose rows the
  // step sums (the sum itself is checked when the step applies).
  const uint64_t* over = FirstOverflowLocked(*grads, bsp() ? num_workers_locked() : 1);
  if (over == nullptr) return absl::OkStatus();
  if (spec_.skip_nonfinite()) {
    *drop = true;
    return absl::OkStatus();
  }
  return Reject(absl::InvalidArgumentError(absl::StrCat(
      "table ", id(), ": the gradient of key ", *over,
      " is finite but its update would make the row or its optimizer state non-finite (too "
      "large for learning rate ",
      spec_.optimizer().learning_rate(),
      "); fix the gradient, lower the learning rate or create the table with skip_nonfinite")));
}

absl::Status SparseTable::Push(int32_t worker, int64_t step, absl::Span<const uint64_t> keys,
                               absl::Span<const float> grads, bool* skipped, uint32_t part,
                               uint32_t parts) {
  *skipped = false;
  RETURN_IF_ERROR(CheckRequest(keys, grads, part, parts));
  const size_t bad = core::FirstNonFinite(grads);
  const bool finite = bad == grads.size();
  if (!finite && !spec_.skip_nonfinite()) return NonFinite(grads[bad], bad);
  Grads merged = finite ? Grads::Of(dim_, keys, grads) : Grads(dim_);

  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckPushLocked(worker, step));
  Parts* so_far = nullptr;
  if (parts > 1) RETURN_IF_ERROR(CheckPartLocked(worker, step, part, parts, &so_far));
  const bool dropped_before = so_far != nullptr && so_far->skipped;
  bool drop = !finite || dropped_before;
  uint64_t new_rows = 0;
  if (!drop) RETURN_IF_ERROR(PromoteLocked(merged));
  if (!drop) RETURN_IF_ERROR(CheckUpdateLocked(so_far, &merged, &new_rows, &drop));
  if (!drop) RETURN_IF_ERROR(MakeRoomLocked(new_rows, &merged));
  bytes_pushed_ += grads.size() * sizeof(float);
  rows_pushed_ += keys.size();
  *skipped = drop;
  if (drop && !dropped_before) nonfinite_skipped_++;  // once per push
  if (parts > 1) {
    TakePartLocked(worker, step, part, parts, std::move(merged), new_rows, drop);
    return absl::OkStatus();
  }
  if (!drop) CommitLocked(worker, step, std::move(merged), new_rows);
  RecordPushLocked(worker, step);
  return absl::OkStatus();
}

void SparseTable::TakePartLocked(int32_t worker, int64_t step, uint32_t part, uint32_t parts,
                                 Grads grads, uint64_t new_rows, bool drop) {
  Parts& p = parts_[step][worker];
  p.count = parts;
  p.got.insert(part);
  if (drop) {  // nothing of the push will be applied: its rows need not wait
    p.skipped = true;
    staged_new_rows_ -= p.new_rows;
    p.new_rows = 0;
    p.grads.Clear();
  } else {
    if (p.grads.empty()) {
      p.grads = std::move(grads);
      // The parts of a push are about as large as each other: grow once, not at every part.
      p.grads.Reserve(p.grads.size() * parts);
    } else {
      for (size_t i = 0; i < grads.size(); ++i) {  // the sums
        if (i + kPrefetchAhead < grads.size()) p.grads.Prefetch(grads.key(i + kPrefetchAhead));
        p.grads.Put(grads.key(i), grads.row(i));
      }
    }
    p.new_rows += new_rows;
    staged_new_rows_ += new_rows;
  }
  if (p.got.size() < parts) return;
  Parts done = std::move(p);
  parts_[step].erase(worker);
  if (parts_[step].empty()) parts_.erase(step);
  staged_new_rows_ -= done.new_rows;
  // Each part was checked against the rows as they were then; under ASP/SSP other pushes
  // may have changed them since.
  if (!done.skipped &&
      (bsp() || !SumOverflowsLocked(done.grads, absl::StrCat("worker ", worker, "'s push of step ",
                                                             step, " in ", parts, " parts")))) {
    CommitLocked(worker, step, std::move(done.grads), done.new_rows);
  }
  RecordPushLocked(worker, step);
}

void SparseTable::CommitLocked(int32_t worker, int64_t step, Grads grads, uint64_t new_rows) {
  if (!bsp()) {
    for (size_t i = 0; i < grads.size(); ++i) {
      if (i + kPrefetchAhead < grads.size()) rows_.Prefetch(grads.key(i + kPrefetchAhead));
      ApplyLocked(grads.key(i), grads.row(i), step, 1);
    }
    EndUpdatesLocked(step);
    return;
  }
  pending_[step][worker] = std::move(grads);  // a worker pushes a BSP step once
  pending_new_rows_[step] += new_rows;
  staged_new_rows_ += new_rows;
}

void SparseTable::DropWorkerLocked(int32_t worker) {
  for (auto s = parts_.begin(); s != parts_.end();) {
    if (auto w = s->second.find(worker); w != s->second.end()) {
      staged_new_rows_ -= w->second.new_rows;
      s->second.erase(w);
    }
    s = s->second.empty() ? parts_.erase(s) : std::next(s);
  }
}

bool SparseTable::SumOverflowsLocked(const Grads& sum, const std::string& what) {
  const uint64_t* over = FirstOverflowLocked(sum, 1.0f);
  if (over == nullptr) return false;
  nonfinite_skipped_++;
  LogWarning(
      "table %u: the summed gradient of %s would make the row of key %llu "
      "non-finite; it was not applied to this table",
      id(), what.c_str(), static_cast<unsigned long long>(*over));
  return true;
}

RowStore::Row SparseTable::NewRowLocked(uint64_t key) {
  return rows_.Insert(key, [&](float* row) {
    const std::vector<float> initial = InitialRow(key);
    std::copy(initial.begin(), initial.end(), row);
  });
}

void SparseTable::ApplyLocked(uint64_t key, const float* grad, int64_t step, uint32_t pushes) {
  RowStore::Row row = rows_.Find(key);
  if (!row) {
    if (!lifecycle_.Admit(key, pushes)) return;  // counted; the id stays without a row
    row = NewRowLocked(key);
  }
  float* slots[8];
  for (int k = 0; k < optimizer_->num_slots(); ++k) slots[k] = row.data + dim_ * (1 + k);
  optimizer_->Apply(row.data, grad, slots, dim_, ++*row.updates);
  if (row.step != nullptr) *row.step = step;
  if (row.version != nullptr) *row.version = ++changes_;
}

void SparseTable::EndUpdatesLocked(int64_t step) {
  const std::optional<int64_t> upto = lifecycle_.SweepAt(step);
  if (upto) {
    lifecycle_.Evicted(rows_.RemoveIf([&](uint64_t key, const RowStore::Row& row) {
      if (*row.step > *upto) return false;
      if (rows_.tracks_versions()) RememberRemovedLocked(key);
      return true;
    }));
    SweepColdLocked(*upto);
  }
  ChargeRamLocked();
}

void SparseTable::RememberRemovedLocked(uint64_t key) {
  if (removed_.size() >= std::max(kMaxRemovedKept, rows_.size())) {
    removed_.clear();  // the next snapshot is whole: no base it could build on is known
    removed_known_from_ = changes_;
  }
  removed_.emplace_back(++changes_, key);
}

void SparseTable::ForgetChangesThrough(uint64_t version) {
  absl::MutexLock lock(&mu_);
  auto kept =
      std::upper_bound(removed_.begin(), removed_.end(), std::make_pair(version, UINT64_MAX));
  removed_.erase(removed_.begin(), kept);
}

void SparseTable::ApplyBspStepLocked(int64_t step) {
  ApplyBspSumLocked(step);
  EndUpdatesLocked(step);  // also after a step whose pushes were all dropped
}

void SparseTable::ApplyBspSumLocked(int64_t step) {
  auto it = pending_.find(step);
  if (it == pending_.end()) return;  // every push of this step was dropped
  // Per key: the workers' rows added in worker-id order, and (for admission) how many
  // workers' pushes carried it.
  Grads sum(dim_);
  std::vector<uint32_t> carried;
  for (const auto& [worker, grads] : it->second) {
    for (size_t i = 0; i < grads.size(); ++i) {
      const size_t row = sum.Add(grads.key(i), grads.row(i));
      if (row == carried.size()) carried.push_back(0);
      ++carried[row];
    }
  }
  pending_.erase(it);
  if (auto n = pending_new_rows_.find(step); n != pending_new_rows_.end()) {
    staged_new_rows_ -= n->second;
    pending_new_rows_.erase(n);
  }
  // Each push was checked alone; their sum may still overflow: then the step leaves this
  // table as it was, counted and said.
  if (SumOverflowsLocked(sum, absl::StrCat("BSP step ", step))) return;
  for (size_t i = 0; i < sum.size(); ++i) ApplyLocked(sum.key(i), sum.row(i), step, carried[i]);
}

absl::Status SparseTable::Read(absl::Span<const uint64_t> keys, absl::Span<float> out) {
  RETURN_IF_ERROR(CheckKeys(keys));
  absl::ReaderMutexLock lock(&mu_);
  std::vector<size_t> missing;  // with a disk tier: the keys with no row in RAM
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + kPrefetchAhead < keys.size()) rows_.Prefetch(keys[i + kPrefetchAhead]);
    float* dst = out.data() + i * dim_;
    if (RowStore::Row row = rows_.Find(keys[i])) {
      std::memcpy(dst, row.data, dim_ * sizeof(float));
    } else if (cold_ != nullptr) {
      missing.push_back(i);
    } else {  // never pushed: the initial row, computed, not stored
      core::InitSparseRow(spec_.initializer(), keys[i], absl::MakeSpan(dst, dim_));
    }
  }
  if (cold_ != nullptr) {
    ram_hits_ += keys.size() - missing.size();
    RETURN_IF_ERROR(ReadColdLocked(keys, missing, out));
  }
  bytes_pulled_ += out.size() * sizeof(float);
  rows_pulled_ += keys.size();
  return absl::OkStatus();
}

uint64_t SparseTable::MemoryBytes(const TableInfo& info) const {
  // The sketch's size is fixed at creation: no lock needed.
  return info.num_rows() * dim_ * (1 + num_slots()) * sizeof(float) +
         ABSL_TS_UNCHECKED_READ(lifecycle_).bytes();
}

void SparseTable::FillInfoLocked(TableInfo* info) const {
  info->set_num_rows(rows_.size() + (cold_ != nullptr ? cold_->size() : 0));
}

}  // namespace pscluster::ps
