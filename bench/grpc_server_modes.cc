// One tensor pushed and pulled as one gRPC message each way, against gRPC's synchronous
// server (what ps_server runs) and its callback server (no handler thread per call), over
// 1 and more connections per server (the tensor split across them, sent in parallel), and
// the same bytes over a plain loopback socket (bench/tcp_ceiling.h: a request and its answer,
// no RPC system), and one long-lived bidirectional stream per connection carrying each
// request and its answer as one message each way (no call set-up per tensor).
// Calls interleaved, medians.
//
//   bazel run -c opt //bench:grpc_server_modes -- --sizes_kib=64,1024 --rounds=5
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/median.h"
#include "bench/raw.grpc.pb.h"
#include "bench/tcp_ceiling.h"
#include "common/executor.h"
#include "common/malloc_mode.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::vector<std::string>, sizes_kib, std::vector<std::string>({"64", "1024"}),
          "Tensor sizes in KiB.");
ABSL_FLAG(std::vector<std::string>, connections, std::vector<std::string>({"1", "2"}),
          "Connections per server the tensor is split across.");
ABSL_FLAG(int, reps, 200, "Timed calls of each kind per round (after 10 warm-ups).");
ABSL_FLAG(int, rounds, 5, "Rounds; each figure is the median of the rounds' medians.");
ABSL_FLAG(std::string, optimization_target, "",
          "gRPC's grpc.optimization_target on both ends (latency, blend, throughput).");

namespace pscluster::bench {
namespace {

using ps::DenseChunk;

// What pulls answer with: at most kMaxValues.
constexpr uint64_t kMaxValues = uint64_t{64} << 20 >> 2;
const float* Source() {
  static const std::vector<float>* s = new std::vector<float>(kMaxValues, 1.0f);
  return s->data();
}

class SyncRaw final : public RawUnary::Service {
  grpc::Status Push(grpc::ServerContext*, const DenseChunk* c,
                    ps::PushDenseResponse* resp) override {
    resp->set_values_received(c->data().size() / sizeof(float));
    return grpc::Status::OK;
  }
  grpc::Status Pull(grpc::ServerContext*, const ps::PullDenseRequest* req, DenseChunk* c) override {
    if (req->length() > kMaxValues) return grpc::Status(grpc::INVALID_ARGUMENT, "too long");
    c->set_data(Source(), req->length() * sizeof(float));
    return grpc::Status::OK;
  }
};

class CallbackRaw final : public RawUnary::CallbackService {
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const DenseChunk* c,
                                 ps::PushDenseResponse* resp) override {
    resp->set_values_received(c->data().size() / sizeof(float));
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const ps::PullDenseRequest* req,
                                 DenseChunk* c) override {
    auto* r = ctx->DefaultReactor();
    if (req->length() > kMaxValues) {
      r->Finish(grpc::Status(grpc::INVALID_ARGUMENT, "too long"));
      return r;
    }
    c->set_data(Source(), req->length() * sizeof(float));
    r->Finish(grpc::Status::OK);
    return r;
  }
};

class BidiRaw final : public RawBidi::Service {
  grpc::Status Exchange(grpc::ServerContext*,
                        grpc::ServerReaderWriter<DenseChunk, DenseChunk>* stream) override {
    DenseChunk in;
    while (stream->Read(&in)) {
      DenseChunk out;
      if (!in.data().empty()) {
        out.set_total_length(in.data().size() / sizeof(float));
      } else if (in.total_length() <= kMaxValues) {
        out.set_data(Source(), in.total_length() * sizeof(float));
      } else {
        return grpc::Status(grpc::INVALID_ARGUMENT, "too long");
      }
      if (!stream->Write(out)) break;
    }
    return grpc::Status::OK;
  }
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  b.SetMaxReceiveMessageSize(256 << 20);
  b.SetMaxSendMessageSize(256 << 20);
  if (!absl::GetFlag(FLAGS_optimization_target).empty()) {
    b.AddChannelArgument(GRPC_ARG_OPTIMIZATION_TARGET, absl::GetFlag(FLAGS_optimization_target));
  }
  b.RegisterService(service);
  return b.BuildAndStart();
}

// One connection of k to a server: channels that do not share a subchannel.
std::shared_ptr<grpc::Channel> Connect(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!absl::GetFlag(FLAGS_optimization_target).empty()) {
    args.SetString(GRPC_ARG_OPTIMIZATION_TARGET, absl::GetFlag(FLAGS_optimization_target));
  }
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

// The tensor split across k parts, sent in parallel (the caller's thread takes part 0).
class Splitter {
 public:
  explicit Splitter(int k) : k_(k), pool_(k - 1) {}
  template <typename Fn>
  void Split(uint64_t size, Fn fn) {
    absl::Status st = pool_.ParallelFor(k_, [&](int i) {
      const uint64_t begin = size * i / k_, end = size * (i + 1) / k_;
      return fn(i, begin, end - begin) ? absl::OkStatus() : absl::InternalError("call failed");
    });
    if (!st.ok()) std::abort();
  }

 private:
  const int k_;
  Executor pool_;
};

// Unary calls over k connections to one server.
class Client {
 public:
  Client(int port, int k) : split_(k) {
    for (int i = 0; i < k; ++i) stubs_.push_back(RawUnary::NewStub(Connect(port)));
  }
  void Push(const std::vector<float>& data) {
    split_.Split(data.size(), [&](int i, uint64_t begin, uint64_t n) {
      grpc::ClientContext ctx;
      DenseChunk c;
      c.set_data(data.data() + begin, n * sizeof(float));
      ps::PushDenseResponse resp;
      return stubs_[i]->Push(&ctx, c, &resp).ok() && resp.values_received() == n;
    });
  }
  void Pull(std::vector<float>* out) {
    split_.Split(out->size(), [&](int i, uint64_t begin, uint64_t n) {
      grpc::ClientContext ctx;
      ps::PullDenseRequest req;
      req.set_length(n);
      DenseChunk c;
      if (!stubs_[i]->Pull(&ctx, req, &c).ok() || c.data().size() != n * sizeof(float)) {
        return false;
      }
      std::memcpy(out->data() + begin, c.data().data(), c.data().size());
      return true;
    });
  }

 private:
  Splitter split_;
  std::vector<std::unique_ptr<RawUnary::Stub>> stubs_;
};

// One stream per connection, opened once: each push or pull is a message each way on it.
class StreamClient {
 public:
  StreamClient(int port, int k) : split_(k), contexts_(k) {
    for (int i = 0; i < k; ++i) {
      stubs_.push_back(RawBidi::NewStub(Connect(port)));
      streams_.push_back(stubs_.back()->Exchange(&contexts_[i]));
    }
  }
  ~StreamClient() {
    for (auto& s : streams_) {
      s->WritesDone();
      s->Finish().IgnoreError();
    }
  }
  void Push(const std::vector<float>& data) {
    split_.Split(data.size(), [&](int i, uint64_t begin, uint64_t n) {
      DenseChunk c;
      c.set_data(data.data() + begin, n * sizeof(float));
      DenseChunk answer;
      return streams_[i]->Write(c) && streams_[i]->Read(&answer) && answer.total_length() == n;
    });
  }
  void Pull(std::vector<float>* out) {
    split_.Split(out->size(), [&](int i, uint64_t begin, uint64_t n) {
      DenseChunk req, c;
      req.set_total_length(n);
      if (!streams_[i]->Write(req) || !streams_[i]->Read(&c) ||
          c.data().size() != n * sizeof(float)) {
        return false;
      }
      std::memcpy(out->data() + begin, c.data().data(), c.data().size());
      return true;
    });
  }

 private:
  Splitter split_;
  std::vector<grpc::ClientContext> contexts_;
  std::vector<std::unique_ptr<RawBidi::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<DenseChunk, DenseChunk>>> streams_;
};

}  // namespace
}  // namespace pscluster::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  pscluster::ShardMallocMode();
  using namespace pscluster::bench;
  SyncRaw sync_service;
  CallbackRaw callback_service;
  BidiRaw bidi_service;
  int sync_port = 0, callback_port = 0, bidi_port = 0;
  auto sync_server = Serve(&sync_service, &sync_port);
  auto callback_server = Serve(&callback_service, &callback_port);
  auto bidi_server = Serve(&bidi_service, &bidi_port);
  std::vector<std::unique_ptr<TcpServer>> tcp_server;
  tcp_server.push_back(std::make_unique<TcpServer>());
  TcpClient tcp(tcp_server);
  const int reps = absl::GetFlag(FLAGS_reps), rounds = absl::GetFlag(FLAGS_rounds);
  std::printf("GB/s, medians of %d rounds; ratios: medians of per-round ratios to raw TCP\n",
              rounds);
  std::printf("%-9s %-5s | %-8s %7s %7s %7s %7s | %7s %7s %7s\n", "tensor", "conns", "dir", "tcp",
              "sync", "cb", "stream", "sync/t", "cb/t", "strm/t");
  for (const std::string& kib_flag : absl::GetFlag(FLAGS_sizes_kib)) {
    const uint64_t bytes = std::stoull(kib_flag) << 10;
    std::vector<float> data(bytes / 4, 0.5f), out(bytes / 4);
    for (const std::string& k_flag : absl::GetFlag(FLAGS_connections)) {
      const int k = std::stoi(k_flag);
      Client sync_client(sync_port, k), callback_client(callback_port, k);
      StreamClient stream_client(bidi_port, k);
      for (int pull = 0; pull < 2; ++pull) {
        std::vector<double> t[4], r[3];  // tcp, sync, callback, stream; each / tcp
        for (int round = 0; round < rounds; ++round) {
          std::vector<double> s[4];
          for (int i = 0; i < reps + 10; ++i) {
            auto time = [&](auto fn) {
              absl::Time t0 = absl::Now();
              fn();
              return absl::ToDoubleSeconds(absl::Now() - t0);
            };
            double a = time([&] { pull ? tcp.Pull(&out) : tcp.Push(data); });
            double b = time([&] { pull ? sync_client.Pull(&out) : sync_client.Push(data); });
            double c =
                time([&] { pull ? callback_client.Pull(&out) : callback_client.Push(data); });
            double d = time([&] { pull ? stream_client.Pull(&out) : stream_client.Push(data); });
            if (i < 10) continue;
            s[0].push_back(a), s[1].push_back(b), s[2].push_back(c), s[3].push_back(d);
          }
          for (int j = 0; j < 4; ++j) t[j].push_back(bytes / Median(s[j]) / 1e9);
          for (int j = 0; j < 3; ++j) r[j].push_back(t[j + 1].back() / t[0].back());
        }
        std::printf("%6lu KiB %-5d | %-8s %7.3f %7.3f %7.3f %7.3f | %7.2f %7.2f %7.2f\n",
                    static_cast<unsigned long>(bytes >> 10), k, pull ? "pull" : "push",
                    Median(t[0]), Median(t[1]), Median(t[2]), Median(t[3]), Median(r[0]),
                    Median(r[1]), Median(r[2]));
        std::fflush(stdout);
      }
    }
  }
  sync_server->Shutdown();
  callback_server->Shutdown();
  bidi_server->Shutdown();
  return 0;
}
