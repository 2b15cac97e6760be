// The Communicator on NCCL: collectives between GPUs, one GPU per rank.
//
// Buffers are DEVICE memory. Every absl::Span<float> passed to an NcclCommunicator points
// into memory on the rank's own CUDA device (cudaMalloc or managed memory); a host pointer
// is refused with INVALID_ARGUMENT. Each call enqueues its NCCL operation on the
// communicator's own CUDA stream and returns once that stream has finished it, so the data
// is ready to use (from any stream) when the call returns OK. That stream does not wait for
// other streams: the data must be complete when the call is made (synchronize the stream
// that wrote it; note that cudaMemcpy from pageable host memory may return before its DMA
// has landed).
//
// Timeouts: NCCL operations are asynchronous. Each call polls NCCL's state and the stream
// until the work is done or `NcclOptions::timeout` has passed; at the deadline it aborts the
// communicator (ncclCommAbort) and returns DEADLINE_EXCEEDED naming the operation and, where
// one is known (Send/Recv peer, Broadcast root), the rank it waited for. After a timeout or
// any NCCL error the communicator is aborted: every later call fails with FAILED_PRECONDITION
// and the group must be created anew (under a new key prefix).
//
// Send/Recv/SendRecv: NCCL has no tags. A send is matched with the receive that rank `peer`
// posts for this rank in the same position of their call orders, i.e. (peer, order)
// matches, not (peer, tag). Each message carries its tag and length in a 16-byte header, and
// the receiver fails with FAILED_PRECONDITION when they differ from what it expected (a
// length mismatch also aborts the communicator). A Send or Recv finishes before it returns
// (NCCL needs the other side running), so two ranks must not both Send to each other first;
// SendRecv posts both directions in one NCCL group and has no such constraint.
//
// Not thread-safe: one caller per communicator (the thread may change between calls).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"

namespace pscluster::collective {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // The CUDA device (ordinal) this rank runs on. The ranks of a group need distinct GPUs:
  // NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected").
  int device = 0;
  // Of the rendezvous, of NCCL's initialisation, and of every operation.
  absl::Duration timeout = absl::Seconds(30);
  // The unique id is published under key_prefix + "unique_id". Each group (and each new
  // incarnation of one, e.g. per mode-switch generation) needs its own prefix.
  std::string key_prefix = "nccl/";
};

// Joins the group: rank 0 creates and publishes the unique id through `rendezvous`
// (rendezvous.h), the other ranks wait for it there, and every rank then initialises
// its NCCL communicator on `options.device`. `rendezvous` must outlive the call only.
// INVALID_ARGUMENT for bad options, UNAVAILABLE where CUDA or the GPU is absent (always in
// a build without --config=cuda), DEADLINE_EXCEEDED when the id or a rank did not arrive.
// Destroying the communicator finalizes it with its peers (up to the timeout, then aborts).
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Rendezvous* rendezvous,
                                                                     const NcclOptions& options);

}  // namespace pscluster::collective
