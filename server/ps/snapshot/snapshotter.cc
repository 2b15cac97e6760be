#include "server/ps/snapshot/snapshotter.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pscluster::ps {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::string ShardSnapshotDir(const std::string& root, uint32_t shard_id) {
  return (fs::path(root) / absl::StrCat("shard-", shard_id)).string();
}

absl::StatusOr<std::unique_ptr<Snapshotter>> Snapshotter::Create(Shard* shard,
                                                                 SnapshotterOptions options) {
  std::unique_ptr<SnapshotStorage> local;
  SnapshotStorage* storage = options.storage;
  if (storage == nullptr) storage = (local = MakeLocalSnapshotStorage()).get();
  ASSIGN_OR_RETURN(
      auto store,
      storage->Open(ShardSnapshotDir(options.root, shard->options().shard_id), options.read_only));
  ASSIGN_OR_RETURN(auto list, store->List());
  if (std::vector<std::string> damaged = store->Damaged(); !damaged.empty()) {
    if (!options.skip_damaged) {
      return absl::DataLossError(
          absl::StrCat("damaged snapshot files (left in place): ", absl::StrJoin(damaged, "; "),
                       ". Move them away, or pass --restore_skip_damaged to start without them"));
    }
    for (const std::string& d : damaged) {
      LogWarning("ignoring damaged snapshot file (left in place): %s", d.c_str());
    }
  }
  std::unique_ptr<Snapshotter> s(
      new Snapshotter(shard, std::move(options), std::move(local), std::move(store)));
  absl::MutexLock lock(&s->mu_);
  if (!list.empty()) s->last_complete_step_ = list.back().step();
  return s;
}

Snapshotter::Snapshotter(Shard* shard, SnapshotterOptions options,
                         std::unique_ptr<SnapshotStorage> local,
                         std::unique_ptr<SnapshotStore> store)
    : shard_(shard),
      options_(std::move(options)),
      local_(std::move(local)),
      storage_(options_.storage != nullptr ? options_.storage : local_.get()),
      store_(std::move(store)),
      tip_(options_.full_every) {}

Snapshotter::~Snapshotter() {
  std::thread writer;
  {
    absl::MutexLock lock(&mu_);
    writer = std::move(writer_);
  }
  if (writer.joinable()) writer.join();
}

absl::StatusOr<SnapshotResponse> Snapshotter::Snapshot(const SnapshotRequest& request,
                                                       absl::Time deadline) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", request.step()));
  }
  ASSIGN_OR_RETURN(const ChainTip tip, Begin(request.step()));
  ASSIGN_OR_RETURN(Captured captured, CaptureAll(request.step(), deadline, tip));
  SnapshotResponse response;
  response.set_step(request.step());
  response.set_bytes(captured.bytes);
  response.set_pause_seconds(absl::ToDoubleSeconds(captured.longest_pause));
  StartWrite(request, std::move(captured), tip);
  return response;
}

absl::StatusOr<ChainTip> Snapshotter::Begin(int64_t step) {
  std::thread finished;  // the previous writer, joined outside the lock
  std::optional<ChainTip> tip;
  {
    absl::MutexLock lock(&mu_);
    if (in_progress_ && capturing_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "snapshot of step ", current_step_,
          " is still waiting for its tables to reach that "
          "step (a BSP table captures once every worker pushed the steps before it; it gives "
          "up at its request's deadline); retry when it completes"));
    }
    if (in_progress_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "snapshot of step ", current_step_, " is still being written (", bytes_written_.load(),
          " of ", bytes_total_, " bytes); retry when it completes"));
    }
    ASSIGN_OR_RETURN(auto list, store_->List());
    bool tip_stored = false;
    for (const auto& m : list) {
      if (m.step() == step) {
        return absl::AlreadyExistsError(absl::StrCat("a snapshot of step ", step, " exists"));
      }
      tip_stored = tip_stored || m.step() == tip_.step();
    }
    if (!tip_stored) tip_.Reset();  // deleted (or damaged): the next snapshot is full
    tip = tip_;
    in_progress_ = true;
    capturing_ = true;
    current_step_ = step;
    finished = std::move(writer_);
  }
  if (finished.joinable()) finished.join();
  return *tip;
}

absl::StatusOr<Snapshotter::Captured> Snapshotter::CaptureAll(int64_t step, absl::Time deadline,
                                                              const ChainTip& tip) {
  Captured out;
  const std::vector<Table*> tables = shard_->Tables();
  // Hold every table at the step first, so none moves past it while another is captured.
  for (size_t i = 0; i < tables.size(); ++i) {
    if (absl::Status s = tables[i]->HoldStep(step); !s.ok()) {
      return Abandon(tables, 0, i, step, s, &SnapshotCounters::refused);
    }
  }
  // Every table's point in time first, then what they copy on write (so the captures are
  // close together; pushes go on between the blocks). Nothing is left half-copied, even
  // when a capture fails (the images refer to nothing once complete).
  for (size_t i = 0; i < tables.size(); ++i) {
    absl::Duration pause;
    auto image = tables[i]->Capture(step, deadline, &pause, tip.SinceFor(*tables[i]));
    if (!image.ok()) {
      Complete(tables, &out);
      return Abandon(tables, i + 1, tables.size(), step, image.status(), &SnapshotCounters::failed);
    }
    out.longest_pause = std::max(out.longest_pause, pause);
    out.images.push_back(*std::move(image));
  }
  Complete(tables, &out);
  return out;
}

void Snapshotter::Complete(const std::vector<Table*>& tables, Captured* captured) {
  for (size_t i = 0; i < captured->images.size(); ++i) {
    absl::Duration pause;
    tables[i]->CompleteCapture(captured->images[i].get(), &pause);
    captured->longest_pause = std::max(captured->longest_pause, pause);
    captured->bytes += captured->images[i]->bytes();
  }
}

absl::Status Snapshotter::Abandon(const std::vector<Table*>& tables, size_t held_from,
                                  size_t held_to, int64_t step, absl::Status status,
                                  uint64_t SnapshotCounters::*counter) {
  for (size_t i = held_from; i < held_to; ++i) tables[i]->ReleaseStep(step);
  if (counter == &SnapshotCounters::failed) {
    LogWarning("snapshot of step %lld failed in its capture: %s", static_cast<long long>(step),
               std::string(status.ToString()).c_str());
  }
  absl::MutexLock lock(&mu_);
  in_progress_ = false;
  counters_.*counter += 1;
  return status;
}

void Snapshotter::StartWrite(const SnapshotRequest& request, Captured captured,
                             const ChainTip& tip) {
  SnapshotStore::WriteOptions wo;
  wo.shard_id = shard_->options().shard_id;
  wo.num_shards = shard_->options().num_shards;
  wo.has_metric = request.has_metric();
  wo.metric = request.metric();
  wo.test_delay_per_block = options_.test_delay_per_block;
  wo.bytes_written = &bytes_written_;
  if (ChainTip::ChangesOnly(captured.images)) wo.base_step = tip.step();
  absl::MutexLock lock(&mu_);
  counters_.last_pause_seconds = absl::ToDoubleSeconds(captured.longest_pause);
  bytes_total_ = captured.bytes;
  capturing_ = false;
  bytes_written_ = 0;
  std::vector<int64_t> keep(request.keep_steps().begin(), request.keep_steps().end());
  if (!keep.empty()) keep.push_back(request.step());
  writer_ = std::thread(&Snapshotter::WriteInBackground, this, request.step(),
                        std::move(captured.images), wo, std::move(keep));
}

void Snapshotter::WriteInBackground(int64_t step, std::vector<std::unique_ptr<TableImage>> images,
                                    SnapshotStore::WriteOptions options,
                                    std::vector<int64_t> keep) {
  LogInfo("snapshot of step %lld: writing %llu bytes", static_cast<long long>(step),
          static_cast<unsigned long long>(bytes_total()));
  absl::Time start = absl::Now();
  auto manifest = store_->Write(step, images, options);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (manifest.ok()) {
    LogInfo("snapshot of step %lld complete: %.1f MB in %.2f s (%.0f MB/s)%s",
            static_cast<long long>(step), manifest->bytes() / 1e6, seconds,
            manifest->bytes() / 1e6 / seconds,
            options.base_step
                ? absl::StrCat(", the changes since step ", *options.base_step).c_str()
                : "");
    Advance(step, options.base_step, ChainTip::Of(images));
  }
  images.clear();  // free the staging copy before retention's compaction
  absl::Status status = manifest.status();
  if (status.ok()) {
    status =
        keep.empty()
            ? store_->ApplyRetention(options_.keep_last, options_.lower_metric_is_better).status()
            : store_->RetainOnly(keep).status();
  }
  absl::MutexLock lock(&mu_);
  in_progress_ = false;
  if (manifest.ok()) {
    last_complete_step_ = std::max(last_complete_step_, step);
    counters_.completed++;
    counters_.write_seconds_sum += seconds;
    counters_.last_write_seconds = seconds;
    counters_.last_bytes = manifest->bytes();
    counters_.last_success_unix_seconds = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  } else {
    counters_.failed++;
  }
  last_error_ = status.ok() ? "" : std::string(status.ToString());
  if (!status.ok()) {
    LogWarning("snapshot of step %lld failed: %s", static_cast<long long>(step),
               last_error_.c_str());
  }
}

void Snapshotter::Advance(int64_t step, std::optional<int64_t> base,
                          std::vector<ChainTip::Captured> tables) {
  for (const ChainTip::Captured& c : tables) {
    absl::StatusOr<Table*> table = shard_->GetTable(c.table_id);
    if (table.ok() && (*table)->incarnation() == c.incarnation) {
      (*table)->ForgetChangesThrough(c.version);
    }
  }
  absl::MutexLock lock(&mu_);
  tip_.Completed(step, base, std::move(tables));
}

absl::StatusOr<ListSnapshotsResponse> Snapshotter::List() const {
  auto list = store_->List();
  if (!list.ok()) return list.status();
  ListSnapshotsResponse r;
  for (const auto& m : *list) {
    SnapshotInfo* i = r.add_snapshots();
    i->set_step(m.step());
    i->set_bytes(m.bytes());
    i->set_complete(true);
    i->set_has_metric(m.has_metric());
    i->set_metric(m.metric());
    i->set_shard_id(m.shard_id());
    i->set_num_shards(m.num_shards());
    i->set_has_base(m.has_base());
    i->set_base_step(m.base_step());
  }
  absl::MutexLock lock(&mu_);
  if (in_progress_) {  // listed, marked incomplete
    SnapshotInfo* i = r.add_snapshots();
    i->set_step(current_step_);
    i->set_bytes(bytes_written_);
    i->set_shard_id(shard_->options().shard_id);
    i->set_num_shards(shard_->options().num_shards);
  }
  return r;
}

SnapshotCounters Snapshotter::Counters() const {
  absl::MutexLock lock(&mu_);
  SnapshotCounters c = counters_;
  c.in_progress = in_progress_;
  return c;
}

SnapshotStatusResponse Snapshotter::Status() const {
  absl::MutexLock lock(&mu_);
  SnapshotStatusResponse r;
  r.set_in_progress(in_progress_);
  r.set_step(current_step_);
  r.set_bytes_written(bytes_written_);
  r.set_bytes_total(bytes_total_);
  r.set_last_complete_step(last_complete_step_);
  r.set_last_error(last_error_);
  r.set_restored_step(restored_step_);
  return r;
}

uint64_t Snapshotter::bytes_total() const {
  absl::MutexLock lock(&mu_);
  return bytes_total_;
}

bool Snapshotter::AwaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !in_progress_; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

absl::StatusOr<Snapshotter::Loaded> Snapshotter::Load(const std::string& which) const {
  ASSIGN_OR_RETURN(Catalog catalog, Survey());
  if (!catalog.damaged.empty() && which == "latest" && !options_.skip_damaged) {
    return absl::DataLossError(
        absl::StrCat("damaged snapshot files under ", options_.root,
                     " (left in place): ", absl::StrJoin(catalog.damaged, "; "),
                     ". Move them away, or pass --restore_skip_damaged to restore without them"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> candidates, Candidates(which, catalog));
  if (candidates.empty()) return Loaded();
  absl::Status last;
  for (int64_t step : candidates) {
    absl::StatusOr<Loaded> loaded = LoadStep(step, catalog);
    if (loaded.ok()) return loaded;
    const absl::Status& s = loaded.status();
    if (!absl::IsDataLoss(s) || which != "latest" || !options_.skip_damaged) {
      if (absl::IsDataLoss(s) && which == "latest") {
        return absl::DataLossError(
            absl::StrCat(s.message(),
                         ". Nothing was deleted; pass --restore_skip_damaged to "
                         "restore the newest snapshot that verifies"));
      }
      return s;
    }
    LogWarning(
        "snapshot of step %lld does not verify (%s); "
        "--restore_skip_damaged: trying an older one",
        static_cast<long long>(step), std::string(s.message()).c_str());
    last = s;
  }
  return absl::DataLossError(absl::StrCat("no snapshot under ", options_.root,
                                          " verifies; the last error: ", last.message()));
}

absl::StatusOr<Snapshotter::Catalog> Snapshotter::Survey() const {
  Catalog c;
  std::vector<std::string> dirs = storage_->ShardDirs(options_.root);
  for (const std::string& root : options_.read_roots) {
    for (std::string& dir : storage_->ShardDirs(root)) dirs.push_back(std::move(dir));
  }
  for (const std::string& dir : dirs) {
    const SnapshotStore* store = store_.get();
    if (!storage_->Same(dir, store_->dir())) {
      ASSIGN_OR_RETURN(std::unique_ptr<SnapshotStore> opened,
                       storage_->Open(dir, /*read_only=*/true));
      store = opened.get();
      c.owned.push_back(std::move(opened));
    }
    RETURN_IF_ERROR(SurveyStore(store, &c));
  }
  // A step is restorable when all of the shards it was taken with have it.
  for (const auto& [step, shards] : c.by_step) {
    uint32_t n = shards.begin()->second.num_shards;
    bool whole = shards.size() == n;
    for (const auto& [id, info] : shards) whole = whole && info.num_shards == n && id < n;
    if (whole) c.restorable.push_back(step);
  }
  return c;
}

absl::Status Snapshotter::SurveyStore(const SnapshotStore* store, Catalog* c) const {
  ASSIGN_OR_RETURN(const std::vector<SnapshotManifest> list, store->List());
  std::map<int64_t, SnapshotManifest> by_step;
  for (const auto& m : list) by_step[m.step()] = m;
  for (const auto& m : list) {
    absl::StatusOr<std::vector<int64_t>> chain = ChainOf(m.step(), by_step, store->dir());
    if (chain.ok()) {
      c->by_step[m.step()][m.shard_id()] = {m.num_shards(), store, *std::move(chain)};
    } else {  // a link is missing: as good as damaged
      c->damaged.push_back(std::string(chain.status().message()));
    }
  }
  for (std::string& d : store->Damaged()) c->damaged.push_back(std::move(d));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Snapshotter::Candidates(const std::string& which,
                                                             const Catalog& c) const {
  if (which == "latest") return std::vector<int64_t>(c.restorable.rbegin(), c.restorable.rend());
  int64_t step = -1;
  if (absl::SimpleAtoi(which, &step) &&
      std::find(c.restorable.begin(), c.restorable.end(), step) != c.restorable.end()) {
    return std::vector<int64_t>{step};
  }
  // Of a step some shards have: which parts are missing.
  std::string parts;
  if (auto it = c.by_step.find(step); it != c.by_step.end()) {
    const uint32_t n = it->second.begin()->second.num_shards;
    std::vector<uint32_t> missing;
    for (uint32_t id = 0; id < n; ++id) {
      if (it->second.count(id) == 0) missing.push_back(id);
    }
    parts = absl::StrCat(" (the part of shard(s) ", absl::StrJoin(missing, ", "), " of ", n,
                         " is missing)");
  }
  return absl::NotFoundError(absl::StrCat(
      "no complete snapshot '", which, "' under ", options_.root, parts, "; restorable steps: [",
      absl::StrJoin(c.restorable, ", "), "]",
      c.damaged.empty() ? "" : absl::StrCat("; damaged files: ", absl::StrJoin(c.damaged, "; "))));
}

absl::StatusOr<Snapshotter::Loaded> Snapshotter::LoadStep(int64_t step, const Catalog& c) const {
  Loaded loaded;
  loaded.step = step;
  loaded.shard = std::make_unique<Shard>(shard_->options());
  ShardLoader visitor(loaded.shard.get());
  for (const auto& [id, info] : c.by_step.at(step)) {
    RETURN_IF_ERROR(ReadChain(*info.store, info.chain, loaded.shard.get(), &visitor));
  }
  loaded.shard->RestoreWorkers(visitor.workers());
  return loaded;
}

void Snapshotter::Install(Loaded loaded) {
  shard_->ReplaceWith(loaded.shard.get());
  // Loading may have found the newest snapshot damaged, which listed as complete before.
  auto list = store_->List();
  absl::MutexLock lock(&mu_);
  tip_.Reset();  // other table objects: the next snapshot is full
  restored_step_ = loaded.step;
  if (list.ok()) last_complete_step_ = list->empty() ? -1 : list->back().step();
}

absl::StatusOr<std::vector<int64_t>> Snapshotter::DropAfter(int64_t step) {
  constexpr absl::Duration kWait = absl::Minutes(1);
  const bool idle = AwaitIdle(absl::Now() + kWait);
  absl::MutexLock lock(&mu_);
  if (!idle || in_progress_) {
    return absl::DeadlineExceededError(absl::StrCat("the snapshot of step ", current_step_,
                                                    " is being written (waited ",
                                                    absl::FormatDuration(kWait), ")"));
  }
  ASSIGN_OR_RETURN(std::vector<SnapshotManifest> list, store_->List());
  std::vector<int64_t> dropped;
  for (const SnapshotManifest& m : list) {
    if (m.step() <= step) continue;
    RETURN_IF_ERROR(store_->Delete(m.step()));
    dropped.push_back(m.step());
  }
  return dropped;
}

absl::StatusOr<int64_t> Snapshotter::Restore(const std::string& which) {
  ASSIGN_OR_RETURN(Loaded loaded, Load(which));
  const int64_t step = loaded.step;
  if (step >= 0) Install(std::move(loaded));
  return step;
}

}  // namespace pscluster::ps
