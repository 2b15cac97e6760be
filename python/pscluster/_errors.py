"""PsError, and the checks of a call's arguments made before anything is sent.

Each check raises a PsError (INVALID_ARGUMENT) naming what is wrong: a shard that refused
its part of a call would leave the other shards' parts applied.
"""
from __future__ import annotations

import re
from typing import Dict, Optional, Tuple, Union

import grpc
import numpy as np


class PsError(Exception):
    """A failed call: `code` is a grpc.StatusCode, `shard` the shard's index (None when the
    error is not one shard's: the coordinator, or a check made before anything was sent)."""

    def __init__(self, code: grpc.StatusCode, message: str, shard: Optional[int] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.shard = shard


def _whole(value, name: str, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi] (the wire's range: Python's ints have none), else
    INVALID_ARGUMENT naming it."""
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
            or not lo <= int(value) <= hi):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def _check_timeout(timeout) -> None:
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 0 < timeout < float("inf")):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"timeout must be a finite number of seconds > 0, got {timeout!r}")


def _step_and_worker(step, worker) -> Tuple[int, int]:
    return _whole(step, "step", 0, 2 ** 63 - 1), _whole(worker, "worker", 0, 2 ** 31 - 1)


def _already_pushed(e: PsError, step: int) -> bool:
    """A BSP shard's refusal of a push of `step` it has taken already (a repeat)."""
    return e.code == grpc.StatusCode.FAILED_PRECONDITION and re.search(
        rf"already pushed step {step}(?!\d)|(?<!\d)step {step} is already applied",
        e.message) is not None


def _enum(table: Dict[str, int], value: Union[str, int], what: str) -> int:
    if isinstance(value, str):
        if value.lower() not in table:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown {what} {value!r}; one of {sorted(table)}")
        return table[value.lower()]
    return int(value)


def _float32(array, size: int, what: str, name: str) -> np.ndarray:
    """`array` as a flat little-endian float32 array of `size` values (no copy when it is
    one already); a PsError (INVALID_ARGUMENT) naming what is wrong otherwise."""
    array = np.asarray(array)
    if array.dtype != np.float32:
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what}: the {name} must be float32, not {array.dtype}")
    if array.size != size:
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what} holds {size} values; the {name} has {array.size}")
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.astype("<f4") if flat.dtype.byteorder == ">" else flat


def _output(out: Optional[np.ndarray], size: int, what: str) -> np.ndarray:
    if out is None:
        return np.empty(size, dtype=np.float32)
    if (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.size != size
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what}: the output must be a writable C-contiguous float32 array of "
                      f"{size} values")
    return out
