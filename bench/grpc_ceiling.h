// The ceilings' raw gRPC streams (bench/ps_throughput): the same bytes in the same chunks
// as a parameter-server push or pull, with no table work: what gRPC itself allows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/raw.grpc.pb.h"
#include "bench/tcp_ceiling.h"
#include "common/sharding.h"
#include "grpcpp/grpcpp.h"

namespace pscluster::bench {

using ps::DenseChunk;

// Takes a push's chunks and drops them; answers a pull from a preallocated buffer.
class RawService final : public RawStream::Service {
 public:
  explicit RawService(uint64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}
  grpc::Status Push(grpc::ServerContext*, grpc::ServerReader<DenseChunk>* reader,
                    ps::PushDenseResponse* resp) override {
    DenseChunk c;
    uint64_t n = 0;
    while (reader->Read(&c)) n += c.data().size() / sizeof(float);
    resp->set_values_received(n);
    return grpc::Status::OK;
  }
  grpc::Status Pull(grpc::ServerContext*, const ps::PullDenseRequest* req,
                    grpc::ServerWriter<DenseChunk>* writer) override {
    if (source_.size() < req->length()) source_.resize(req->length(), 1.0f);
    const uint64_t per = chunk_bytes_ / sizeof(float);
    DenseChunk c;
    for (uint64_t done = 0; done < req->length(); done += per) {
      uint64_t n = std::min(per, req->length() - done);
      c.set_offset(req->offset() + done);
      c.mutable_data()->resize(n * sizeof(float));
      std::memcpy(c.mutable_data()->data(), source_.data() + done, n * sizeof(float));
      if (!writer->Write(c)) break;
    }
    return grpc::Status::OK;
  }

 private:
  const uint64_t chunk_bytes_;
  std::vector<float> source_;  // one pull at a time per server in this benchmark
};

// Raw ceiling client: the same split across shards, in parallel, same chunks.
class RawClient {
 public:
  RawClient(const std::vector<std::string>& addresses, uint64_t chunk_bytes)
      : chunk_bytes_(chunk_bytes) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    for (const auto& a : addresses) {
      stubs_.push_back(RawStream::NewStub(
          grpc::CreateCustomChannel(a, grpc::InsecureChannelCredentials(), args)));
    }
  }
  void Push(const std::vector<float>& data) {
    OnShards(data.size(), [&](int s, Range r) {
      grpc::ClientContext ctx;
      ps::PushDenseResponse resp;
      auto w = stubs_[s]->Push(&ctx, &resp);
      const uint64_t per = chunk_bytes_ / sizeof(float);
      DenseChunk c;
      for (uint64_t done = 0; done < r.size(); done += per) {
        uint64_t n = std::min(per, r.size() - done);
        c.set_offset(r.begin + done);
        c.set_data(data.data() + r.begin + done, n * sizeof(float));
        w->Write(c);
      }
      w->WritesDone();
      w->Finish();
    });
  }
  void Pull(std::vector<float>* out) {
    OnShards(out->size(), [&](int s, Range r) {
      grpc::ClientContext ctx;
      ps::PullDenseRequest req;
      req.set_offset(r.begin);
      req.set_length(r.size());
      auto reader = stubs_[s]->Pull(&ctx, req);
      DenseChunk c;
      uint64_t got = 0;
      while (reader->Read(&c)) {
        std::memcpy(out->data() + r.begin + got, c.data().data(), c.data().size());
        got += c.data().size() / sizeof(float);
      }
      reader->Finish();
    });
  }

 private:
  template <typename Fn>
  void OnShards(uint64_t size, Fn fn) {
    OnEachShard(static_cast<int>(stubs_.size()), size, fn);
  }
  const uint64_t chunk_bytes_;
  std::vector<std::unique_ptr<RawStream::Stub>> stubs_;
};

}  // namespace pscluster::bench
