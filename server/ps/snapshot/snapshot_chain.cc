#include "server/ps/snapshot/snapshot_chain.h"

#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {

absl::StatusOr<std::vector<int64_t>> ChainOf(int64_t step,
                                             const std::map<int64_t, SnapshotManifest>& manifests,
                                             absl::string_view dir) {
  std::vector<int64_t> chain;
  for (int64_t at = step;;) {
    auto it = manifests.find(at);
    if (it == manifests.end()) {
      return absl::NotFoundError(absl::StrCat(
          "the snapshot of step ", chain.empty() ? step : chain.back(), " in ", dir,
          " holds the changes since step ", at, ", which is not there (deleted or damaged)"));
    }
    chain.push_back(at);
    if (!it->second.has_base()) break;
    if (it->second.base_step() >= at) {  // a manifest that verifies cannot say this, but
      return absl::DataLossError(absl::StrCat("the snapshot of step ", at, " in ", dir,
                                              " builds on a later step, ", it->second.base_step()));
    }
    at = it->second.base_step();
  }
  return std::vector<int64_t>(chain.rbegin(), chain.rend());
}

namespace {

// One old shard's chain into a ShardLoader, newest link first (see the header comment).
class ChainVisitor final : public SnapshotStore::Visitor {
 public:
  ChainVisitor(Shard* shard, SnapshotStore::Visitor* loader) : shard_(shard), loader_(loader) {}

  void BeginLink(bool newest) { newest_ = newest; }
  // What this link removed or held whole now binds the older links.
  void EndLink() {
    for (auto& [id, keys] : removed_now_) removed_[id].insert(keys.begin(), keys.end());
    removed_now_.clear();
    done_.insert(whole_now_.begin(), whole_now_.end());
    whole_now_.clear();
  }

  absl::Status Header(const TableSnapshotHeader& h) override {
    const uint32_t id = h.spec().table_id();
    if (newest_) {
      tables_.insert(id);
      if (!h.changes_only()) whole_now_.insert(id);
      return loader_->Header(h);
    }
    if (!Wanted(id)) return absl::OkStatus();  // gone by the newest link
    ASSIGN_OR_RETURN(Table * table, shard_->GetTable(id));
    if (table->spec().SerializeAsString() != h.spec().SerializeAsString()) {
      return absl::DataLossError(
          absl::StrCat("table ", id, " has another spec in an older link of its snapshot chain"));
    }
    if (h.spec().kind() == TableSpec::SPARSE) sparse_[id] = static_cast<SparseTable*>(table);
    if (!h.changes_only()) whole_now_.insert(id);
    return absl::OkStatus();
  }
  absl::Status DenseBlock(const TableSnapshotHeader& h, uint64_t begin, uint64_t n,
                          const float* data) override {
    return newest_ ? loader_->DenseBlock(h, begin, n, data) : absl::OkStatus();
  }
  absl::Status SparseRow(const TableSnapshotHeader& h, uint64_t key, int64_t updates, int64_t step,
                         const float* data) override {
    const uint32_t id = h.spec().table_id();
    if (!newest_) {
      if (!Wanted(id) || removed_[id].contains(key) || sparse_.at(id)->HasRow(key)) {
        return absl::OkStatus();  // a newer link set or removed it, or dropped the table
      }
    }
    return loader_->SparseRow(h, key, updates, step, data);
  }
  absl::Status SparseRemoved(const TableSnapshotHeader& h, const uint64_t* keys,
                             size_t n) override {
    const uint32_t id = h.spec().table_id();
    if (newest_ || Wanted(id)) removed_now_[id].insert(keys, keys + n);
    return absl::OkStatus();
  }

 private:
  // Whether an older link's part of table `id` still counts.
  bool Wanted(uint32_t id) const { return tables_.count(id) > 0 && done_.count(id) == 0; }

  Shard* const shard_;
  SnapshotStore::Visitor* const loader_;
  bool newest_ = true;
  std::set<uint32_t> tables_;                // the newest link's
  std::set<uint32_t> done_, whole_now_;      // held whole by a newer link, by this one
  std::map<uint32_t, SparseTable*> sparse_;  // the loading shard's, by id
  std::map<uint32_t, absl::flat_hash_set<uint64_t>> removed_, removed_now_;
};

}  // namespace

absl::Status ReadChain(const SnapshotStore& store, const std::vector<int64_t>& steps, Shard* shard,
                       SnapshotStore::Visitor* loader) {
  ChainVisitor visitor(shard, loader);
  for (size_t i = steps.size(); i-- > 0;) {
    visitor.BeginLink(i + 1 == steps.size());
    RETURN_IF_ERROR(store.Read(steps[i], &visitor));
    visitor.EndLink();
  }
  return absl::OkStatus();
}

CaptureSince ChainTip::SinceFor(const Table& table) const {
  if (!step_ || links_ + 1 >= full_every_) return std::nullopt;
  for (const Captured& c : tables_) {
    if (c.table_id == table.id() && c.incarnation == table.incarnation()) return c.version;
  }
  return std::nullopt;
}

std::vector<ChainTip::Captured> ChainTip::Of(
    const std::vector<std::unique_ptr<TableImage>>& images) {
  std::vector<Captured> out;
  for (const auto& i : images) {
    out.push_back({i->header.spec().table_id(), i->incarnation, i->version});
  }
  return out;
}

bool ChainTip::ChangesOnly(const std::vector<std::unique_ptr<TableImage>>& images) {
  for (const auto& i : images) {
    if (i->header.changes_only()) return true;
  }
  return false;
}

void ChainTip::Completed(int64_t step, std::optional<int64_t> base, std::vector<Captured> tables) {
  links_ = base ? links_ + 1 : 0;
  step_ = step;
  tables_ = std::move(tables);
}

}  // namespace pscluster::ps
