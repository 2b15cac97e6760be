"""DenseChunk (proto/ps.proto) encoded and decoded by hand for the bulk streams.

grpc-python with protobuf message objects copies a tensor's bytes four times on the way out
(tobytes, the message's string, SerializeToString, grpc's buffer) and each access to a
received message's `data` copies it again. These serializers, given to grpc's
`unary_unary`/`stream_unary`/`unary_stream` in place of the message classes, copy the
tensor once on the way out (header and slice joined into the bytes grpc sends) and not at
all on the way in (a memoryview into the bytes grpc received). The encoding is protobuf's
wire format, byte for byte what DenseChunk.SerializeToString writes (proto3: zero fields
omitted; negative int32/int64 as 10-byte two's complement varints), so the server is the
same; client_test checks the two against each other.
"""
from __future__ import annotations

from typing import Tuple

_DATA_TAG = b"\x3a"  # field 7, wire type 2 (length-delimited)
_NAMES = (None, "worker_id", "step", "table_id", "offset", "total_length", "begin")


def varint(v: int) -> bytes:
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def field(number: int, v: int) -> bytes:
    """A varint field; nothing for 0 (proto3's default)."""
    return b"" if v == 0 else varint(number << 3) + varint(v)


def chunk_header(worker_id: int, step: int, table_id: int, offset: int, total_length: int,
                 begin: int) -> bytes:
    """Fields 1-6 of a DenseChunk, in field order."""
    return (field(1, worker_id) + field(2, step) + field(3, table_id) + field(4, offset) +
            field(5, total_length) + field(6, begin))


def encode_chunk(msg: Tuple[bytes, memoryview]) -> bytes:
    """(chunk_header(...), the tensor slice as bytes) -> a serialized DenseChunk."""
    header, data = msg
    return b"".join((header, _DATA_TAG, varint(data.nbytes), data))


def encode_batch(chunks) -> bytes:
    """[(chunk_header(...), slice), ...] -> a serialized DenseBatch (field 1: the chunks),
    every slice copied once."""
    parts = []
    for header, data in chunks:
        size = varint(data.nbytes)
        parts += (b"\x0a", varint(len(header) + 1 + len(size) + data.nbytes), header,
                  _DATA_TAG, size, data)
    return b"".join(parts)


def decode_batch(buf: bytes):
    """A serialized DenseBatch -> [Chunk, ...], each `data` a view into `buf`."""
    mv, i, n, out = memoryview(buf), 0, len(buf), []
    while i < n:
        key, i = _read_varint(buf, i)
        if key != 0x0a:
            raise ValueError(f"DenseBatch: unexpected field key {key}")
        size, i = _read_varint(buf, i)
        if i + size > n:
            raise ValueError("DenseBatch: truncated chunk")
        out.append(decode_chunk(mv[i:i + size]))
        i += size
    return out


class Chunk:
    """A received DenseChunk: its ints, and `data` a memoryview into the received bytes."""
    __slots__ = _NAMES[1:] + ("data",)

    def __init__(self):
        self.worker_id = self.step = self.table_id = 0
        self.offset = self.total_length = self.begin = 0
        self.data = memoryview(b"")


def _read_varint(buf: bytes, i: int) -> Tuple[int, int]:
    v = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("DenseChunk: truncated varint")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def decode_chunk(buf) -> Chunk:
    """A serialized DenseChunk (bytes or a memoryview of them) -> Chunk (unknown fields
    skipped, as protobuf does)."""
    c, mv, i, n = Chunk(), memoryview(buf), 0, len(buf)
    while i < n:
        key, i = _read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
            if 1 <= number <= 6:
                if number <= 2 and v >= 1 << 63:  # int32 / int64
                    v -= 1 << 64
                setattr(c, _NAMES[number], v)
        elif wire == 2:
            size, i = _read_varint(buf, i)
            if i + size > n:
                raise ValueError("DenseChunk: truncated field")
            if number == 7:
                c.data = mv[i:i + size]
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"DenseChunk: wire type {wire}")
    if i != n:
        raise ValueError("DenseChunk: truncated")
    return c
