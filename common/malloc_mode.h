// glibc malloc settings for the processes that move large messages. By default glibc maps
// each block of 128 KiB or more on its own (raising that threshold as such blocks are
// freed) and trims its heaps when their free top passes twice the threshold, so a push or
// pull of a few MB allocated and freed every step lands in fresh pages that fault in again
// each time. On a virtual machine whose page faults are slow that made a 1 MiB push 3-4x
// slower (bench/history/RESULTS-to-2026-12-05.md, 2026-12-04 evening). Each daemon calls its
// setting first thing; a bench that runs a daemon's code in its own process calls the same.
#pragma once

#include <malloc.h>

namespace pscluster {

// ps_server: keep message and staging buffers in the heap, but give freed memory back: an
// arena keeps at most 16 MB free at its top, and there are few arenas, since memory freed
// in one is reused only by the threads allocating from it (with one per handler thread,
// each kept its own high-water mark of request buffers). The service returns the rest
// (holes in the heap) once requests stop for a while.
inline void ShardMallocMode() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
  mallopt(M_ARENA_MAX, 4);
}

// ps_worker: every step allocates and frees the same ~0.5 MB message buffers; keep them in
// the heap. One malloc arena for every thread: the gRPC, Gloo and pool threads each had
// their own, and each kept 2-6 MB of freed memory resident that no other thread could
// reuse (31 MB of a GPT worker's 307 MB in ALLREDUCE mode; bench/history/RESULTS-to-2026-12-05.md,
// psctl plan's predictions).
inline void WorkerMallocMode() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_ARENA_MAX, 1);
}

}  // namespace pscluster
