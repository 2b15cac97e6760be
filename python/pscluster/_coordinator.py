"""The coordinator's calls, one of Cluster's parts: its cluster view (the shards, their
chains of replicas, the checkpoints) and the training mode it tells every worker.
"""
from __future__ import annotations

import sys
from typing import Dict, List, Optional, Tuple

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from pscluster._errors import PsError, _enum, _whole
from pscluster._shards import _Shards
from pscluster.proto import coordinator_pb2, coordinator_pb2_grpc
from pscluster.security import Security


def _to_dict(message: Message) -> dict:
    """Every field of `message` (defaults too) by its proto name; enums by name, 64-bit
    integers as ints (json_format would make them strings)."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)

        def convert(v):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                return _to_dict(v)
            if field.type == FieldDescriptor.TYPE_ENUM:
                return field.enum_type.values_by_number[v].name if v in \
                    field.enum_type.values_by_number else v
            return v

        if field.label == FieldDescriptor.LABEL_REPEATED:
            out[field.name] = [convert(v) for v in value]
        else:
            out[field.name] = convert(value)
    return out


def _coordinator_call(stub: coordinator_pb2_grpc.CoordinatorStub, address: str, method: str,
                      request: Message, timeout: float):
    """stub.method(request); a gRPC error becomes a PsError naming the coordinator."""
    try:
        return getattr(stub, method)(request, timeout=timeout)
    except grpc.RpcError as e:
        details = e.details()
        if e.code() == grpc.StatusCode.UNIMPLEMENTED and not details:
            details = ("the server there does not serve this call: is it a ps_coordinator's "
                       "address (not a ps_server's)?")
        raise PsError(e.code(), f"coordinator ({address}): {details}") from None


class _CoordinatorChannel:
    """The channel to one coordinator; call() turns its errors into PsErrors naming it."""

    def __init__(self, address: str, security: Security):
        self.address = address
        self._channel = security.channel(address)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    def call(self, method: str, request: Message, timeout: float):
        return _coordinator_call(self._stub, self.address, method, request, timeout)

    def close(self) -> None:
        self._channel.close()


class _CoordinatorCalls:
    """Offers view, status, wait_for_chains, shard_incarnations and switch_mode. Needs the
    host's _coordinator (a _CoordinatorChannel, or None without a coordinator), _shards,
    timeout, addresses, num_shards and _poll."""

    _coordinator: Optional[_CoordinatorChannel]
    _shards: _Shards
    timeout: float

    def _coord(self, method: str, request: Message, timeout: Optional[float] = None):
        self._shards.check_open()
        if self._coordinator is None:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          "this cluster has no coordinator (Cluster.from_shards)")
        return self._coordinator.call(method, request,
                                      self.timeout if timeout is None else timeout)

    def wait_for_chains(self, timeout: Optional[float] = None) -> bool:
        """Replicated shards (ps_coordinator --replicas > 1): waits (bounded: `timeout`,
        default the client's) until every live replica of every shard is in its chain
        again, as after set_dense or restore, which leave the head alone while the others
        copy its state back: until then the head's death loses the shard (a replica that
        died is not waited for). True when they are; False (said on stderr) when the time
        ran out, or at once without a coordinator."""
        if self._coordinator is None:
            return False

        def whole() -> Tuple[bool, List[int]]:
            v = self.view()
            chains = {c.shard: set(c.replicas) for c in v.chains}
            short = sorted({m.id for m in v.members
                            if m.role == coordinator_pb2.SHARD and m.alive
                            and m.id in chains and m.replica not in chains[m.id]})
            return not short, short

        done, short = self._poll(whole, timeout)
        if not done:
            print(f"pscluster: the chains of shard(s) {short} have not all their live "
                  "replicas again: a head lost now loses its shard", file=sys.stderr, flush=True)
        return done

    def shard_incarnations(self) -> Optional[Dict[int, int]]:
        """Each unreplicated shard's incarnation in the coordinator's view (it grows when the
        shard registers again: a restart, with its snapshot's state or none); None without a
        coordinator or with replicated shards, whose chains carry the state over."""
        if self._coordinator is None:
            return None
        v = self.view()
        if v.replicas > 1:
            return None
        return {m.id: m.incarnation for m in v.members if m.role == coordinator_pb2.SHARD}

    def view(self) -> coordinator_pb2.ClusterView:
        """The coordinator's cluster view (GetView)."""
        return self._coord("GetView", coordinator_pb2.GetViewRequest())

    def status(self) -> dict:
        """The coordinator's view as a dict (field names as in coordinator.proto); without a
        coordinator, just the shard addresses."""
        if self._coordinator is None:
            return {"num_shards": self.num_shards, "shard_addresses": list(self.addresses)}
        return _to_dict(self.view())

    def switch_mode(self, mode: str, at_step: int = 0) -> dict:
        """Schedules a live switch of every worker's training mode (ps, allreduce, fsdp,
        pipeline) at `at_step` (0: the next step boundary no worker has reached)."""
        modes = {k.lower(): v for k, v in coordinator_pb2.TrainingMode.items()}
        req = coordinator_pb2.SwitchModeRequest(
            mode=_enum(modes, mode, "mode"), at_step=_whole(at_step, "at_step", 0, 2 ** 63 - 1))
        return _to_dict(self._coord("SwitchMode", req))

