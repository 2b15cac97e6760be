// What large requests cost a ps_server in memory: starts a real ps_server (a fresh one per
// scenario), fires rounds of concurrent pushes of a few MB each, over a connection each, and
// reports the server's resident memory before, at its peak and after.
//
//   bazel build //bench:request_memory //server/ps:ps_server
//   B=bazel-out/k8-fastbuild/bin
//   $B/bench/request_memory --server=$B/server/ps/ps_server [--server_args=--flag=x,...]
//
// Scenarios: unary pushes over the message limit or outside the shard's range, push streams
// that end one chunk short (refused after every byte arrived), start outside the range, or
// carry a chunk over the limit, accepted streams, and streams of 64 KiB chunks after one of
// 4 MiB chunks on the same connection. RSS is sampled from /proc/PID/status every
// millisecond while requests run (peak), and read again --settle_ms after the last round
// (after; ps_server gives idle memory back after 2 s), and once more --settle_ms after the
// clients disconnected (closed). VmHWM is the kernel's high-water mark.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/proc_status.h"
#include "client/ps/shard_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/ps.grpc.pb.h"
#include "tests/subprocess.h"

ABSL_FLAG(std::string, server, "bazel-bin/server/ps/ps_server", "The ps_server binary.");
ABSL_FLAG(std::vector<std::string>, server_args, {}, "Extra ps_server flags.");
ABSL_FLAG(int, concurrency, 16, "Requests in flight at once.");
ABSL_FLAG(int, rounds, 4, "Rounds of `concurrency` requests per scenario.");
ABSL_FLAG(uint64_t, request_mib, 8, "Bytes of floats each request carries, in MiB.");
ABSL_FLAG(int, settle_ms, 4000, "Wait after the last round before reading 'after'.");
ABSL_FLAG(std::vector<std::string>, scenarios,
          std::vector<std::string>({"unary_oversized", "unary_wrong_range", "stream_truncated",
                                    "stream_wrong_range", "stream_oversized_chunk",
                                    "stream_accepted", "stream_small_chunks"}),
          "Which requests to send (each against a fresh server).");
ABSL_FLAG(std::string, json, "", "Also write the results as JSON lines to this file.");

namespace pscluster::bench {
namespace {

using ps::DenseChunk;

constexpr uint32_t kTable = 1;
constexpr uint64_t kChunkBytes = 1 << 20;  // stream chunk size, as PsClient sends them

std::unique_ptr<pscluster::ShardStub> Connect(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each, like workers
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(64 << 20);
  return pscluster::ShardStub::New(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

DenseChunk Chunk(int64_t step, uint64_t begin, uint64_t offset, uint64_t total, uint64_t n) {
  DenseChunk c;
  c.set_worker_id(0);
  c.set_step(step);
  c.set_table_id(kTable);
  c.set_begin(begin);
  c.set_offset(offset);
  c.set_total_length(total);
  c.mutable_data()->assign(n * sizeof(float), '\0');  // zeros: finite
  return c;
}

grpc::Status Unary(pscluster::ShardStub* stub, const DenseChunk& c) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  ps::PushDenseResponse r;
  return stub->PushDense(&ctx, c, &r);
}

// Writes `chunks` (stopping at the first failed write) and finishes the stream.
grpc::Status Stream(pscluster::ShardStub* stub, const std::vector<DenseChunk>& chunks) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  ps::PushDenseResponse r;
  auto writer = stub->PushDenseStream(&ctx, &r);
  for (const DenseChunk& c : chunks) {
    if (!writer->Write(c)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

// One request of `scenario` (client `i` of round `round`); returns its status.
grpc::Status Fire(pscluster::ShardStub* stub, const std::string& scenario, uint64_t values,
                  uint64_t table_size, int64_t step) {
  const uint64_t per = kChunkBytes / sizeof(float);
  std::vector<DenseChunk> chunks;
  if (scenario == "unary_oversized") return Unary(stub, Chunk(step, 0, 0, values, values));
  if (scenario == "unary_wrong_range") {
    const uint64_t n = (4u << 20) / sizeof(float);  // at the unary limit, past the range
    return Unary(stub, Chunk(step, table_size, table_size, n, n));
  }
  if (scenario == "stream_small_chunks") {
    // A truncated stream of 64 KiB chunks, after an accepted one of 4 MiB chunks on the same
    // connection: the large chunks' buffers are recycled for the small ones.
    const uint64_t big = (4u << 20) / sizeof(float), small = (64u << 10) / sizeof(float);
    for (uint64_t done = 0; done < values; done += big) {
      chunks.push_back(Chunk(step, 0, done, values, std::min(big, values - done)));
    }
    grpc::Status s = Stream(stub, chunks);
    if (!s.ok()) return s;
    chunks.clear();
    for (uint64_t done = 0; done < values; done += small) {
      chunks.push_back(Chunk(step + 1000, 0, done, values + small, std::min(small, values - done)));
    }
    return Stream(stub, chunks);
  }
  if (scenario == "stream_truncated" || scenario == "stream_accepted") {
    // Declares one chunk more than it sends (truncated: refused after every byte arrived).
    const bool truncate = scenario == "stream_truncated";
    const uint64_t total = values + (truncate ? per : 0);
    for (uint64_t done = 0; done < values; done += per) {
      chunks.push_back(Chunk(step, 0, done, total, std::min(per, values - done)));
    }
  } else if (scenario == "stream_wrong_range") {
    for (uint64_t done = 0; done < values; done += per) {
      chunks.push_back(Chunk(step, table_size, table_size + done, values, per));
    }
  } else if (scenario == "stream_oversized_chunk") {
    chunks.push_back(Chunk(step, 0, 0, values, values));
  } else {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unknown scenario " + scenario);
  }
  return Stream(stub, chunks);
}

struct Result {
  std::string scenario;
  Rss before, peak, after, closed;
  int ok = 0, refused = 0;
  std::string sample_error;
};

// ps_server with --server_args, started; a failure ends the program.
testing::Subprocess StartServer(std::string* address) {
  std::vector<std::string> argv = {absl::GetFlag(FLAGS_server), "--port=0"};
  for (const std::string& a : absl::GetFlag(FLAGS_server_args)) argv.push_back(a);
  auto server = testing::Subprocess::Start(argv);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  auto line = server->WaitForLine("listening on", absl::Seconds(60));
  if (!line.ok()) {
    std::fprintf(stderr, "%s\n", line.status().ToString().c_str());
    std::exit(1);
  }
  *address = *testing::ListeningAddress(*line);
  return *std::move(server);
}

// Registers worker 0 and creates the ASP table of `table_size` values.
void CreateTable(const std::string& address, uint64_t table_size) {
  auto stub = Connect(address);
  grpc::ClientContext ctx;
  ps::RegisterWorkerRequest reg;
  ps::RegisterWorkerResponse rr;
  (void)stub->RegisterWorker(&ctx, reg, &rr);
  grpc::ClientContext ctx2;
  ps::CreateTableRequest req;
  ps::TableSpec* spec = req.mutable_spec();
  spec->set_table_id(kTable);
  spec->set_size(table_size);
  spec->mutable_optimizer()->set_learning_rate(0.01f);
  spec->mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
  ps::CreateTableResponse cr;
  grpc::Status s = stub->CreateTable(&ctx2, req, &cr);
  if (!s.ok()) {
    std::fprintf(stderr, "CreateTable: %s\n", s.error_message().c_str());
    std::exit(1);
  }
}

// --rounds rounds of one request per stub at once: what the server said to each.
void FireRounds(const std::vector<std::unique_ptr<pscluster::ShardStub>>& stubs,
                const std::string& scenario, uint64_t values, uint64_t table_size, Result* res) {
  const int n = static_cast<int>(stubs.size());
  std::atomic<int> ok{0}, refused{0};
  absl::Mutex mu;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i, round] {
        grpc::Status s = Fire(stubs[i].get(), scenario, values, table_size, round);
        if (s.ok()) {
          ++ok;
        } else {
          ++refused;
          absl::MutexLock lock(&mu);
          if (res->sample_error.empty()) {
            res->sample_error = absl::StrCat(s.error_code(), ": ", s.error_message());
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  res->ok = ok;
  res->refused = refused;
}

Result Run(const std::string& scenario) {
  Result res{scenario};
  std::string address;
  testing::Subprocess server = StartServer(&address);
  const int n = absl::GetFlag(FLAGS_concurrency);
  const uint64_t values = (absl::GetFlag(FLAGS_request_mib) << 20) / sizeof(float);
  const uint64_t table_size = 2 * values;  // room for a request of `values`, plus more
  CreateTable(address, table_size);
  std::vector<std::unique_ptr<pscluster::ShardStub>> stubs;
  for (int i = 0; i < n; ++i) stubs.push_back(Connect(address));  // one connection each
  absl::SleepFor(absl::Milliseconds(200));
  res.before = ReadRss(server.pid());
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done.load()) {
      Rss r = ReadRss(server.pid());
      res.peak.rss_kib = std::max(res.peak.rss_kib, r.rss_kib);
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  FireRounds(stubs, scenario, values, table_size, &res);
  absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_settle_ms)));
  done = true;
  sampler.join();
  res.after = ReadRss(server.pid());
  res.peak.hwm_kib = res.after.hwm_kib;
  stubs.clear();  // the clients disconnect: what the server kept per connection goes too
  absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_settle_ms)));
  res.closed = ReadRss(server.pid());
  (void)server.Stop(SIGTERM, absl::Seconds(20));
  return res;
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using pscluster::bench::Result;
  std::printf("%d concurrent requests x %d rounds, %lu MiB each\n",
              absl::GetFlag(FLAGS_concurrency), absl::GetFlag(FLAGS_rounds),
              static_cast<unsigned long>(absl::GetFlag(FLAGS_request_mib)));
  std::printf("%-24s %10s %10s %10s %10s %10s %5s %7s  %s\n", "scenario", "before MiB", "peak MiB",
              "HWM MiB", "after MiB", "closed MiB", "ok", "refused", "first error");
  std::string json;
  for (const std::string& scenario : absl::GetFlag(FLAGS_scenarios)) {
    Result r = pscluster::bench::Run(scenario);
    auto mib = [](uint64_t kib) { return kib / 1024.0; };
    std::printf("%-24s %10.0f %10.0f %10.0f %10.0f %10.0f %5d %7d  %.100s\n", r.scenario.c_str(),
                mib(r.before.rss_kib), mib(r.peak.rss_kib), mib(r.peak.hwm_kib),
                mib(r.after.rss_kib), mib(r.closed.rss_kib), r.ok, r.refused,
                r.sample_error.c_str());
    std::fflush(stdout);
    json +=
        absl::StrCat("{\"scenario\": \"", r.scenario, "\", \"before_kib\": ", r.before.rss_kib,
                     ", \"peak_kib\": ", r.peak.rss_kib, ", \"hwm_kib\": ", r.peak.hwm_kib,
                     ", \"after_kib\": ", r.after.rss_kib, ", \"closed_kib\": ", r.closed.rss_kib,
                     ", \"ok\": ", r.ok, ", \"refused\": ", r.refused, "}\n");
  }
  if (!absl::GetFlag(FLAGS_json).empty()) std::ofstream(absl::GetFlag(FLAGS_json)) << json;
  return 0;
}
