#include "server/ps/table/shard.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/ps/table/row_lifecycle.h"

namespace pscluster::ps {

absl::Status ValidateTableSpec(const TableSpec& spec) {
  if (spec.kind() == TableSpec::DENSE) {
    if (spec.size() == 0)
      return absl::InvalidArgumentError("spec.size must be > 0 for a DENSE table");
  } else if (spec.kind() == TableSpec::SPARSE) {
    if (spec.dim() == 0)
      return absl::InvalidArgumentError("spec.dim must be > 0 for a SPARSE table");
  } else {
    return absl::InvalidArgumentError(absl::StrCat("spec.kind ", spec.kind(), " is unknown"));
  }
  const ConsistencyConfig& c = spec.consistency();
  if (!ConsistencyConfig::Mode_IsValid(c.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.consistency.mode ", c.mode(), " is unknown"));
  }
  if (c.staleness() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.consistency.staleness must be >= 0, got ", c.staleness()));
  }
  RETURN_IF_ERROR(core::ValidateInitializer(spec.initializer()));
  RETURN_IF_ERROR(ValidateRowPolicy(spec));
  auto optimizer = core::MakeOptimizer(spec.optimizer());
  return optimizer.ok() ? absl::OkStatus() : optimizer.status();
}

Shard::Shard(ShardOptions options) : options_(options) {}

RegisterWorkerResponse Shard::RegisterWorker(int32_t worker_id) {
  absl::MutexLock lock(&mu_);
  workers_.insert(worker_id);
  for (auto& [id, table] : tables_) table->AddWorker(worker_id);
  RegisterWorkerResponse r;
  r.set_shard_id(options_.shard_id);
  r.set_num_shards(options_.num_shards);
  for (int32_t w : workers_) r.add_registered_workers(w);
  return r;
}

UnregisterWorkerResponse Shard::UnregisterWorker(int32_t worker_id) {
  absl::MutexLock lock(&mu_);
  UnregisterWorkerResponse r;
  r.set_was_registered(workers_.erase(worker_id) > 0);
  for (auto& [id, table] : tables_) table->RemoveWorker(worker_id);
  for (int32_t w : workers_) r.add_registered_workers(w);
  return r;
}

long double Shard::DenseBytes(const TableSpec& spec) const {
  auto optimizer = core::MakeOptimizer(spec.optimizer());  // the spec is valid
  const uint64_t values =
      DenseShardRange(spec.size(), options_.shard_id, options_.num_shards).size();
  return static_cast<long double>(values) * 4 * (1 + (*optimizer)->num_slots());
}

absl::Status Shard::CheckSize(const TableSpec& spec) const {
  if (spec.kind() == TableSpec::SPARSE) {
    if (spec.dim() > options_.max_sparse_dim) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "spec.dim ", spec.dim(), " exceeds this server's limit ", options_.max_sparse_dim));
    }
    return absl::OkStatus();
  }
  const long double bytes = DenseBytes(spec);
  if (bytes > options_.max_table_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("spec.size ", spec.size(), " needs ", static_cast<double>(bytes),
                     " bytes of values and optimizer state on this shard; the limit is ",
                     options_.max_table_bytes, " (ps_server --max_table_bytes)"));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckRoomLocked(const TableSpec& spec) const {
  // What a new table takes at once: a dense table's values and state (<= max_table_bytes,
  // CheckSize), a sparse table's admission sketch (its rows come later).
  const uint64_t needs = spec.kind() == TableSpec::DENSE ? static_cast<uint64_t>(DenseBytes(spec))
                                                         : AdmissionSketchBytes(spec.rows());
  if (needs == 0) return absl::OkStatus();
  uint64_t held = 0;
  for (const auto& [id, t] : tables_) held += t->Stats().memory_bytes();
  if (held + needs <= options_.max_memory_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("table ", spec.table_id(), " needs ", needs, " bytes on this shard beside the ",
                   held, " its ", tables_.size(), " tables hold; the limit is ",
                   options_.max_memory_bytes, " (ps_server --max_memory_bytes)"));
}

absl::StatusOr<CreateTableResponse> Shard::CreateTable(const TableSpec& spec) {
  RETURN_IF_ERROR(ValidateTableSpec(spec));
  RETURN_IF_ERROR(CheckSize(spec));
  CreateTableResponse response;
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(spec.table_id());
  if (it != tables_.end()) {
    std::string diff;
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&diff);
    if (!differ.Compare(it->second->spec(), spec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("table ", spec.table_id(), " already exists with another spec: ", diff));
    }
    response.set_created(false);
    *response.mutable_info() = it->second->Info();
    return response;
  }
  RETURN_IF_ERROR(CheckRoomLocked(spec));
  std::unique_ptr<Table> table;
  if (spec.kind() == TableSpec::DENSE) {
    auto t = DenseTable::Create(
        spec, DenseShardRange(spec.size(), options_.shard_id, options_.num_shards));
    if (!t.ok()) return t.status();
    table = *std::move(t);
  } else {
    auto optimizer = core::MakeOptimizer(spec.optimizer());
    if (!optimizer.ok()) return optimizer.status();
    const bool versions = options_.track_row_versions;
    const uint64_t max_rows =
        options_.max_table_bytes / SparseTable::RowBytes(spec, (*optimizer)->num_slots(), versions);
    auto t = SparseTable::Create(spec, options_.shard_id, options_.num_shards, max_rows, versions,
                                 options_.disk_tier);
    if (!t.ok()) return t.status();
    table = *std::move(t);
  }
  for (int32_t w : workers_) table->AddWorker(w);
  response.set_created(true);
  *response.mutable_info() = table->Info();
  tables_[spec.table_id()] = std::move(table);
  return response;
}

absl::StatusOr<Table*> Shard::GetTable(uint32_t table_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tables_.find(table_id);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "table_id ", table_id, " does not exist on shard ", options_.shard_id,
        tables_.empty() ? " (it holds no table: restarted empty? start it with --restore, or "
                          "roll the cluster back to a checkpoint)"
                        : "",
        "; create it first"));
  }
  return it->second.get();
}

absl::Status CheckWorkerId(int32_t worker_id) {
  if (worker_id < 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker_id must be >= 0, got ", worker_id));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckWorker(int32_t worker_id) const {
  RETURN_IF_ERROR(CheckWorkerId(worker_id));
  absl::ReaderMutexLock lock(&mu_);
  if (!workers_.count(worker_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker_id ", worker_id, " is not registered with shard ", options_.shard_id,
                     "; call RegisterWorker first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Table*> Shard::GetForWorker(uint32_t table_id, int32_t worker_id,
                                           TableSpec::Kind kind) const {
  RETURN_IF_ERROR(CheckWorker(worker_id));
  Saw(worker_id);
  auto table = GetTable(table_id);
  if (!table.ok()) return table.status();
  if ((*table)->spec().kind() != kind) {
    const bool dense = kind == TableSpec::DENSE;
    return absl::FailedPreconditionError(
        absl::StrCat("table_id ", table_id, " is a ", dense ? "SPARSE" : "DENSE", " table; use ",
                     dense ? "PullSparse/PushSparse" : "PullDense/PushDense"));
  }
  return table;
}

absl::StatusOr<DenseTable*> Shard::GetDense(uint32_t table_id, int32_t worker_id) const {
  auto table = GetForWorker(table_id, worker_id, TableSpec::DENSE);
  if (!table.ok()) return table.status();
  return static_cast<DenseTable*>(*table);
}

absl::StatusOr<SparseTable*> Shard::GetSparse(uint32_t table_id, int32_t worker_id) const {
  auto table = GetForWorker(table_id, worker_id, TableSpec::SPARSE);
  if (!table.ok()) return table.status();
  return static_cast<SparseTable*>(*table);
}

std::vector<int32_t> Shard::Workers() const {
  absl::ReaderMutexLock lock(&mu_);
  return {workers_.begin(), workers_.end()};
}

namespace {
thread_local Shard::Visit* current_visit = nullptr;
}  // namespace

Shard::Visit::Visit(const Shard* shard, std::string client)
    : shard_(shard), client_(std::move(client)), outer_(current_visit) {
  current_visit = this;
}

Shard::Visit::~Visit() {
  current_visit = outer_;
  End(shard_, workers_);
}

void Shard::Visit::End(const Shard* shard, const std::vector<std::pair<int32_t, Seen*>>& workers) {
  if (workers.empty()) return;
  absl::MutexLock lock(&shard->seen_mu_);
  for (auto& [worker, seen] : workers) {
    seen->calls--;  // a record with calls in progress is never forgotten
    seen->last = absl::Now();
  }
}

std::unique_ptr<Shard::Visit::Held> Shard::Visit::Keep() {
  std::vector<std::pair<int32_t, Seen*>> kept;
  kept.swap(workers_);
  return std::unique_ptr<Held>(new Held(shard_, std::move(kept)));
}

Shard::Visit::Held::~Held() { End(shard_, workers_); }

Shard::Seen& Shard::SeenLocked(int32_t worker_id, const std::string& client) const {
  auto key = std::make_pair(worker_id, client);
  auto it = seen_.find(key);
  if (it != seen_.end()) return it->second;
  if (seen_.size() >= kMaxSeen) {
    const absl::Time now = absl::Now();
    if (now >= next_forget_) {  // a scan at most this often, however many ids come
      next_forget_ = now + kForgetAfter / 600;
      for (auto i = seen_.begin(); i != seen_.end();) {
        i = i->second.calls == 0 && now - i->second.last >= kForgetAfter ? seen_.erase(i)
                                                                         : std::next(i);
      }
    }
    if (seen_.size() >= kMaxSeen) return overflow_[worker_id];
  }
  return seen_[key];
}

void Shard::Saw(int32_t worker_id) const {
  Visit* visit =
      current_visit != nullptr && current_visit->shard_ == this ? current_visit : nullptr;
  absl::MutexLock lock(&seen_mu_);
  Seen& seen = SeenLocked(worker_id, visit != nullptr ? visit->client_ : std::string());
  seen.last = absl::Now();
  if (visit != nullptr &&
      std::find_if(visit->workers_.begin(), visit->workers_.end(),
                   [&](const auto& w) { return w.first == worker_id; }) == visit->workers_.end()) {
    visit->workers_.emplace_back(worker_id, &seen);  // in a call until the visit ends
    seen.calls++;
  }
}

StatsResponse Shard::Stats(const std::set<std::string>& except_clients) const {
  StatsResponse r;
  r.set_shard_id(options_.shard_id);
  r.set_num_shards(options_.num_shards);
  absl::ReaderMutexLock lock(&mu_);
  std::map<int32_t, int64_t> clocks;
  for (int32_t w : workers_) clocks[w] = 0;
  for (const auto& [id, table] : tables_) {
    *r.add_tables() = table->Stats();
    for (const auto& [w, c] : table->Clocks()) clocks[w] = std::max(clocks[w], c);
  }
  const absl::Time now = absl::Now();
  absl::MutexLock seen_lock(&seen_mu_);
  for (const auto& [w, c] : clocks) {
    WorkerClock* wc = r.add_workers();
    wc->set_worker_id(w);
    wc->set_clock(c);
    absl::Time last = absl::InfinitePast();
    int calls = 0;
    for (auto it = seen_.lower_bound({w, std::string()}); it != seen_.end() && it->first.first == w;
         ++it) {
      if (except_clients.count(it->first.second)) continue;
      last = std::max(last, it->second.last);
      calls += it->second.calls;
    }
    if (auto o = overflow_.find(w); o != overflow_.end()) {  // no client's to leave out
      last = std::max(last, o->second.last);
      calls += o->second.calls;
    }
    wc->set_calls(calls);
    wc->set_idle_ms(calls > 0                      ? 0
                    : last == absl::InfinitePast() ? -1
                                                   : absl::ToInt64Milliseconds(now - last));
  }
  return r;
}

std::vector<Table*> Shard::Tables() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<Table*> out;
  for (const auto& [id, table] : tables_) out.push_back(table.get());
  return out;
}

uint32_t Shard::Fingerprint() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::pair<uint32_t, uint32_t>> tables;
  for (const auto& [id, table] : tables_) tables.emplace_back(id, table->Fingerprint());
  return CombineFingerprints({workers_.begin(), workers_.end()}, tables);
}

uint32_t Shard::CombineFingerprints(const std::vector<int32_t>& workers,
                                    const std::vector<std::pair<uint32_t, uint32_t>>& tables) {
  uint32_t crc = crc32c::Value(reinterpret_cast<const char*>(workers.data()),
                               workers.size() * sizeof(int32_t));
  for (const auto& [id, fingerprint] : tables) {
    const uint32_t entry[2] = {id, fingerprint};
    crc = crc32c::Extend(crc, reinterpret_cast<const char*>(entry), sizeof entry);
  }
  return crc;
}

void Shard::RestoreWorkers(const std::vector<int32_t>& workers) {
  absl::MutexLock lock(&mu_);
  workers_.insert(workers.begin(), workers.end());
}

void Shard::ReplaceWith(Shard* staged) {
  std::map<uint32_t, std::unique_ptr<Table>> tables;
  std::set<int32_t> workers;
  {
    absl::MutexLock lock(&staged->mu_);
    tables.swap(staged->tables_);
    workers.swap(staged->workers_);
  }
  absl::MutexLock lock(&mu_);
  tables_.swap(tables);
  workers_.swap(workers);
}  // the old tables are freed here, outside the lock

void Shard::Shutdown(const absl::Status& why) {
  absl::ReaderMutexLock lock(&mu_);
  for (auto& [id, table] : tables_) table->Shutdown(why);
}

}  // namespace pscluster::ps
