// A client stream of 1 MiB chunks into gRPC's synchronous server (a handler thread reads
// message after message) and into its callback server (a read reactor, each message handed
// over in OnReadDone; and a raw method parsing each message's bytes itself), the server
// only parsing each chunk and dropping it, beside the same bytes through a bare loopback
// socket (bench/tcp_ceiling.h): what gRPC itself costs to receive a large push either way,
// with no table work. Why it matters: the shard's
// PushDenseStream as a read reactor ran at 0.64-0.66x the synchronous handler at 64 MiB
// (bench/history/2026-12-06-push-stream-callback.md). Sides interleaved, medians.
//
//   bazel run -c opt //bench:stream_read_modes -- --sizes_mib=16,64 --rounds=7
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/median.h"
#include "bench/raw.grpc.pb.h"
#include "bench/tcp_ceiling.h"
#include "common/malloc_mode.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"16", "64"}),
          "Transfer sizes in MiB, sent as 1 MiB chunks.");
ABSL_FLAG(int, reps, 9, "Timed transfers of each kind per round (after 2 warm-ups).");
ABSL_FLAG(int, rounds, 7, "Rounds; each figure is the median of the rounds' medians.");

namespace pscluster::bench {
namespace {

using ps::DenseChunk;
constexpr size_t kChunkBytes = size_t{1} << 20;

class SyncPush final : public RawStream::Service {
  grpc::Status Push(grpc::ServerContext*, grpc::ServerReader<DenseChunk>* reader,
                    ps::PushDenseResponse* resp) override {
    DenseChunk c;
    uint64_t bytes = 0;
    while (reader->Read(&c)) bytes += c.data().size();
    resp->set_values_received(bytes / sizeof(float));
    return grpc::Status::OK;
  }
};

class CallbackPush final : public RawStream::CallbackService {
  class Reader final : public grpc::ServerReadReactor<DenseChunk> {
   public:
    explicit Reader(ps::PushDenseResponse* resp) : resp_(resp) { StartRead(&chunk_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        resp_->set_values_received(bytes_ / sizeof(float));
        return Finish(grpc::Status::OK);
      }
      bytes_ += chunk_.data().size();
      StartRead(&chunk_);
    }
    void OnDone() override { delete this; }

   private:
    ps::PushDenseResponse* const resp_;
    DenseChunk chunk_;
    uint64_t bytes_ = 0;
  };
  grpc::ServerReadReactor<DenseChunk>* Push(grpc::CallbackServerContext*,
                                            ps::PushDenseResponse* resp) override {
    return new Reader(resp);
  }
};

// The callback server reading each message's bytes (a raw method) and parsing them itself,
// as the shard's raw methods do.
class RawCallbackPush final : public RawStream::WithRawCallbackMethod_Push<RawStream::Service> {
  class Reader final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
   public:
    explicit Reader(grpc::ByteBuffer* resp) : resp_(resp) { StartRead(&message_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        ps::PushDenseResponse r;
        r.set_values_received(bytes_ / sizeof(float));
        bool own = false;
        grpc::SerializationTraits<ps::PushDenseResponse>::Serialize(r, resp_, &own);
        return Finish(grpc::Status::OK);
      }
      grpc::ByteBuffer copy(message_);
      if (!grpc::SerializationTraits<DenseChunk>::Deserialize(&copy, &chunk_).ok()) {
        return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "did not parse"));
      }
      message_.Clear();
      bytes_ += chunk_.data().size();
      StartRead(&message_);
    }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer* const resp_;
    grpc::ByteBuffer message_;
    DenseChunk chunk_;
    uint64_t bytes_ = 0;
  };
  grpc::ServerReadReactor<grpc::ByteBuffer>* Push(grpc::CallbackServerContext*,
                                                  grpc::ByteBuffer* resp) override {
    return new Reader(resp);
  }
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  b.SetMaxReceiveMessageSize(8 << 20);
  b.RegisterService(service);
  return b.BuildAndStart();
}

// Seconds to push `mib` MiB as 1 MiB chunks over one stream, answered.
double PushOnce(RawStream::Stub* stub, const DenseChunk& chunk, int mib) {
  const absl::Time start = absl::Now();
  grpc::ClientContext ctx;
  ps::PushDenseResponse resp;
  auto writer = stub->Push(&ctx, &resp);
  for (int i = 0; i < mib; ++i) {
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok() || resp.values_received() * sizeof(float) != uint64_t{1} * mib * kChunkBytes) {
    std::fprintf(stderr, "stream_read_modes: a push failed: %s\n", s.error_message().c_str());
    std::exit(1);
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// The same bytes through a bare loopback socket, answered by one byte (the ceiling).
double MedianTcp(TcpClient* tcp, std::vector<float>* data, int mib, int reps) {
  data->assign(uint64_t{1} * mib * kChunkBytes / sizeof(float), 1.0f);
  auto once = [&] {
    const absl::Time start = absl::Now();
    tcp->Push(*data);
    return absl::ToDoubleSeconds(absl::Now() - start);
  };
  for (int i = 0; i < 2; ++i) once();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(once());
  return Median(t);
}

double MedianPush(RawStream::Stub* stub, const DenseChunk& chunk, int mib, int reps) {
  for (int i = 0; i < 2; ++i) PushOnce(stub, chunk, mib);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(PushOnce(stub, chunk, mib));
  return Median(t);
}

// A way to move `mib` MiB: its name and the seconds one transfer takes (median of reps).
struct Side {
  const char* name;
  std::function<double(int mib)> seconds;
};

// Each side's GB/s (medians of the rounds' medians, sides interleaved within a round), then
// the gRPC sides' goodput over the socket's (sides[0]) and over the synchronous server's
// (sides[1]), medians of per-round ratios.
void Compare(const std::vector<Side>& sides, int mib) {
  std::vector<std::vector<double>> t(sides.size()), over_tcp(sides.size()), over_sync(sides.size());
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    for (size_t i = 0; i < sides.size(); ++i) t[i].push_back(sides[i].seconds(mib));
    for (size_t i = 1; i < sides.size(); ++i) {
      over_tcp[i].push_back(t[0].back() / t[i].back());
      over_sync[i].push_back(t[1].back() / t[i].back());
    }
  }
  const double bytes = 1.0 * mib * kChunkBytes;
  std::printf("%8d |", mib);
  for (const auto& v : t) std::printf(" %9.3f", bytes / Median(v) / 1e9);
  std::printf(" |");
  for (size_t i = 1; i < sides.size(); ++i) std::printf(" %9.2f", Median(over_tcp[i]));
  std::printf(" |");
  for (size_t i = 2; i < sides.size(); ++i) std::printf(" %9.2f", Median(over_sync[i]));
  std::printf("\n");
}

int Run() {
  SyncPush sync;
  CallbackPush callback;
  RawCallbackPush raw;
  int sync_port = 0, callback_port = 0, raw_port = 0;
  auto sync_server = Serve(&sync, &sync_port);
  auto callback_server = Serve(&callback, &callback_port);
  auto raw_server = Serve(&raw, &raw_port);
  std::vector<std::unique_ptr<TcpServer>> tcp_server;
  tcp_server.push_back(std::make_unique<TcpServer>());
  TcpClient tcp(tcp_server);
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(8 << 20);
  auto stub = [&](int port) {
    return RawStream::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                                        grpc::InsecureChannelCredentials(), args));
  };
  auto sync_stub = stub(sync_port), callback_stub = stub(callback_port), raw_stub = stub(raw_port);
  DenseChunk chunk;
  chunk.set_data(std::string(kChunkBytes, '\1'));
  const int reps = absl::GetFlag(FLAGS_reps);
  auto grpc_side = [&](const char* name, RawStream::Stub* s) {
    return Side{name, [&chunk, s, reps](int mib) { return MedianPush(s, chunk, mib, reps); }};
  };
  std::vector<float> bytes;
  const std::vector<Side> sides = {
      {"tcp", [&](int mib) { return MedianTcp(&tcp, &bytes, mib, reps); }},
      grpc_side("sync", sync_stub.get()),
      grpc_side("callback", callback_stub.get()),
      grpc_side("raw", raw_stub.get())};
  std::printf("client stream of 1 MiB chunks, GB/s (median of %d rounds) | over tcp | over sync\n",
              absl::GetFlag(FLAGS_rounds));
  std::printf("%8s | %9s %9s %9s %9s | %9s %9s %9s | %9s %9s\n", "MiB", "tcp", "sync", "callback",
              "raw", "sync", "callback", "raw", "callback", "raw");
  for (const std::string& size : absl::GetFlag(FLAGS_sizes_mib)) {
    int mib = 0;
    if (!absl::SimpleAtoi(size, &mib) || mib <= 0) return 2;
    Compare(sides, mib);
  }
  return 0;
}

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pscluster::ShardMallocMode();
  return pscluster::bench::Run();
}
