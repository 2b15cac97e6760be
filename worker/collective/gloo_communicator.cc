#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "gloo/barrier.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "worker/collective/communicator.h"
#include "worker/collective/gloo_store.h"

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

// Ring collectives and point-to-point messages on a mesh of synchronous pairs: the calling
// thread writes and reads the sockets itself. Gloo's asynchronous pairs hand every message
// to its event-loop thread and wake the caller when it is done (an unbound buffer's send
// also waits for the receiver's "ready" notice); with few cores (two workers on two here)
// those hand-offs, not the bytes, were most of an all-reduce's time (in training, 2.5 ms
// of a ~1 MB all-reduce against 0.6 ms this way) and of a pipeline stage's idle time.
// Bound buffers over the caller's memory, created per call. Writes block until the bytes
// are in the socket, so a rank that sends a message over kEagerBytes and also receives
// writes first only if its rank is below the one it receives from: a cycle
// of ranks all blocked in writes would need each to write to a lower rank that writes
// first, which cannot close. A synchronous pair reads its messages in the order they were
// sent, so two ranks must receive each other's point-to-point messages in that order.
// Before each blocking read the caller polls the socket for up to GlooOptions::spin.
class SyncPairs {
 public:
  SyncPairs(std::shared_ptr<gloo::Context> context, absl::Duration spin, absl::Duration timeout)
      : context_(std::move(context)),
        spin_(absl::ToChronoMicroseconds(spin)),
        timeout_(timeout),
        sockets_(Sockets()) {}

  // Between the slices of a receive's wait (Communicator::SetWaitCheck).
  void SetWaitCheck(std::function<absl::Status()> check, absl::Duration slice) {
    wait_check_ = std::move(check);
    wait_slice_ = slice;
  }

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
    const int slot = NextSlot();
    auto send = Next().createSendBuffer(slot, data, count * sizeof(float));
    auto recv = Prev().createRecvBuffer(slot, scratch_.data(), c * sizeof(float));
    for (int s = 0; s + 1 < size(); ++s) {
      const auto [sb, sn] = Block(count, (rank() - s - 1 + 2 * size()) % size());
      const auto [rb, rn] = Block(count, (rank() - s - 2 + 2 * size()) % size());
      Step(send.get(), sb, sn, 0, recv.get(), rn);
      for (size_t i = 0; i < rn; ++i) data[rb + i] += scratch_[i];
    }
  }

  // In place: afterwards every block k of data holds rank k's block k.
  void AllGather(float* data, size_t count) {
    const int slot = NextSlot();
    auto send = Next().createSendBuffer(slot, data, count * sizeof(float));
    auto recv = Prev().createRecvBuffer(slot, data, count * sizeof(float));
    for (int s = 0; s + 1 < size(); ++s) {
      const auto [sb, sn] = Block(count, (rank() - s + size()) % size());
      const size_t rn = Block(count, (rank() - s - 1 + size()) % size()).second;
      Step(send.get(), sb, sn, sb, recv.get(), rn);
    }
  }

  // Gloo's binomial tree (gloo::broadcast): in the round of `mask`, the ranks [0, mask)
  // (counted from the root) have the data and send it to [mask, 2 mask). Each rank
  // receives before it sends, and a tree has no cycle of writers to deadlock.
  void Broadcast(float* data, size_t count, int root) {
    const int slot = NextSlot(), n = size(), vrank = (rank() - root + n) % n;
    const size_t bytes = count * sizeof(float);
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vrank < mask && vrank + mask < n) {
        const int peer = (vrank + mask + root) % n;
        Named("sending to", peer, [&] { Write(peer, slot, data, bytes); });
      } else if (vrank >= mask && vrank < 2 * mask) {
        const int peer = (vrank - mask + root) % n;
        Named("receiving from", peer, [&] {
          auto recv = context_->getPair(peer)->createRecvBuffer(slot, data, bytes);
          Receive(recv.get(), peer, bytes);
        });
      }
    }
  }

  // Point to point: sends `out` to `to` (unless to < 0) and receives `in` from `from`
  // (unless null), in the order that cannot deadlock; tags are below kMaxTag.
  void SendRecv(absl::Span<const float> out, int to, int send_tag, absl::Span<float>* in, int from,
                int recv_tag) {
    std::unique_ptr<gloo::transport::Buffer> recv;
    if (in != nullptr) {  // registered before anything is read from the pair
      recv = context_->getPair(from)->createRecvBuffer(P2pSlot(from, rank(), recv_tag), in->data(),
                                                       in->size() * sizeof(float));
    }
    const size_t bytes = out.size() * sizeof(float);
    auto do_send = [&] {
      if (to >= 0) Write(to, P2pSlot(rank(), to, send_tag), out.data(), bytes);
    };
    if (recv == nullptr || bytes <= kEagerBytes || rank() < from) {
      do_send();
      if (recv != nullptr) Receive(recv.get(), from, in->size() * sizeof(float));
    } else {
      Receive(recv.get(), from, in->size() * sizeof(float));
      do_send();
    }
  }

  static constexpr int kMaxTag = 1 << 29;
  // A message this small is written first whatever the ranks, so that the peer finds it
  // waiting instead of paying a round trip of wake-ups for it: the socket takes it whole
  // without the peer reading (Gloo sizes the send buffer to the message, which Linux
  // doubles, and the peer's receive window starts at 64 KiB). At 64 KiB both writes
  // stalled: an exchange took twice as long as in turn (bench/p2p_latency).
  static constexpr size_t kEagerBytes = 32 << 10;
  static constexpr size_t kSpinBytes = 32 << 10;

 private:
  // Collectives' slots: below 2^30, the same sequence on every rank.
  int NextSlot() { return slot_++ % (1 << 30); }

  // A point-to-point message's slot: above the collectives', with its direction, since a
  // buffer's destruction unregisters its slot on the pair whichever buffer registered it
  // (a send buffer must not drop the receive buffer of the same tag from the same peer).
  static int P2pSlot(int sender, int receiver, int tag) {
    return (1 << 30) + 2 * tag + (sender < receiver ? 1 : 0);
  }

  // Writes one message of `bytes` to `peer`'s buffer at `slot`.
  void Write(int peer, int slot, const float* data, size_t bytes) {
    auto send = context_->getPair(peer)->createSendBuffer(slot, const_cast<float*>(data), bytes);
    send->send(0, bytes);
    send->waitSend();
  }

  // Reads the message of up to `bytes` for `recv` from `from`.
  void Receive(gloo::transport::Buffer* recv, int from, size_t bytes) {
    if (!AwaitBytes(from, bytes)) AwaitReadable(from);
    try {
      recv->waitRecv();
    } catch (const std::exception& e) {
      // Gloo's words when the message at the head of the pair is for a slot with no buffer.
      if (std::string(e.what()).find("read() returned false") == std::string::npos) throw;
      throw std::runtime_error(
          "a message for another operation came first: ranks must make the same collective "
          "calls in the same order, and receive each other's point-to-point messages in the "
          "order they were sent");
    }
  }

  // With a wait check: waits for the socket from `peer` to have something to read in slices;
  // after each empty slice the check may end the wait (a member declared dead: throws its
  // reason), and the first one is said on stderr; the whole wait is bounded by the timeout.
  // Gloo's read then takes the message (its own timeout runs from there).
  void AwaitReadable(int peer) {
    const int fd = sockets_[peer];
    if (fd < 0 || !wait_check_) return;
    const absl::Time start = absl::Now(), end = start + timeout_;
    for (bool said = false;;) {
      pollfd p{fd, POLLIN, 0};
      const absl::Duration slice = std::min(wait_slice_, end - absl::Now());
      const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(slice)));
      if (ready != 0) return;  // readable, closed or failed: the read says which
      if (absl::Now() >= end) {
        throw std::runtime_error(absl::StrCat("timed out after ",
                                              absl::FormatDuration(absl::Now() - start),
                                              " with nothing from rank ", peer));
      }
      if (absl::Status check = wait_check_(); !check.ok()) {
        throw std::runtime_error(absl::StrCat("gave up waiting for rank ", peer, " after ",
                                              absl::FormatDuration(absl::Now() - start), ": ",
                                              check.message()));
      }
      if (!said) {
        LogWarning(
            "rank %d: still waiting for rank %d (%s so far; the collective "
            "timeout is %s)",
            rank(), peer, absl::FormatDuration(absl::Now() - start).c_str(),
            absl::FormatDuration(timeout_).c_str());
        said = true;
      }
    }
  }

  // Polls the socket from `peer` until `bytes` have arrived (at most kSpinBytes: a larger
  // message may not fit the receive window until read) or the spin has passed, before the
  // blocking read: a thread that sleeps in the read takes tens of microseconds to wake
  // (more on a virtual machine's idle core), paid at every ring step and every
  // micro-batch's exchange of a pipeline. True when something has arrived (no need to
  // wait for it to be readable).
  bool AwaitBytes(int peer, size_t bytes) {
    const int fd = sockets_[peer];
    if (fd < 0 || spin_.count() <= 0) return false;
    const int want = static_cast<int>(std::clamp<size_t>(bytes, 1, kSpinBytes));
    const auto end = std::chrono::steady_clock::now() + spin_;
    int queued = 0;
    while ((ioctl(fd, FIONREAD, &queued) != 0 || queued < want) &&
           std::chrono::steady_clock::now() < end) {
    }
    return queued > 0;
  }

  // Each peer's socket (-1 where not found): Gloo keeps the descriptor to itself, so it is
  // the one of this process whose local address is the pair's.
  std::vector<int> Sockets() const {
    std::vector<int> fds(size(), -1);
    std::vector<sockaddr_storage> want(size());
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      const auto* a =
          dynamic_cast<const gloo::transport::tcp::Address*>(&context_->getPair(r)->address());
      if (a != nullptr) want[r] = a->getSockaddr();
    }
    if (size() == 1) return fds;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      int fd = -1;
      if (!absl::SimpleAtoi(entry.path().filename().string(), &fd)) continue;
      sockaddr_storage got{};
      socklen_t len = sizeof(got);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&got), &len) != 0) continue;
      for (int r = 0; r < size(); ++r) {
        if (r != rank() && want[r].ss_family != AF_UNSPEC &&
            std::memcmp(&got, &want[r], len) == 0) {
          fds[r] = fd;
        }
      }
    }
    return fds;
  }

  // Runs one transfer, naming the peer in what it throws.
  template <typename Fn>
  static void Named(const char* what, int peer, Fn fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      throw std::runtime_error(absl::StrCat(what, " rank ", peer, ": ", e.what()));
    }
  }

  gloo::transport::Pair& Next() { return *context_->getPair((rank() + 1) % size()); }
  gloo::transport::Pair& Prev() { return *context_->getPair((rank() + size() - 1) % size()); }

  // Sends floats [offset, offset + n) to the next rank (at roffset there) and receives the
  // previous rank's message of recv_n floats into `recv`, in the order that cannot deadlock.
  void Step(gloo::transport::Buffer* send, size_t offset, size_t n, size_t roffset,
            gloo::transport::Buffer* recv, size_t recv_n) {
    const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
    auto do_send = [&] {
      Named("sending to", next, [&] {
        send->send(offset * sizeof(float), n * sizeof(float), roffset * sizeof(float));
        send->waitSend();
      });
    };
    auto do_recv = [&] {
      Named("receiving from", prev, [&] { Receive(recv, prev, recv_n * sizeof(float)); });
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
  const std::chrono::microseconds spin_;  // GlooOptions::spin
  const absl::Duration timeout_;          // GlooOptions::timeout
  std::function<absl::Status()> wait_check_;
  absl::Duration wait_slice_ = absl::Seconds(2);
  std::vector<float> scratch_;
  std::vector<int> sockets_;  // by peer
  int slot_ = 0;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context,
                   std::shared_ptr<gloo::Context> sync_context, const GlooOptions& options)
      : context_(std::move(context)),
        sync_(std::move(sync_context), options.spin, options.timeout),
        timeout_(absl::ToChronoMilliseconds(options.timeout)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    if (data.empty() || size() == 1) return absl::OkStatus();
    return Guard(absl::StrCat("all-reduce of ", data.size(), " floats on rank ", rank()), [&] {
      sync_.ReduceScatter(data.data(), data.size());
      sync_.AllGather(data.data(), data.size());
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
      sync_.ReduceScatter(acc_.data(), acc_.size());  // equal blocks: block r is out's
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
                 [&] { sync_.AllGather(out.data(), out.size()); });
  }

  absl::Status Broadcast(absl::Span<float> data, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
    }
    if (data.empty() || size() == 1) return absl::OkStatus();
    return Guard(absl::StrCat("broadcast from rank ", root, " on rank ", rank()),
                 [&] { sync_.Broadcast(data.data(), data.size(), root); });
  }

  absl::Status Send(absl::Span<const float> data, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    return Guard(absl::StrCat("send to rank ", peer, " (tag ", tag, ")"),
                 [&] { sync_.SendRecv(data, peer, tag, nullptr, -1, 0); });
  }

  absl::Status Recv(absl::Span<float> data, int peer, int tag) override {
    RETURN_IF_ERROR(CheckPeer(peer, tag));
    return Guard(absl::StrCat("receive from rank ", peer, " (tag ", tag, ")"),
                 [&] { sync_.SendRecv({}, -1, 0, &data, peer, tag); });
  }

  absl::Status SendRecv(absl::Span<const float> out, int to, int send_tag, absl::Span<float> in,
                        int from, int recv_tag) override {
    RETURN_IF_ERROR(CheckPeer(to, send_tag));
    RETURN_IF_ERROR(CheckPeer(from, recv_tag));
    return Guard(absl::StrCat("send to rank ", to, " (tag ", send_tag, ") and receive from rank ",
                              from, " (tag ", recv_tag, ")"),
                 [&] { sync_.SendRecv(out, to, send_tag, &in, from, recv_tag); });
  }

  void SetWaitCheck(std::function<absl::Status()> check, absl::Duration slice) override {
    sync_.SetWaitCheck(std::move(check), slice);
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
  absl::Status CheckPeer(int peer, int tag) const {
    if (peer < 0 || peer >= size() || peer == rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer ", peer, " is not another rank of ", size()));
    }
    if (tag < 0 || tag >= SyncPairs::kMaxTag) {
      return absl::InvalidArgumentError(
          absl::StrCat("tag ", tag, " is not in [0, ", SyncPairs::kMaxTag, ")"));
    }
    return absl::OkStatus();
  }

  // Collective tags: distinct per call, identical across ranks (same call order), and kept
  // apart from user tags of Send/Recv by the high bit.
  uint32_t NextTag() { return 0x80000000u | (tag_++ & 0x7fffffffu); }

  std::shared_ptr<gloo::Context> context_;
  SyncPairs sync_;  // all-reduce, reduce-scatter, all-gather, point to point
  std::vector<float> acc_;
  const std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Rendezvous* rendezvous,
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
    GlooStore store(rendezvous, options.key_prefix, options.rendezvous_timeout);
    context->connectFullMesh(store, device);
    gloo::rendezvous::PrefixStore sync_store("sync", store);
    sync_context->connectFullMesh(sync_store, device);
    for (int r = 0; r < options.size; ++r) {
      if (r != options.rank) sync_context->getPair(r)->setSync(true, /*busyPoll=*/false);
    }
    // Until every rank has switched, a message could reach a pair still read by the
    // device thread, which would take it before its buffer exists.
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(absl::ToChronoMilliseconds(options.timeout));
    gloo::barrier(barrier);
  });
  if (!s.ok()) return s;
  return std::unique_ptr<Communicator>(new GlooCommunicator(context, sync_context, options));
}

}  // namespace pscluster::collective
