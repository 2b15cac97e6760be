#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/collective/communicator.h"

namespace pscluster::collective {
namespace {

// The one adapter from Gloo's exceptions.
template <typename Fn>
absl::Status Guard(const std::string& what, Fn fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    const bool timeout =
        msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos;
    return timeout ? absl::DeadlineExceededError(absl::StrCat(what, ": ", msg))
                   : absl::UnavailableError(absl::StrCat(what, ": ", msg));
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, absl::Duration timeout)
      : context_(std::move(context)), timeout_(absl::ToChronoMilliseconds(timeout)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    if (data.empty()) return absl::OkStatus();
    return Guard(absl::StrCat("all-reduce of ", data.size(), " floats on rank ", rank()), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  // Ring reduce-scatter over point-to-point messages: size()-1 steps, each sending one
  // block to the next rank and adding the block received from the previous one.
  absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) override {
    const size_t n = out.size();
    if (in.size() != n * size()) {
      return absl::InvalidArgumentError(absl::StrCat("reduce-scatter input holds ", in.size(),
                                                     " floats, expected ", size(), " x ", n));
    }
    std::vector<float> acc(in.begin(), in.end()), incoming(n);
    const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
    const int tag = NextTag();
    for (int s = 0; s + 1 < size() && n > 0; ++s) {
      const int send_block = (rank() - s - 1 + 2 * size()) % size();
      const int recv_block = (rank() - s - 2 + 2 * size()) % size();
      absl::Status st = Exchange(absl::MakeConstSpan(acc).subspan(send_block * n, n), next, tag,
                                 absl::MakeSpan(incoming), prev, tag,
                                 absl::StrCat("reduce-scatter step on rank ", rank(), " (to rank ",
                                              next, ", from rank ", prev, ")"));
      if (!st.ok()) return st;
      for (size_t i = 0; i < n; ++i) acc[recv_block * n + i] += incoming[i];
    }
    std::copy_n(acc.begin() + rank() * n, n, out.begin());
    return absl::OkStatus();
  }

  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override {
    if (out.size() != in.size() * size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-gather output holds ", out.size(), " floats, expected ", size(), " x ", in.size()));
    }
    if (in.empty()) return absl::OkStatus();
    return Guard(absl::StrCat("all-gather of ", in.size(), " floats on rank ", rank()), [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<float*>(in.data()), in.size());
      opts.setOutput(out.data(), out.size());
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  absl::Status Broadcast(absl::Span<float> data, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
    }
    if (data.empty()) return absl::OkStatus();
    return Guard(absl::StrCat("broadcast from rank ", root, " on rank ", rank()), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setRoot(root);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  absl::Status Send(absl::Span<const float> data, int peer, int tag) override {
    if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
    return Guard(absl::StrCat("send to rank ", peer, " (tag ", tag, ")"), [&] {
      auto buf = context_->createUnboundBuffer(const_cast<float*>(data.data()),
                                               data.size() * sizeof(float));
      buf->send(peer, static_cast<uint64_t>(tag));
      if (!buf->waitSend(nullptr, timeout_)) throw std::runtime_error("send aborted");
    });
  }

  absl::Status Recv(absl::Span<float> data, int peer, int tag) override {
    if (absl::Status s = CheckPeer(peer); !s.ok()) return s;
    return Guard(absl::StrCat("receive from rank ", peer, " (tag ", tag, ")"), [&] {
      auto buf = context_->createUnboundBuffer(data.data(), data.size() * sizeof(float));
      buf->recv(peer, static_cast<uint64_t>(tag));
      if (!buf->waitRecv(nullptr, timeout_)) throw std::runtime_error("receive aborted");
    });
  }

  absl::Status SendRecv(absl::Span<const float> out, int to, int send_tag, absl::Span<float> in,
                        int from, int recv_tag) override {
    if (absl::Status s = CheckPeer(to); !s.ok()) return s;
    if (absl::Status s = CheckPeer(from); !s.ok()) return s;
    return Exchange(out, to, send_tag, in, from, recv_tag,
                    absl::StrCat("send to rank ", to, " (tag ", send_tag,
                                 ") and receive from rank ", from, " (tag ", recv_tag, ")"));
  }

  absl::Status Barrier() override {
    return Guard(absl::StrCat("barrier on rank ", rank()), [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  absl::Status CheckPeer(int peer) const {
    if (peer < 0 || peer >= size() || peer == rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer ", peer, " is not another rank of ", size()));
    }
    return absl::OkStatus();
  }

  // Sends `out` to `to` while receiving `in` from `from` (both posted before waiting, so
  // a ring of these never deadlocks).
  absl::Status Exchange(absl::Span<const float> out, int to, int send_tag, absl::Span<float> in,
                        int from, int recv_tag, const std::string& what) {
    return Guard(what, [&] {
      auto send =
          context_->createUnboundBuffer(const_cast<float*>(out.data()), out.size() * sizeof(float));
      auto recv = context_->createUnboundBuffer(in.data(), in.size() * sizeof(float));
      recv->recv(from, static_cast<uint64_t>(recv_tag));
      send->send(to, static_cast<uint64_t>(send_tag));
      if (!recv->waitRecv(nullptr, timeout_) || !send->waitSend(nullptr, timeout_)) {
        throw std::runtime_error("aborted");
      }
    });
  }

  // Collective tags: distinct per call, identical across ranks (same call order), and kept
  // apart from user tags of Send/Recv by the high bit.
  uint32_t NextTag() { return 0x80000000u | (tag_++ & 0x7fffffffu); }

  std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(gloo::rendezvous::Store* store,
                                                                     const GlooOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, ", options.size, ")"));
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
  absl::Status s = Guard(absl::StrCat("connecting rank ", options.rank, " of ", options.size), [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context->connectFullMesh(*store, device);
  });
  if (!s.ok()) return s;
  return std::unique_ptr<Communicator>(new GlooCommunicator(context, options.timeout));
}

}  // namespace pscluster::collective
