#include "tools/psctl/export_command.h"

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "server/ps/export/table_export.h"

ABSL_FLAG(std::string, data_dir, "", "export: the checkpoint root (ps_server --data_dir).");
ABSL_FLAG(std::string, table, "", "export: the sparse table, by name or id.");
ABSL_FLAG(std::string, out, "", "export: the RocksDB directory to make (it must not exist).");

namespace pscluster::psctl {

int ExportCommand(std::optional<int64_t> step) {
  pscluster::ps::ExportRequest r;
  r.root = absl::GetFlag(FLAGS_data_dir);
  r.table = absl::GetFlag(FLAGS_table);
  r.out = absl::GetFlag(FLAGS_out);
  r.which = step ? std::to_string(*step) : "latest";
  if (r.root.empty() || r.table.empty() || r.out.empty()) {
    std::fputs("psctl export: give --data_dir=CHECKPOINT_ROOT --table=NAME|ID --out=NEW_DIR\n",
               stderr);
    return 2;
  }
  std::fprintf(stderr, "psctl export: reading snapshot %s of every shard under %s\n",
               r.which.c_str(), r.root.c_str());
  const auto result = pscluster::ps::ExportTable(r);
  if (!result.ok()) {
    std::fprintf(stderr, "psctl export: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  std::printf("exported table %u of step %lld: %llu rows of dim %u, %.1f MB in %s\n",
              result->table_id, static_cast<long long>(result->step),
              static_cast<unsigned long long>(result->rows), result->dim, result->bytes / 1e6,
              r.out.c_str());
  return 0;
}

}  // namespace pscluster::psctl
