// NcclCommunicator: a non-blocking NCCL communicator (ncclConfig_t::blocking = 0), so that
// initialisation and every operation can be polled until done or the timeout, then aborted.
// Built only under --config=cuda; nccl_communicator_stub.cc stands in otherwise.
#include "worker/collective/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace pscluster::collective {
namespace {

using ::pscluster::CudaStatus;

// The one adapter from ncclResult_t. `comm` (may be null) supplies NCCL's last message.
absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&msg, " (", last, ")");
  switch (r) {
    case ncclInvalidArgument:
      return absl::InvalidArgumentError(msg);
    case ncclInvalidUsage:
      return absl::FailedPreconditionError(msg);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Calls on a non-blocking communicator may answer ncclInProgress: issued, not failed.
absl::Status Issued(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  return NcclStatus(r == ncclInProgress ? ncclSuccess : r, comm, what);
}

// Between polls: yield at first (small operations finish within microseconds), then sleep
// briefly so that a long wait does not hold a core.
void Pause(int polls) {
  if (polls < 1000) {
    std::this_thread::yield();
  } else {
    absl::SleepFor(absl::Microseconds(50));
  }
}

// The two sides of a point-to-point exchange.
struct Outgoing {
  absl::Span<const float> data;
  int to;
  int tag;
};
struct Incoming {
  absl::Span<float> data;
  int from;
  int tag;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const NcclOptions& options)
      : rank_(options.rank),
        size_(options.size),
        device_(options.device),
        timeout_(options.timeout) {}
  // Finalizes the communicator (bounded by the timeout, then aborted) and frees the rest.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // The stream, the scratch buffers, then the NCCL communicator from `id`.
  absl::Status Init(const ncclUniqueId& id);

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(absl::Span<float> data) override {
    const std::string what = absl::StrCat("all-reduce of ", data.size(), " floats on rank ", rank_);
    return Run(what, AllRanks(), {data}, [&] {
      if (data.empty()) return absl::OkStatus();
      return Issued(
          ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm_, stream_),
          comm_, what);
    });
  }

  absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) override {
    const size_t n = out.size();
    if (in.size() != n * size_) {
      return absl::InvalidArgumentError(absl::StrCat("reduce-scatter input holds ", in.size(),
                                                     " floats, expected ", size_, " x ", n));
    }
    const std::string what =
        absl::StrCat("reduce-scatter of ", in.size(), " floats on rank ", rank_);
    return Run(what, AllRanks(), {in, out}, [&] {
      if (n == 0) return absl::OkStatus();
      return Issued(ncclReduceScatter(in.data(), out.data(), n, ncclFloat, ncclSum, comm_, stream_),
                    comm_, what);
    });
  }

  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override {
    const size_t n = in.size();
    if (out.size() != n * size_) {
      return absl::InvalidArgumentError(absl::StrCat("all-gather output holds ", out.size(),
                                                     " floats, expected ", size_, " x ", n));
    }
    const std::string what = absl::StrCat("all-gather of ", n, " floats on rank ", rank_);
    return Run(what, AllRanks(), {in, out}, [&] {
      if (n == 0) return absl::OkStatus();
      return Issued(ncclAllGather(in.data(), out.data(), n, ncclFloat, comm_, stream_), comm_,
                    what);
    });
  }

  absl::Status Broadcast(absl::Span<float> data, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank"));
    }
    const std::string what =
        absl::StrCat("broadcast of ", data.size(), " floats from rank ", root, " on rank ", rank_);
    const std::string waited_for = root == rank_ ? AllRanks() : absl::StrCat("rank ", root);
    return Run(what, waited_for, {data}, [&] {
      if (data.empty()) return absl::OkStatus();
      return Issued(
          ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat, root, comm_, stream_),
          comm_, what);
    });
  }

  absl::Status Send(absl::Span<const float> data, int peer, int tag) override {
    const Outgoing out{data, peer, tag};
    return Exchange(
        absl::StrCat("send of ", data.size(), " floats to rank ", peer, " (tag ", tag, ")"), &out,
        nullptr);
  }

  absl::Status Recv(absl::Span<float> data, int peer, int tag) override {
    const Incoming in{data, peer, tag};
    return Exchange(
        absl::StrCat("receive of ", data.size(), " floats from rank ", peer, " (tag ", tag, ")"),
        nullptr, &in);
  }

  // One NCCL group: neither side waits for the other to be posted.
  absl::Status SendRecv(absl::Span<const float> out, int to, int send_tag, absl::Span<float> in,
                        int from, int recv_tag) override {
    const Outgoing o{out, to, send_tag};
    const Incoming i{in, from, recv_tag};
    return Exchange(absl::StrCat("send of ", out.size(), " floats to rank ", to, " (tag ", send_tag,
                                 ") and receive of ", in.size(), " floats from rank ", from,
                                 " (tag ", recv_tag, ")"),
                    &o, &i);
  }

  absl::Status Barrier() override {
    const std::string what = absl::StrCat("barrier on rank ", rank_);
    return Run(what, AllRanks(), {}, [&] {
      return Issued(ncclAllReduce(dev_one_, dev_one_, 1, ncclFloat, ncclSum, comm_, stream_), comm_,
                    what);
    });
  }

 private:
  // Checks the communicator and the buffers, runs `enqueue` (NCCL calls on stream_) and waits
  // for the work. Any failure past the checks aborts the communicator.
  absl::Status Run(const std::string& what, const std::string& waited_for,
                   std::initializer_list<absl::Span<const float>> buffers,
                   const std::function<absl::Status()>& enqueue);
  // Polls NCCL's state, then the stream, until both are done, an error, or `deadline`.
  absl::Status Await(const std::string& what, const std::string& waited_for, absl::Time deadline);
  // Send, Recv and SendRecv: `out` and/or `in` in one NCCL group, each message preceded by
  // its header (tag, length), which the receiving side checks.
  absl::Status Exchange(const std::string& what, const Outgoing* out, const Incoming* in);
  absl::Status EnqueueExchange(const std::string& what, const Outgoing* out, const Incoming* in);
  absl::Status CheckHeader(const std::string& what, const Incoming& in);
  // Issues `calls` between ncclGroupStart and ncclGroupEnd.
  absl::Status Grouped(const std::string& what, const std::function<ncclResult_t()>& calls);
  absl::Status CheckBuffer(absl::Span<const float> buffer, const std::string& what) const;
  absl::Status CheckPeer(int peer) const;
  // Unless `why` is OK: aborts comm_ (if not yet) and returns `why`, saying so.
  absl::Status Abort(const absl::Status& why);
  std::string AllRanks() const { return absl::StrCat("all ", size_, " ranks"); }

  const int rank_, size_, device_;
  const absl::Duration timeout_;
  ncclComm_t comm_ = nullptr;  // null once aborted
  std::string aborted_;        // why comm_ was aborted
  cudaStream_t stream_ = nullptr;
  int64_t* dev_header_ = nullptr;   // a message's tag and length: [0, 2) outgoing, [2, 4) incoming
  int64_t* host_header_ = nullptr;  // pinned staging for the outgoing header
  float* dev_one_ = nullptr;        // the barrier's all-reduce operand
};

absl::Status NcclCommunicator::Init(const ncclUniqueId& id) {
  const std::string what =
      absl::StrCat("NCCL init of rank ", rank_, " of ", size_, " on GPU ", device_);
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), what + ": cudaSetDevice"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                             what + ": cudaStreamCreateWithFlags"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&dev_header_, 4 * sizeof(int64_t)), what + ": cudaMalloc"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&dev_one_, sizeof(float)), what + ": cudaMalloc"));
  RETURN_IF_ERROR(CudaStatus(cudaMemset(dev_one_, 0, sizeof(float)), what + ": cudaMemset"));
  RETURN_IF_ERROR(
      CudaStatus(cudaMallocHost(&host_header_, 2 * sizeof(int64_t)), what + ": cudaMallocHost"));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Status s = Issued(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), comm_, what);
  if (s.ok() && comm_ != nullptr) s = Await(what, AllRanks(), deadline);
  return s.ok() ? s : Abort(s);
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    const std::string what = absl::StrCat("NCCL finalize of rank ", rank_);
    absl::Status s = Issued(ncclCommFinalize(comm_), comm_, what);
    if (s.ok()) s = Await(what, AllRanks(), absl::Now() + timeout_);
    if (s.ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  cudaFree(dev_header_);
  cudaFree(dev_one_);
  cudaFreeHost(host_header_);
}

absl::Status NcclCommunicator::Exchange(const std::string& what, const Outgoing* out,
                                        const Incoming* in) {
  if (out != nullptr) RETURN_IF_ERROR(CheckPeer(out->to));
  if (in != nullptr) RETURN_IF_ERROR(CheckPeer(in->from));
  std::string waited_for = absl::StrCat("rank ", out != nullptr ? out->to : in->from);
  if (out != nullptr && in != nullptr && out->to != in->from) {
    waited_for = absl::StrCat("ranks ", out->to, " and ", in->from);
  }
  const absl::Span<const float> out_buffer = out != nullptr ? out->data : absl::Span<const float>();
  const absl::Span<const float> in_buffer = in != nullptr ? in->data : absl::Span<float>();
  const absl::Status s = Run(what, waited_for, {out_buffer, in_buffer},
                             [&] { return EnqueueExchange(what, out, in); });
  if (!s.ok() || in == nullptr) return s;
  return CheckHeader(what, *in);
}

absl::Status NcclCommunicator::EnqueueExchange(const std::string& what, const Outgoing* out,
                                               const Incoming* in) {
  if (out != nullptr) {
    host_header_[0] = out->tag;
    host_header_[1] = static_cast<int64_t>(out->data.size());
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dev_header_, host_header_, 2 * sizeof(int64_t),
                                               cudaMemcpyHostToDevice, stream_),
                               what + ": header copy"));
  }
  return Grouped(what, [&] {
    ncclResult_t r = ncclSuccess;
    if (out != nullptr) {
      r = ncclSend(dev_header_, 2, ncclInt64, out->to, comm_, stream_);
      if (r == ncclSuccess && !out->data.empty()) {
        r = ncclSend(out->data.data(), out->data.size(), ncclFloat, out->to, comm_, stream_);
      }
    }
    if (in != nullptr && r == ncclSuccess) {
      r = ncclRecv(dev_header_ + 2, 2, ncclInt64, in->from, comm_, stream_);
      if (r == ncclSuccess && !in->data.empty()) {
        r = ncclRecv(in->data.data(), in->data.size(), ncclFloat, in->from, comm_, stream_);
      }
    }
    return r;
  });
}

absl::Status NcclCommunicator::CheckHeader(const std::string& what, const Incoming& in) {
  int64_t header[2];  // the stream is idle: a plain copy, complete when it returns
  RETURN_IF_ERROR(
      Abort(CudaStatus(cudaMemcpy(header, dev_header_ + 2, sizeof(header), cudaMemcpyDeviceToHost),
                       what + ": header copy")));
  const std::string sent = absl::StrCat(
      what, ": the matching send from rank ", in.from, " carries ", header[1], " floats with tag ",
      header[0], " (NCCL has no tags: sends match receives by their order between two ranks)");
  // A length mismatch may leave bytes in flight: this communicator is done for.
  if (header[1] != static_cast<int64_t>(in.data.size())) {
    return Abort(absl::FailedPreconditionError(sent));
  }
  if (header[0] != in.tag) return absl::FailedPreconditionError(sent);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Run(const std::string& what, const std::string& waited_for,
                                   std::initializer_list<absl::Span<const float>> buffers,
                                   const std::function<absl::Status()>& enqueue) {
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the communicator was aborted earlier, after: ", aborted_));
  }
  // Before anything touches CUDA on this thread, so that no context lands on another GPU.
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), what + ": cudaSetDevice"));
  for (absl::Span<const float> b : buffers) RETURN_IF_ERROR(CheckBuffer(b, what));
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Status s = enqueue();
  if (s.ok()) s = Await(what, waited_for, deadline);
  return s.ok() ? s : Abort(s);
}

absl::Status NcclCommunicator::Await(const std::string& what, const std::string& waited_for,
                                     absl::Time deadline) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(
        NcclStatus(ncclCommGetAsyncError(comm_, &state), comm_, what + ": ncclCommGetAsyncError"));
    if (state != ncclInProgress) {
      RETURN_IF_ERROR(NcclStatus(state, comm_, what));
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaStatus(e, what);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": not done within ",
                                                      absl::FormatDuration(timeout_),
                                                      ", waiting for ", waited_for));
    }
    Pause(polls);
  }
}

absl::Status NcclCommunicator::Grouped(const std::string& what,
                                       const std::function<ncclResult_t()>& calls) {
  RETURN_IF_ERROR(Issued(ncclGroupStart(), comm_, what + ": ncclGroupStart"));
  const ncclResult_t r = calls();
  const ncclResult_t end = ncclGroupEnd();
  RETURN_IF_ERROR(Issued(r, comm_, what));
  return Issued(end, comm_, what + ": ncclGroupEnd");
}

absl::Status NcclCommunicator::CheckBuffer(absl::Span<const float> buffer,
                                           const std::string& what) const {
  if (buffer.empty()) return absl::OkStatus();
  cudaPointerAttributes a;
  const cudaError_t e = cudaPointerGetAttributes(&a, buffer.data());
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky; keep it from surfacing in a later call
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot tell where the buffer lives: ", cudaGetErrorString(e)));
  }
  if (a.type == cudaMemoryTypeManaged) return absl::OkStatus();
  if (a.type == cudaMemoryTypeDevice && a.device == device_) return absl::OkStatus();
  const std::string where = a.type == cudaMemoryTypeDevice
                                ? absl::StrCat("memory of GPU ", a.device)
                                : std::string("host memory");
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": the buffer is ", where, "; NCCL takes memory of this rank's GPU ", device_));
}

absl::Status NcclCommunicator::CheckPeer(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", peer, " is not another rank of ", size_));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Abort(const absl::Status& why) {
  if (why.ok() || comm_ == nullptr) return why;
  ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_ = std::string(why.message());
  return absl::Status(why.code(), absl::StrCat(why.message(), "; communicator aborted"));
}

absl::Status CheckOptions(Rendezvous* rendezvous, const NcclOptions& o) {
  if (rendezvous == nullptr) return absl::InvalidArgumentError("no rendezvous store");
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is not in [0, ", o.size, ")"));
  }
  if (o.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPU ", o.device, " is not a device ordinal"));
  }
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout ", absl::FormatDuration(o.timeout), " is not positive"));
  }
  return absl::OkStatus();
}

// Rank 0 creates the group's unique id and publishes it; the others wait for it.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(Rendezvous* rendezvous, const NcclOptions& o) {
  const std::string key = o.key_prefix + "unique_id";
  ncclUniqueId id;
  if (o.rank == 0) {
    RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId on rank 0"));
    absl::Status s = rendezvous->Put(key, std::string(id.internal, sizeof(id.internal)));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank 0 publishing the NCCL unique id under ", key,
                                                 ": ", s.message()));
    }
    return id;
  }
  absl::StatusOr<std::string> value = rendezvous->WaitGet(key, o.timeout);
  if (!value.ok()) {
    return absl::Status(value.status().code(),
                        absl::StrCat("rank ", o.rank, " waiting for rank 0's NCCL unique id under ",
                                     key, ": ", value.status().message()));
  }
  if (value->size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("the NCCL unique id under ", key, " holds ",
                                                   value->size(), " bytes, not ",
                                                   sizeof(id.internal)));
  }
  std::memcpy(id.internal, value->data(), sizeof(id.internal));
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Rendezvous* rendezvous,
                                                                     const NcclOptions& options) {
  RETURN_IF_ERROR(CheckOptions(rendezvous, options));
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "NCCL communicator: cudaGetDeviceCount"));
  if (options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU ", options.device, " does not exist: ", count, " visible"));
  }
  ASSIGN_OR_RETURN(const ncclUniqueId id, ExchangeUniqueId(rendezvous, options));
  auto comm = std::make_unique<NcclCommunicator>(options);
  RETURN_IF_ERROR(comm->Init(id));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace pscluster::collective
