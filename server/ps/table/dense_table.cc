#include "server/ps/table/dense_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"

namespace pscluster::ps {

absl::StatusOr<std::unique_ptr<DenseTable>> DenseTable::Create(const TableSpec& spec, Range range) {
  auto optimizer = core::MakeOptimizer(spec.optimizer());
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<DenseTable>(new DenseTable(spec, *std::move(optimizer), range));
}

DenseTable::DenseTable(const TableSpec& spec, std::unique_ptr<core::Optimizer> optimizer,
                       Range range)
    : Table(spec, std::move(optimizer)), range_(range), values_(range.size()) {
  core::InitDense(spec.initializer(), range.begin, absl::MakeSpan(values_));
  for (int k = 0; k < optimizer_->num_slots(); ++k) {
    slots_.emplace_back(range.size(), optimizer_->slot_initial_value(k));
  }
}

absl::Status DenseTable::CheckRange(uint64_t begin, uint64_t length) const {
  if (begin < range_.begin || begin > range_.end || length > range_.end - begin) {
    return Reject(absl::OutOfRangeError(
        absl::StrCat("table ", id(), ": values [", begin, ", ", begin + length,
                     ") are outside this shard's range [", range_.begin, ", ", range_.end,
                     ") of a tensor of ", spec_.size(), " values")));
  }
  return absl::OkStatus();
}

namespace {

using Piece = DenseTable::Piece;

// Pushes of at least this many values are scanned and applied by several threads:
// optimizers are element-wise, so any split gives bitwise the same result.
constexpr uint64_t kParallelMinValues = uint64_t{1} << 20;

// Splits `pieces` (total values `total`) into `parts` runs of about equal length.
std::vector<std::vector<Piece>> Split(const std::vector<Piece>& pieces, uint64_t total, int parts) {
  std::vector<std::vector<Piece>> out(parts);
  const uint64_t per = (total + parts - 1) / parts;
  int part = 0;
  uint64_t room = per;
  for (Piece p : pieces) {
    while (!p.grad.empty()) {
      uint64_t n = std::min<uint64_t>(room, p.grad.size());
      out[part].push_back({p.at, p.grad.first(n)});
      p = {p.at + n, p.grad.subspan(n)};
      room -= n;
      if (room == 0 && part + 1 < parts) ++part, room = per;
    }
  }
  return out;
}

// Runs fn(part) for every part of `pieces`, in parallel for large ones.
void ForEachPart(const std::vector<Piece>& pieces, uint64_t total,
                 const std::function<void(const std::vector<Piece>&)>& fn) {
  int parts = total < kParallelMinValues
                  ? 1
                  : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  if (parts == 1) return fn(pieces);
  std::vector<std::vector<Piece>> split = Split(pieces, total, parts);
  std::vector<std::thread> threads;
  for (int t = 1; t < parts; ++t) threads.emplace_back(fn, std::cref(split[t]));
  fn(split[0]);
  for (auto& t : threads) t.join();
}

// Local index of the first non-finite value, or UINT64_MAX; *max_abs: the largest
// |value| when all are finite.
uint64_t ScanPieces(const std::vector<Piece>& pieces, uint64_t total, float* max_abs) {
  std::atomic<uint64_t> first{UINT64_MAX};
  absl::Mutex mu;
  float biggest = 0;
  ForEachPart(pieces, total, [&](const std::vector<Piece>& part) {
    float part_max = 0;
    for (const Piece& p : part) {
      part_max = std::max(part_max, core::MaxAbs(p.grad));
      if (std::isinf(part_max)) {
        uint64_t at = p.at + core::FirstNonFinite(p.grad), seen = first.load();
        while (at < seen && !first.compare_exchange_weak(seen, at)) {
        }
        return;
      }
    }
    absl::MutexLock lock(&mu);
    biggest = std::max(biggest, part_max);
  });
  *max_abs = biggest;
  return first.load();
}

}  // namespace

uint64_t DenseTable::FirstOverflowLocked(const std::vector<Piece>& pieces, uint64_t total,
                                         float g_scale, float max_abs) const {
  const float large = LargeGradientThreshold() / g_scale;
  if (max_abs < large) return UINT64_MAX;  // the common case: known from the scan
  std::atomic<uint64_t> first{UINT64_MAX};
  ForEachPart(pieces, total, [&](const std::vector<Piece>& part) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const Piece& p : part) {
      if (core::MaxAbs(p.grad) < large) continue;  // one cheap scan
      const float* slots[8];
      for (size_t k = 0; k < slots_.size(); ++k) slots[k] = slots_[k].data() + p.at;
      size_t bad = core::FirstOverflow(*optimizer_, values_.data() + p.at, p.grad.data(), slots,
                                       p.grad.size(), updates_ + 1, g_scale);
      if (bad < p.grad.size()) {
        uint64_t at = p.at + bad, seen = first.load();
        while (at < seen && !first.compare_exchange_weak(seen, at)) {
        }
        return;
      }
    }
  });
  return first.load();
}

absl::Status DenseTable::ScanChunk(uint64_t first_index, absl::Span<const float> chunk,
                                   Scanned* scanned) const {
  scanned->done = true;
  const float biggest = core::MaxAbs(chunk);
  if (!std::isinf(biggest)) {
    scanned->max_abs = std::max(scanned->max_abs, biggest);
    return absl::OkStatus();
  }
  const size_t bad = core::FirstNonFinite(chunk);
  if (!spec_.skip_nonfinite()) return NonFinite(chunk[bad], first_index + bad);
  scanned->has_nonfinite = true;
  return absl::OkStatus();
}

absl::StatusOr<DenseTable::Prepared> DenseTable::Prepare(
    int32_t worker, int64_t step, uint64_t begin,
    const std::vector<absl::Span<const float>>& chunks, Scanned scanned) const {
  Prepared p{worker, step};
  for (const auto& c : chunks) p.total += c.size();
  RETURN_IF_ERROR(CheckRange(begin, p.total));
  uint64_t at = begin - range_.begin;
  for (const auto& c : chunks) {
    p.pieces.push_back({at, c});
    at += c.size();
  }
  p.max_abs = scanned.max_abs;
  const uint64_t bad = !scanned.done           ? ScanPieces(p.pieces, p.total, &p.max_abs)
                       : scanned.has_nonfinite ? 0
                                               : UINT64_MAX;
  p.finite = bad == UINT64_MAX;
  if (!p.finite && !spec_.skip_nonfinite()) {
    for (const Piece& piece : p.pieces) {
      if (bad >= piece.at && bad < piece.at + piece.grad.size()) {
        return NonFinite(piece.grad[bad - piece.at], range_.begin + bad);
      }
    }
  }
  return p;
}

absl::Status DenseTable::CheckLocked(Prepared* p) {
  RETURN_IF_ERROR(CheckPushLocked(p->worker, p->step));
  // A finite gradient whose update would overflow is refused like a non-finite one. Under
  // BSP it is checked alone, scaled by the number of workers whose gradients are summed.
  p->over = p->finite ? FirstOverflowLocked(p->pieces, p->total, bsp() ? num_workers_locked() : 1,
                                            p->max_abs)
                      : UINT64_MAX;
  if (p->over != UINT64_MAX && !spec_.skip_nonfinite()) return Overflow(range_.begin + p->over);
  return absl::OkStatus();
}

void DenseTable::CommitLocked(const Prepared& p, bool* skipped) {
  bytes_pushed_ += p.total * sizeof(float);
  if (!p.finite || p.over != UINT64_MAX) {
    *skipped = true;
    nonfinite_skipped_++;
  } else if (bsp()) {
    std::vector<float>& staged = pending_[p.step][p.worker];
    if (!spare_.empty()) {
      staged = std::move(spare_.back());
      spare_.pop_back();
    }
    // Zeros where this push has no piece: none when it covers the range (the usual push).
    if (p.total != range_.size()) {
      staged.assign(range_.size(), 0.0f);
    } else {
      staged.resize(range_.size());
    }
    for (const Piece& piece : p.pieces) {
      std::memcpy(staged.data() + piece.at, piece.grad.data(), piece.grad.size() * sizeof(float));
    }
  } else {
    ++updates_;
    ApplyLocked(p.pieces, p.total);
  }
  RecordPushLocked(p.worker, p.step);
}

absl::Status DenseTable::Push(int32_t worker, int64_t step, uint64_t begin,
                              const std::vector<absl::Span<const float>>& chunks, bool* skipped,
                              Scanned scanned) {
  *skipped = false;
  ASSIGN_OR_RETURN(Prepared p, Prepare(worker, step, begin, chunks, scanned));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckLocked(&p));
  CommitLocked(p, skipped);
  return absl::OkStatus();
}

absl::Status DenseTable::PushAll(const std::vector<PushArgs>& pushes, size_t* refused) {
  std::vector<Prepared> prepared;
  for (size_t i = 0; i < pushes.size(); ++i) {
    const PushArgs& a = pushes[i];
    *a.skipped = false;
    absl::StatusOr<Prepared> p = a.table->Prepare(a.worker, a.step, a.begin, {a.grad}, a.scanned);
    if (!p.ok()) {
      *refused = i;
      return p.status();
    }
    prepared.push_back(*std::move(p));
  }
  std::vector<size_t> order(pushes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return pushes[a].table->id() < pushes[b].table->id(); });
  for (size_t i : order) pushes[i].table->mu_.Lock();
  absl::Status status;
  for (size_t i = 0; i < pushes.size() && status.ok(); ++i) {
    status = pushes[i].table->CheckLocked(&prepared[i]);
    if (!status.ok()) *refused = i;
  }
  if (status.ok()) {
    for (size_t i = 0; i < pushes.size(); ++i) {
      pushes[i].table->CommitLocked(prepared[i], pushes[i].skipped);
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) pushes[*it].table->mu_.Unlock();
  return status;
}

void DenseTable::ApplyLocked(const std::vector<Piece>& pieces, uint64_t total) {
  if (cow_) {
    for (const Piece& p : pieces) CopyBlocksLocked(p.at, p.grad.size());
  }
  ForEachPart(pieces, total, [&](const std::vector<Piece>& part) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (const Piece& p : part) {
      float* slots[8];
      for (size_t k = 0; k < slots_.size(); ++k) slots[k] = slots_[k].data() + p.at;
      optimizer_->Apply(values_.data() + p.at, p.grad.data(), slots, p.grad.size(), updates_);
    }
  });
}

void DenseTable::ApplyBspStepLocked(int64_t step) {
  auto it = pending_.find(step);
  if (it == pending_.end()) return;  // every push of this step was a skipped non-finite one
  // Staging buffers go back to spare_, at most one per worker.
  auto keep = [this](std::vector<float>* buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (spare_.size() < std::max<size_t>(1, num_workers_locked())) {
      spare_.push_back(std::move(*buffer));
    }
  };
  std::vector<float> sum = std::move(it->second.begin()->second);
  // The sum's largest |value|, from the last addition's pass (one push alone: unknown).
  float max_abs = std::numeric_limits<float>::infinity();
  for (auto w = std::next(it->second.begin()); w != it->second.end(); ++w) {
    max_abs = core::AddAndMaxAbs(absl::MakeSpan(sum), w->second);
    keep(&w->second);
  }
  pending_.erase(it);
  // Each push was checked alone; their sum may still overflow: then the step leaves this
  // table as it was, counted and said.
  if (uint64_t over = FirstOverflowLocked({{0, sum}}, sum.size(), 1.0f, max_abs);
      over != UINT64_MAX) {
    nonfinite_skipped_++;
    LogWarning(
        "table %u: the summed gradient of BSP step %lld would make index "
        "%llu non-finite; the step's update was not applied to this table",
        id(), static_cast<long long>(step), static_cast<unsigned long long>(range_.begin + over));
    keep(&sum);
    return;
  }
  ++updates_;
  ApplyLocked({{0, sum}}, sum.size());
  keep(&sum);
}

absl::Status DenseTable::Read(uint64_t begin, absl::Span<float> out) const {
  return ReadBytes(begin, out.size(), reinterpret_cast<char*>(out.data()));
}

absl::Status DenseTable::ReadBytes(uint64_t begin, uint64_t length, char* out) const {
  RETURN_IF_ERROR(CheckRange(begin, length));
  absl::ReaderMutexLock lock(&mu_);
  std::memcpy(out, values_.data() + (begin - range_.begin), length * sizeof(float));
  bytes_pulled_ += length * sizeof(float);
  return absl::OkStatus();
}

void DenseTable::PrepareImage(TableImage* image) const {
  image->arrays.resize(1 + optimizer_->num_slots());
  for (auto& a : image->arrays) a.resize(range_.size());
}

void DenseTable::CaptureLocked(TableImage* image) const {
  image->header.set_shard_begin(range_.begin);
  image->header.set_shard_end(range_.end);
  image->header.set_updates(updates_);
  // Copy as pieces so large tables copy on several threads.
  for (size_t a = 0; a < image->arrays.size(); ++a) {
    const std::vector<float>& src = a == 0 ? values_ : slots_[a - 1];
    float* dst = image->arrays[a].data();
    ForEachPart({{0, absl::MakeConstSpan(src)}}, src.size(), [&](const std::vector<Piece>& part) {
      for (const Piece& p : part)
        std::memcpy(dst + p.at, p.grad.data(), p.grad.size() * sizeof(float));
    });
  }
}

void DenseTable::BeginCaptureLocked(TableImage* image) {
  if (bsp() || cow_ || !copy_on_write_) {  // (one capture at a time; a second copies whole)
    CaptureLocked(image);
    return;
  }
  image->header.set_shard_begin(range_.begin);
  image->header.set_shard_end(range_.end);
  image->header.set_updates(updates_);
  const uint64_t blocks = (range_.size() + kCowBlockValues - 1) / kCowBlockValues;
  cow_ = Cow{image, std::vector<bool>(blocks, false), blocks};
  if (blocks == 0) cow_.reset();
}

void DenseTable::CopyBlockLocked(uint64_t block) {
  const uint64_t at = block * kCowBlockValues;
  const uint64_t n = std::min(kCowBlockValues, range_.size() - at);
  for (size_t a = 0; a < cow_->image->arrays.size(); ++a) {
    const std::vector<float>& src = a == 0 ? values_ : slots_[a - 1];
    std::memcpy(cow_->image->arrays[a].data() + at, src.data() + at, n * sizeof(float));
  }
  cow_->copied[block] = true;
  if (--cow_->left == 0) cow_.reset();
}

void DenseTable::CopyBlocksLocked(uint64_t at, uint64_t n) {
  if (n == 0) return;
  for (uint64_t b = at / kCowBlockValues; cow_ && b <= (at + n - 1) / kCowBlockValues; ++b) {
    if (!cow_->copied[b]) CopyBlockLocked(b);
  }
}

void DenseTable::CompleteCapture(TableImage* image, absl::Duration* pause) {
  *pause = absl::ZeroDuration();
  for (uint64_t b = 0;; ++b) {
    absl::MutexLock lock(&mu_);
    if (!cow_ || cow_->image != image) return;  // complete (or never copy on write)
    while (b < cow_->copied.size() && cow_->copied[b]) ++b;
    const absl::Time start = absl::Now();
    CopyBlockLocked(b);
    *pause = std::max(*pause, absl::Now() - start);
  }
}

void DenseTable::RestoreUpdates(int64_t updates) {
  absl::MutexLock lock(&mu_);
  updates_ = updates;
}

void DenseTable::RestoreBlock(uint64_t begin, uint64_t n, const float* block) {
  Range overlap = Intersect(range_, Range{begin, begin + n});
  if (overlap.size() == 0) return;
  absl::MutexLock lock(&mu_);
  if (cow_) CopyBlocksLocked(overlap.begin - range_.begin, overlap.size());
  const size_t bytes = overlap.size() * sizeof(float);
  const float* src = block + (overlap.begin - begin);
  std::memcpy(values_.data() + (overlap.begin - range_.begin), src, bytes);
  for (size_t k = 0; k < slots_.size(); ++k) {
    std::memcpy(slots_[k].data() + (overlap.begin - range_.begin), src + (k + 1) * n, bytes);
  }
}

uint64_t DenseTable::MemoryBytes(const TableInfo& info) const {
  return (info.shard_end() - info.shard_begin()) * (1 + num_slots()) * sizeof(float);
}

void DenseTable::FillInfoLocked(TableInfo* info) const {
  info->set_shard_begin(range_.begin);
  info->set_shard_end(range_.end);
}

}  // namespace pscluster::ps
