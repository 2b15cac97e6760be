"""The workers' membership, one of Cluster's parts: registering and unregistering workers
with every shard, the workers' clocks, and the bookkeeping of the workers this client
registered, which a shard may forget when it rolls back to an older snapshot.
"""
from __future__ import annotations

import re
import threading
from typing import List, Optional, Set, Tuple

import grpc

from pscluster._errors import PsError
from pscluster._shards import _Shards
from pscluster.proto import ps_pb2

_NOT_REGISTERED = re.compile(r"worker_id (\d+) is not registered with shard")  # shard.cc


class _WorkerCalls:
    """Offers register_worker, unregister_worker, stats, clock and wait_for_workers. Needs
    the host's _shards, timeout, _poll, _lock, and _registered and _forgotten: the workers
    this client registered, and those a shard forgot since (_forgot_worker)."""

    _shards: _Shards
    timeout: float
    _lock: threading.Lock
    _registered: Set[int]
    _forgotten: Set[int]

    def _forgot_worker(self, code: grpc.StatusCode, message: str) -> str:
        """A shard that does not know a worker this Cluster registered (a restore rolled
        it back to a snapshot from before, or another client unregistered it): the next
        call of the worker registers it again (nothing re-sent here: a push may have landed
        on the other shards). The message, saying so (each shard's error of that call)."""
        forgot = _NOT_REGISTERED.search(message)
        if code != grpc.StatusCode.FAILED_PRECONDITION or not forgot:
            return message
        worker = int(forgot.group(1))
        with self._lock:
            if worker not in self._registered and worker not in self._forgotten:
                return message
            self._registered.discard(worker)
            self._forgotten.add(worker)
        return (message + " (the shard forgot it: a restore to a snapshot from before it "
                "registered, or another client unregistered it; this Cluster registers it "
                "again on its next call)")

    def register_worker(self, worker: int = 0) -> None:
        """Registers `worker` with every shard (done on its first push or pull)."""
        req = ps_pb2.RegisterWorkerRequest(worker_id=worker)
        self._shards.each(lambda s: self._shards.call(
            s, lambda stub: stub.RegisterWorker(req, timeout=self.timeout)))
        with self._lock:
            self._registered.add(worker)
            self._forgotten.discard(worker)

    def _ensure_registered(self, worker: int) -> None:
        with self._lock:
            if worker in self._registered:
                return
        self.register_worker(worker)

    def stats(self) -> List[ps_pb2.StatsResponse]:
        """Every shard's Stats: its tables' counters and the workers' clocks."""
        req = ps_pb2.StatsRequest()
        return self._shards.each(lambda s: self._shards.call(
            s, lambda stub: stub.Stats(req, timeout=self.timeout)))

    def clock(self, worker: int = 0) -> int:
        """The steps `worker` has pushed (max step + 1 over every table), on the shard that
        has seen fewest: the step it resumes at. 0 before its first push. A worker that
        is not registered (never was, or unregistered) has no clock: PsError NOT_FOUND."""
        clocks = []
        for shard, st in enumerate(self.stats()):
            clock = next((c.clock for c in st.workers if c.worker_id == worker), None)
            if clock is None:
                raise PsError(grpc.StatusCode.NOT_FOUND,
                              f"{self._shards.name(shard)}: worker {worker} is not "
                              f"registered (it never was, or it unregistered): "
                              f"register_worker({worker}) first", shard)
            clocks.append(clock)
        return min(clocks)

    def unregister_worker(self, worker: int) -> None:
        """`worker` leaves for good: BSP steps stop waiting for it."""
        req = ps_pb2.UnregisterWorkerRequest(worker_id=worker)
        self._shards.each(lambda s: self._shards.call(
            s, lambda stub: stub.UnregisterWorker(req, timeout=self.timeout)))
        with self._lock:
            self._registered.discard(worker)

    def wait_for_workers(self, count: int, timeout: Optional[float] = None) -> List[int]:
        """Waits (bounded: `timeout`, default the client's) until `count` workers have
        registered with every shard, so that the first BSP step waits for all of them;
        returns the registered ids. The shards have no blocking call for this: it polls
        Stats, backing off from 5 to 100 ms, so a worker that registers and leaves again
        (unregister_worker) between two polls is not seen: leave only after every worker
        has started."""
        def registered() -> Tuple[bool, List[List[int]]]:
            seen = [sorted(c.worker_id for c in st.workers) for st in self.stats()]
            return all(len(ids) >= count for ids in seen), seen

        done, seen = self._poll(registered, timeout)
        if not done:
            raise PsError(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"waited for {count} workers to register; the shards have "
                          f"{seen} (start the others, or check their logs)")
        return seen[0]
