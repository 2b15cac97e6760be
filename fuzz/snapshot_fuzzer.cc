// libFuzzer target: arbitrary bytes as a shard's snapshot file (the .psnap format of
// server/ps/snapshot/file_snapshot_store.h), then what ps_server --restore does: open the store
// (Snapshotter::Create, which refuses damaged files unless skip_damaged) and load the
// latest snapshot into a shard of its own. Every input must be refused with an error or
// load into a consistent shard; never crash, loop or allocate without bound (the shard
// refuses tables over 256 MiB; libFuzzer's -rss_limit_mb catches more).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "server/ps/snapshot/file_snapshot_store.h"
#include "server/ps/snapshot/snapshotter.h"

namespace fs = std::filesystem;

namespace {

// A private folder for this process, on tmpfs where there is one, removed at exit.
struct Root {
  Root() {
    path = std::string(fs::exists("/dev/shm") ? "/dev/shm" : "/tmp") + "/snapshot_fuzzer.XXXXXX";
    if (mkdtemp(path.data()) == nullptr) std::abort();
  }
  ~Root() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string path;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster::ps;
  static const Root temp;
  const std::string& root = temp.path;
  const std::string dir = ShardSnapshotDir(root, 0);
  const std::string path = FileSnapshotStore::SnapshotPath(dir, 1);
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  for (bool skip_damaged : {false, true}) {
    ShardOptions limits;  // named: ShardOptions has grown fields between these before
    limits.max_table_bytes = 256 << 20;
    limits.max_sparse_dim = 1024;
    Shard shard(limits);
    SnapshotterOptions o;
    o.root = root;
    o.skip_damaged = skip_damaged;
    auto snapshotter = Snapshotter::Create(&shard, o);
    if (!snapshotter.ok()) continue;
    auto loaded = (*snapshotter)->Load("latest");
    if (loaded.ok() && loaded->shard != nullptr) {
      loaded->shard->Stats();
      loaded->shard->Fingerprint();
    }
  }
  fs::remove(path);
  return 0;
}
