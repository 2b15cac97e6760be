// The C++ client's side of the Python client's interoperability test: pushes or pulls one
// table through PsClient, with the tensors in raw little-endian files, so the test can
// check that both clients see the same values of the same table.
//
//   cpp_peer --shards=A,B --worker=W --table=ID --step=S --size=N pull_dense OUT
//   cpp_peer ... --size=N push_dense GRADS
//   cpp_peer ... --dim=D pull_sparse KEYS OUT      (KEYS: uint64; OUT: keys x D float32)
//   cpp_peer ... --dim=D push_sparse KEYS GRADS
//
// Exits 0 on success; otherwise prints the client's error and exits 1.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "client/ps/ps_client.h"

ABSL_FLAG(std::string, shards, "", "Shard addresses, comma-separated, by shard id.");
ABSL_FLAG(int, worker, 0, "Worker id.");
ABSL_FLAG(uint32_t, table, 0, "Table id.");
ABSL_FLAG(int64_t, step, 0, "Step (clock) of the push or pull.");
ABSL_FLAG(uint64_t, size, 0, "Dense: the table's size.");
ABSL_FLAG(uint32_t, dim, 0, "Sparse: the table's row width.");

namespace {

template <typename T>
std::vector<T> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> out(bytes.size() / sizeof(T));
  std::copy(bytes.begin(), bytes.begin() + out.size() * sizeof(T),
            reinterpret_cast<char*>(out.data()));
  return out;
}

bool WriteFile(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return static_cast<bool>(out);
}

absl::Status Run(const std::vector<char*>& args) {
  if (args.size() < 3) return absl::InvalidArgumentError("usage: see cpp_peer.cc");
  pscluster::PsClientOptions o;
  o.shard_addresses = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',');
  o.worker_id = absl::GetFlag(FLAGS_worker);
  o.rpc_timeout = absl::Seconds(30);
  auto client = pscluster::PsClient::Create(o);
  if (!client.ok()) return client.status();
  if (absl::Status s = (*client)->RegisterWorker(); !s.ok()) return s;
  const std::string command = args[1];
  const uint32_t table = absl::GetFlag(FLAGS_table);
  const int64_t step = absl::GetFlag(FLAGS_step);
  if (command == "pull_dense") {
    std::vector<float> out(absl::GetFlag(FLAGS_size));
    if (absl::Status s = (*client)->PullDense(table, step, absl::MakeSpan(out)); !s.ok()) return s;
    return WriteFile(args[2], out) ? absl::OkStatus() : absl::InternalError("cannot write");
  }
  if (command == "push_dense") {
    return (*client)->PushDense(table, step, ReadFile<float>(args[2]));
  }
  if (args.size() < 4) return absl::InvalidArgumentError("sparse commands take two files");
  const std::vector<uint64_t> keys = ReadFile<uint64_t>(args[2]);
  if (command == "pull_sparse") {
    std::vector<float> out(keys.size() * absl::GetFlag(FLAGS_dim));
    if (absl::Status s = (*client)->PullSparse(table, step, keys, absl::MakeSpan(out)); !s.ok()) {
      return s;
    }
    return WriteFile(args[3], out) ? absl::OkStatus() : absl::InternalError("cannot write");
  }
  if (command == "push_sparse") {
    return (*client)->PushSparse(table, step, keys, ReadFile<float>(args[3]));
  }
  return absl::InvalidArgumentError("unknown command " + command);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  absl::Status s = Run(args);
  if (!s.ok()) {
    std::fprintf(stderr, "cpp_peer: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
