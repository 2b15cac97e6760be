"""Checkpoints and snapshots, one of Cluster's parts: the coordinator's cluster checkpoints
(a snapshot of every shard at one step), each shard's own snapshots, and the rollback of
every shard to one of them.
"""
from __future__ import annotations

import sys
import threading
from typing import List, Optional, Set

from pscluster._coordinator import _to_dict
from pscluster._errors import _whole
from pscluster._shards import _Shards
from pscluster.proto import coordinator_pb2, ps_pb2


class _CheckpointCalls:
    """Offers checkpoint, checkpoints, snapshots and restore. Needs the host's _shards,
    timeout, client_id, _lock, _registered, and the coordinator and worker parts' _coord,
    _coordinator, view, wait_for_chains and register_worker."""

    _shards: _Shards
    timeout: float
    client_id: str
    _lock: threading.Lock
    _registered: Set[int]

    def checkpoint(self, metric: Optional[float] = None,
                   timeout: Optional[float] = None) -> dict:
        """A cluster checkpoint now (the coordinator snapshots every shard at the step the
        tables reached and answers once every snapshot is durable): {step, metric, ...}.
        Checkpoints are named by step: while the tables have not passed the newest one's
        step, that one is answered with earlier=True (said on stderr), and what changed
        since at that step (ASP pushes of earlier steps, new tables) is not in it."""
        req = coordinator_pb2.CheckpointRequest(has_metric=metric is not None,
                                                metric=metric or 0.0)
        record = self._coord("Checkpoint", req, timeout)
        if record.earlier:
            print(f"pscluster: no new checkpoint: the tables have not passed step "
                  f"{record.step}, the newest checkpoint's (what changed since at that step "
                  "is not in it; train past it, then checkpoint)", file=sys.stderr, flush=True)
        return _to_dict(record)

    def checkpoints(self) -> List[dict]:
        """The complete cluster checkpoints, ascending step."""
        return [_to_dict(c) for c in self.view().checkpoints]

    def snapshots(self) -> List[List[ps_pb2.SnapshotInfo]]:
        """Every shard's snapshots (ListSnapshots), ascending step."""
        req = ps_pb2.ListSnapshotsRequest()
        return [list(r.snapshots) for r in self._shards.each(lambda s: self._shards.call(
            s, lambda stub: stub.ListSnapshots(req, timeout=self.timeout)))]

    def restore(self, step: int, force: bool = False, timeout: Optional[float] = None) -> None:
        """Every shard back to its snapshot of `step` (a checkpoint: see checkpoints()),
        which becomes the newest: the coordinator drops the later checkpoints and the shards
        their snapshots, so checkpoints taken from here on are this run's. Refused while
        ps_worker processes are alive, or other clients (another process's Cluster) push
        or pull as a worker, or did within the coordinator's heartbeat timeout, unless
        `force`; this Cluster's own calls do not count (the shards tell them by its
        client_id). With replicated shards it returns once every chain has all its replicas
        again (wait_for_chains). Without a coordinator (Cluster.from_shards), the shards
        alone roll back and keep their later snapshots. The workers this Cluster registered
        are registered again before it returns (a snapshot from before one registered does
        not know it). `timeout`: of the shards' reading the snapshot back (default: the
        client's, at least 10 minutes); one that runs out says which shards rolled back."""
        step = _whole(step, "step", 0, 2 ** 63 - 1)
        timeout = max(self.timeout, 600.0) if timeout is None else timeout
        if self._coordinator is None:
            req = ps_pb2.RestoreRequest(step=step)
            self._shards.each(lambda s: self._shards.call(s, lambda stub: stub.Restore(
                req, timeout=timeout)))
        else:
            self._coord("RestoreCheckpoint", coordinator_pb2.RestoreCheckpointRequest(
                step=step, force=force, client_id=self.client_id), timeout)
            # Replicated shards: each head is alone until its backups have copied the
            # restored state (its death then would lose the shard): back once they have.
            self.wait_for_chains()
        with self._lock:
            own = sorted(self._registered)
        for worker in own:  # a no-op where the snapshot knows the worker
            self.register_worker(worker)
