// Collective communication among the `size()` ranks of one group: what the all-reduce,
// FSDP and pipeline modes are built on. Implementations: Gloo (CPU, TCP; below) and NCCL
// (GPU, device buffers; nccl_communicator.h). Every call has a timeout; errors name the
// operation and, where one is known, the peer rank waited for. All ranks must make the same
// collective calls in the same order. Not thread-safe: one caller per communicator. The process
// should ignore SIGPIPE (Gloo writes with writev; a peer that died is then an error naming it, not
// a signal).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/collective/rendezvous.h"

namespace pscluster::collective {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data = sum over ranks of data, in place.
  virtual absl::Status AllReduceSum(absl::Span<float> data) = 0;
  // in: size() blocks of out.size() floats; out = the sum over ranks of block rank().
  virtual absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) = 0;
  // out: size() blocks of in.size() floats; block r = rank r's in.
  virtual absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) = 0;
  // data = root's data on every rank.
  virtual absl::Status Broadcast(absl::Span<float> data, int root) = 0;
  // Point to point; (peer, tag) pairs match sends to receives, and two ranks receive each
  // other's messages in the order they were sent. Send returns once the message is on its
  // way; a large one may wait for the peer to receive it (as MPI_Send may).
  virtual absl::Status Send(absl::Span<const float> data, int peer, int tag) = 0;
  virtual absl::Status Recv(absl::Span<float> data, int peer, int tag) = 0;
  // Sends `out` to `to` while receiving `in` from `from`, both posted before either is
  // waited for: what a pipeline stage needs to exchange activations and gradients with its
  // neighbours without deadlocking.
  virtual absl::Status SendRecv(absl::Span<const float> out, int to, int send_tag,
                                absl::Span<float> in, int from, int recv_tag) = 0;
  virtual absl::Status Barrier() = 0;
  // A receive that has waited `slice` for its peer calls `check`, and again after every
  // further slice: an error ends the operation with it (a member the coordinator declared
  // dead), OK goes on waiting, up to the timeout; the first slice is said on stderr.
  // Gloo's receives (every collective's and point-to-point's); others ignore it.
  virtual void SetWaitCheck(std::function<absl::Status()> check, absl::Duration slice) {}
};

struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string host = "127.0.0.1";              // the address peers reach this rank at
  absl::Duration timeout = absl::Seconds(30);  // of every operation
  // How long a receive polls its socket before it sleeps in the read: a sleeping thread takes
  // tens of microseconds to wake, paid at every ring step and pipeline exchange. Zero where
  // the ranks have no core to spare (more ranks than cores).
  absl::Duration spin = absl::Microseconds(200);
  // The rendezvous's keys start with it: each group (and each new incarnation of one, e.g.
  // per mode-switch generation) needs its own.
  std::string key_prefix;
  // How long a rank waits at the rendezvous for the others (they may start later).
  absl::Duration rendezvous_timeout = absl::Minutes(5);
};

// Connects the group through `rendezvous`, which must outlive the call only.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Rendezvous* rendezvous,
                                                                     const GlooOptions& options);

}  // namespace pscluster::collective
