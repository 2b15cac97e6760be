#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/barrier.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
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

// Ring collectives on a mesh of synchronous pairs: the calling thread writes and reads the
// sockets itself. Gloo's asynchronous pairs hand every message to its event-loop thread and
// wake the caller when it is done; with few cores (two workers on two here) those
// hand-offs, not the bytes, were most of an all-reduce's time (in training, 2.5 ms of a
// ~1 MB all-reduce against 0.6 ms this way). Bound buffers over the caller's memory, one
// fresh slot per call (every rank calls in the same order). Writes block, so in each ring
// step rank 0 sends before it receives and every other rank receives before it sends: no
// cycle of ranks all blocked in writes, whatever the socket buffer sizes.
class SyncRing {
 public:
  explicit SyncRing(std::shared_ptr<gloo::Context> context) : context_(std::move(context)) {}

  int rank() const { return context_->rank; }
  int size() const { return context_->size; }

  // Block k of `count` floats: [k*c, min(count, (k+1)*c)) with c = ceil(count / size()).
  std::pair<size_t, size_t> Block(size_t count, int k) const {
    const size_t c = (count + size() - 1) / size();
    const size_t begin = std::min(count, k * c);
    return {begin, std::min(count, begin + c) - begin};
  }

  // In place: afterwards block rank() of data holds the sum over ranks of that block.
  void ReduceScatter(float* data, size_t count) {
    const size_t c = (count + size() - 1) / size();
    scratch_.resize(c);
    const int slot = context_->nextSlot();
    auto send = Next().createSendBuffer(slot, data, count * sizeof(float));
    auto recv = Prev().createRecvBuffer(slot, scratch_.data(), c * sizeof(float));
    for (int s = 0; s + 1 < size(); ++s) {
      const auto [sb, sn] = Block(count, (rank() - s - 1 + 2 * size()) % size());
      const auto [rb, rn] = Block(count, (rank() - s - 2 + 2 * size()) % size());
      Step(send.get(), sb, sn, 0, recv.get());
      for (size_t i = 0; i < rn; ++i) data[rb + i] += scratch_[i];
    }
  }

  // In place: afterwards every block k of data holds rank k's block k.
  void AllGather(float* data, size_t count) {
    const int slot = context_->nextSlot();
    auto send = Next().createSendBuffer(slot, data, count * sizeof(float));
    auto recv = Prev().createRecvBuffer(slot, data, count * sizeof(float));
    for (int s = 0; s + 1 < size(); ++s) {
      const auto [sb, sn] = Block(count, (rank() - s + size()) % size());
      Step(send.get(), sb, sn, sb, recv.get());
    }
  }

 private:
  gloo::transport::Pair& Next() { return *context_->getPair((rank() + 1) % size()); }
  gloo::transport::Pair& Prev() { return *context_->getPair((rank() + size() - 1) % size()); }

  // Sends floats [offset, offset + n) to the next rank (at roffset there) and receives the
  // previous rank's message into `recv`, in the order that cannot deadlock.
  void Step(gloo::transport::Buffer* send, size_t offset, size_t n, size_t roffset,
            gloo::transport::Buffer* recv) {
    const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
    auto do_send = [&] {
      try {
        send->send(offset * sizeof(float), n * sizeof(float), roffset * sizeof(float));
        send->waitSend();
      } catch (const std::exception& e) {
        throw std::runtime_error(absl::StrCat("sending to rank ", next, ": ", e.what()));
      }
    };
    auto do_recv = [&] {
      try {
        recv->waitRecv();
      } catch (const std::exception& e) {
        throw std::runtime_error(absl::StrCat("receiving from rank ", prev, ": ", e.what()));
      }
    };
    if (rank() == 0) {
      do_send();
      do_recv();
    } else {
      do_recv();
      do_send();
    }
  }

  std::shared_ptr<gloo::Context> context_;
  std::vector<float> scratch_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context,
                   std::shared_ptr<gloo::Context> sync_context, absl::Duration timeout)
      : context_(std::move(context)),
        ring_(std::move(sync_context)),
        timeout_(absl::ToChronoMilliseconds(timeout)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    if (data.empty() || size() == 1) return absl::OkStatus();
    return Guard(absl::StrCat("all-reduce of ", data.size(), " floats on rank ", rank()), [&] {
      ring_.ReduceScatter(data.data(), data.size());
      ring_.AllGather(data.data(), data.size());
    });
  }

  absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) override {
    const size_t n = out.size();
    if (in.size() != n * size()) {
      return absl::InvalidArgumentError(absl::StrCat("reduce-scatter input holds ", in.size(),
                                                     " floats, expected ", size(), " x ", n));
    }
    if (n == 0) return absl::OkStatus();
    if (size() == 1) {
      std::copy(in.begin(), in.end(), out.begin());
      return absl::OkStatus();
    }
    acc_.assign(in.begin(), in.end());
    return Guard(absl::StrCat("reduce-scatter of ", in.size(), " floats on rank ", rank()), [&] {
      ring_.ReduceScatter(acc_.data(), acc_.size());  // equal blocks: block r is out's
      std::copy_n(acc_.begin() + rank() * n, n, out.begin());
    });
  }

  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override {
    if (out.size() != in.size() * size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-gather output holds ", out.size(), " floats, expected ", size(), " x ", in.size()));
    }
    if (in.empty()) return absl::OkStatus();
    std::copy(in.begin(), in.end(), out.begin() + rank() * in.size());
    if (size() == 1) return absl::OkStatus();
    return Guard(absl::StrCat("all-gather of ", in.size(), " floats on rank ", rank()),
                 [&] { ring_.AllGather(out.data(), out.size()); });
  }

  absl::Status Broadcast(absl::Span<float> data, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
    }
    if (data.empty() || size() == 1) return absl::OkStatus();
    const uint64_t slot = NextTag();
    return Guard(absl::StrCat("broadcast from rank ", root, " on rank ", rank()), [&] {
      // Gloo's binomial tree (gloo::broadcast), with one buffer per peer so that a failure
      // names the peer it happened with, not just this rank: in the round of `mask`, the
      // ranks [0, mask) (counted from the root) have the data and send it to [mask, 2 mask).
      const int n = size(), vrank = (rank() - root + n) % n;
      const size_t bytes = data.size() * sizeof(float);
      std::string failed;  // what failed, each naming its peer
      auto named = [&](const char* what, int peer, auto fn) {
        try {
          fn();
          return true;
        } catch (const std::exception& e) {
          absl::StrAppend(&failed, failed.empty() ? "" : "; ", what, " rank ", peer, ": ",
                          e.what());
          return false;
        }
      };
      std::vector<std::pair<int, std::unique_ptr<gloo::transport::UnboundBuffer>>> sends;
      for (int mask = 1; mask < n; mask <<= 1) {
        if (vrank < mask && vrank + mask < n) {
          const int peer = (vrank + mask + root) % n;
          auto buf = context_->createUnboundBuffer(data.data(), bytes);
          if (named("sending to", peer, [&] { buf->send(peer, slot); })) {
            sends.emplace_back(peer, std::move(buf));
          }
        } else if (vrank >= mask && vrank < 2 * mask) {  // before any send of this rank
          const int peer = (vrank - mask + root) % n;
          auto buf = context_->createUnboundBuffer(data.data(), bytes);
          named("receiving from", peer, [&] {
            buf->recv(peer, slot);
            if (!buf->waitRecv(nullptr, timeout_)) throw std::runtime_error("aborted");
          });
          if (!failed.empty()) throw std::runtime_error(failed);
        }
      }
      for (auto& send : sends) {  // all waited for: the data must outlive them
        named("sending to", send.first, [&] {
          if (!send.second->waitSend(nullptr, timeout_)) throw std::runtime_error("aborted");
        });
      }
      if (!failed.empty()) throw std::runtime_error(failed);
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
  SyncRing ring_;  // all-reduce, reduce-scatter, all-gather
  std::vector<float> acc_;
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
  auto sync_context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
  sync_context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
  absl::Status s = Guard(absl::StrCat("connecting rank ", options.rank, " of ", options.size), [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context->connectFullMesh(*store, device);
    gloo::rendezvous::PrefixStore sync_store("sync", *store);
    sync_context->connectFullMesh(sync_store, device);
    for (int r = 0; r < options.size; ++r) {
      if (r != options.rank) sync_context->getPair(r)->setSync(true, /*busyPoll=*/false);
    }
  });
  if (!s.ok()) return s;
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(context, sync_context, options.timeout));
}

}  // namespace pscluster::collective
