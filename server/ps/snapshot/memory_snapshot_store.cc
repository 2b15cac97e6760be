#include "server/ps/snapshot/memory_snapshot_store.h"

#include "absl/strings/str_cat.h"

namespace pscluster::ps {
namespace {

class MemorySnapshotStore final : public SnapshotStore {
 public:
  MemorySnapshotStore(std::string dir, std::shared_ptr<MemorySnapshotStorage::Dir> data,
                      bool read_only, std::function<bool()> fail,
                      std::function<bool()> fail_deletes)
      : dir_(std::move(dir)),
        data_(std::move(data)),
        read_only_(read_only),
        fail_(std::move(fail)),
        fail_deletes_(std::move(fail_deletes)) {}

  const std::string& dir() const override { return dir_; }

  absl::StatusOr<SnapshotManifest> Write(int64_t step,
                                         const std::vector<std::unique_ptr<TableImage>>& images,
                                         const WriteOptions& options) override {
    if (read_only_) return absl::FailedPreconditionError(dir_ + " is open read-only");
    if (fail_()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("snapshot of step ", step, " in ", dir_, ": no space left (test)"));
    }
    MemorySnapshotStorage::Snapshot snap;
    SnapshotManifest& m = snap.manifest;
    m.set_format_version(kSnapshotFormatVersion);
    m.set_step(step);
    m.set_shard_id(options.shard_id);
    m.set_num_shards(options.num_shards);
    m.set_has_metric(options.has_metric);
    m.set_metric(options.metric);
    if (options.base_step) {
      m.set_has_base(true);
      m.set_base_step(*options.base_step);
    }
    uint64_t bytes = 0;
    for (const auto& image : images) {
      snap.images.push_back(*image);
      bytes += image->bytes();
      TableChecksum* c = m.add_tables();
      c->set_table_id(image->header.spec().table_id());
      c->set_bytes(image->bytes());
    }
    m.set_bytes(bytes);
    if (options.bytes_written) *options.bytes_written += bytes;
    absl::MutexLock lock(&data_->mu);
    data_->snapshots[step] = std::move(snap);
    return m;
  }

  absl::StatusOr<std::vector<SnapshotManifest>> List() const override {
    absl::MutexLock lock(&data_->mu);
    std::vector<SnapshotManifest> out;
    for (const auto& [step, snap] : data_->snapshots) out.push_back(snap.manifest);
    return out;
  }

  absl::Status Delete(int64_t step) override {
    if (read_only_) return absl::FailedPreconditionError(dir_ + " is open read-only");
    if (fail_deletes_()) {
      return absl::UnavailableError(
          absl::StrCat("deleting the snapshot of step ", step, " in ", dir_, ": read-only (test)"));
    }
    absl::MutexLock lock(&data_->mu);
    data_->snapshots.erase(step);
    return absl::OkStatus();
  }

  absl::Status Read(int64_t step, Visitor* visitor) const override {
    std::vector<TableImage> images;
    {
      absl::MutexLock lock(&data_->mu);
      auto it = data_->snapshots.find(step);
      if (it == data_->snapshots.end()) {
        return absl::NotFoundError(
            absl::StrCat("no complete snapshot of step ", step, " in ", dir_));
      }
      images = it->second.images;
    }
    // Through the block encoding every layout shares, so that tests read what a file would.
    for (const TableImage& image : images) {
      const TableSnapshotHeader& h = image.header;
      if (absl::Status s = visitor->Header(h); !s.ok()) return s;
      uint64_t at = 0;
      absl::Status s = EmitBlocks(image, [&](const std::string& block) {
        return VisitBlock(h, block.data(), block.size(), &at, visitor, dir_);
      });
      if (s.ok()) s = CheckBlocksWhole(h, at, dir_);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  const std::string dir_;
  const std::shared_ptr<MemorySnapshotStorage::Dir> data_;
  const bool read_only_;
  const std::function<bool()> fail_;
  const std::function<bool()> fail_deletes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SnapshotStore>> MemorySnapshotStorage::Open(const std::string& dir,
                                                                           bool read_only) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Dir>& data = dirs_[dir];
  if (data == nullptr) {
    if (read_only) return absl::NotFoundError(absl::StrCat("no snapshot store in ", dir));
    data = std::make_shared<Dir>();
  }
  auto fail = [this] {
    absl::MutexLock lock(&mu_);
    return fail_writes_;
  };
  auto fail_deletes = [this] {
    absl::MutexLock lock(&mu_);
    return fail_deletes_;
  };
  return std::unique_ptr<SnapshotStore>(
      new MemorySnapshotStore(dir, data, read_only, fail, fail_deletes));
}

std::vector<std::string> MemorySnapshotStorage::ShardDirs(const std::string& root) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  const std::string prefix = root + "/shard-";
  for (const auto& [dir, data] : dirs_) {
    if (dir.rfind(prefix, 0) == 0) out.push_back(dir);
  }
  return out;
}

void MemorySnapshotStorage::FailWrites(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_writes_ = fail;
}

void MemorySnapshotStorage::FailDeletes(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_deletes_ = fail;
}

}  // namespace pscluster::ps
