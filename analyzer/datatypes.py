"""Triton tensor datatypes: names, numpy equivalents and the BYTES wire format.

Shared by the worker, the load generator and the python backend, so every stage agrees on what
"FP32" or "TYPE_STRING" means and on how a BYTES tensor is laid out in a binary payload.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

try:  # a python model's own environment (EXECUTION_ENV_PATH) may lack it: no BF16 there
    import ml_dtypes
except ImportError:  # pragma: no cover - the worker's own environment has it
    ml_dtypes = None

# KServe/Triton wire names -> numpy dtypes. BYTES elements are Python bytes objects.
WIRE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
if ml_dtypes is not None:
    WIRE_TO_NUMPY["BF16"] = np.dtype(ml_dtypes.bfloat16)
_NUMPY_TO_WIRE = {v: k for k, v in WIRE_TO_NUMPY.items()}
# A shape from the network is checked before anything is sized from it: numpy refuses (or a
# product overflows) well before 2**63 bytes, and no real request has more than a few dims.
MAX_RANK = 32
MAX_ELEMENTS = 1 << 40


def config_to_wire(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32'; 'TYPE_STRING' -> 'BYTES' (config.pbtxt names to protocol names)."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def wire_to_numpy(wire: str) -> np.dtype:
    try:
        return WIRE_TO_NUMPY[wire]
    except KeyError:
        raise ValueError(f"unknown datatype '{wire}'") from None


def numpy_to_wire(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind in ("S", "U", "O"):
        return "BYTES"
    try:
        return _NUMPY_TO_WIRE[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton datatype") from None


def shape_count(shape) -> int:
    """Element count of a client's shape; ValueError unless it is a bounded list of dims >= 0.

    Zero dims do not hide the others: numpy sizes an array from every non-zero dim.
    """
    if len(shape) > MAX_RANK:
        raise ValueError(f"shape has {len(shape)} dimensions, at most {MAX_RANK} are allowed")
    count = span = 1
    for d in shape:
        if type(d) is not int:  # bool is refused here too; numpy integers are accepted
            if isinstance(d, bool) or not isinstance(d, np.integer):
                raise ValueError(f"shape {_show(shape)} must list non-negative integers")
            d = int(d)
        if d < 0:
            raise ValueError(f"shape {_show(shape)} must list non-negative integers")
        count *= d
        if d:
            span *= d
    if span > MAX_ELEMENTS:
        raise ValueError(f"shape {_show(shape)} has more than {MAX_ELEMENTS} elements")
    return count


def _show(shape) -> str:
    return repr(list(shape))[:100]


CHUNK_ELEMENTS = 1 << 16  # BYTES elements handled by one C-level pass (~20-40 ms)
_U32_PACK = struct.Struct("<I").pack
_U32_FROM = struct.Struct("<I").unpack_from


def object_chunks(array: np.ndarray) -> Iterator[tuple[list[Any], bool]]:
    """An object tensor's elements in C order, CHUNK_ELEMENTS at a time, each slice with
    whether its elements are all `bytes` (then C-level passes over it need no type checks)."""
    flat = np.asarray(array, dtype=np.object_).ravel(order="C")  # a view when contiguous
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        # one list per chunk: a single tolist() of 16 million held the GIL for half a second
        chunk = flat[start : start + CHUNK_ELEMENTS].tolist()
        yield chunk, set(map(type, chunk)) <= {bytes}


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Each element as a 4-byte little-endian length followed by its bytes, in C order.
    Elements that are all `bytes` (what the protocols decode) take a path with no Python loop
    per element, a slice of CHUNK_ELEMENTS at a time: a client's tensor may hold millions, and
    one C call over all of them would hold the GIL (and the event loop) for seconds."""
    parts: list[bytes] = []
    for chunk, all_bytes in object_chunks(array):
        if all_bytes:
            prefixes = map(_U32_PACK, map(len, chunk))
            parts.append(b"".join(itertools.chain.from_iterable(zip(prefixes, chunk,
                                                                    strict=True))))  # fmt: skip
            continue
        for item in chunk:
            if isinstance(item, str):
                item = item.encode("utf-8")
            elif not isinstance(item, bytes | bytearray | memoryview):
                item = str(item).encode("utf-8")
            parts.append(_U32_PACK(len(item)))
            parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes_tensor(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Inverse of serialize_bytes_tensor; raises ValueError on a truncated buffer.

    `count` comes from a client's shape: each element takes at least its 4-byte length, so a
    count the buffer cannot hold is refused before anything is sized from it. A client may
    send a quarter as many elements as bytes (16 million in a 64 MiB body), each one a turn of
    this loop on the event loop: it slices `bytes` (one object per element, no memoryview in
    between) and reads lengths through a bound Struct, about three times the old loop's speed.
    """
    data = buffer if type(buffer) is bytes else bytes(buffer)
    end = len(data)
    if count is not None and count * 4 > end:
        raise ValueError(f"{count} BYTES elements need at least {count * 4} bytes, {end} given")
    items: list[bytes] = []
    append = items.append
    unpack = _U32_FROM
    offset = 0
    for _ in range(count if count is not None else end):
        if offset >= end:
            break
        if offset + 4 > end:
            raise ValueError("truncated BYTES element length")
        stop = offset + 4 + unpack(data, offset)[0]
        if stop > end:
            raise ValueError("truncated BYTES element")
        append(data[offset + 4 : stop])
        offset = stop
    if count is not None and len(items) != count:
        raise ValueError(f"expected {count} BYTES elements, got {len(items)}")
    out = np.empty(len(items), dtype=np.object_)
    for start in range(0, len(items), CHUNK_ELEMENTS):  # GIL-sized C calls, as object_chunks
        out[start : start + CHUNK_ELEMENTS] = items[start : start + CHUNK_ELEMENTS]
    return out


def tensor_to_bytes(array: np.ndarray, wire: str) -> bytes | memoryview:
    """Raw little-endian payload of a tensor for the binary extension / gRPC raw contents."""
    if wire == "BYTES":
        return serialize_bytes_tensor(array)
    try:  # the common case, a C-contiguous array of a standard dtype: its own buffer, as bytes
        return memoryview(array).cast("B")
    except (TypeError, ValueError):
        # a uint8 view exports a plain buffer for every dtype (bfloat16 and bool included)
        return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def tensor_from_bytes(
    buffer, wire: str, shape: tuple[int, ...], count: int | None = None
) -> np.ndarray:
    """A numpy view (no copy) of raw bytes for fixed-size types; BYTES are decoded.

    `count`: shape_count(shape) when the caller has already checked the shape.
    """
    if count is None:
        count = shape_count(shape)
    if wire == "BYTES":
        return deserialize_bytes_tensor(buffer, count).reshape(shape)
    dtype = WIRE_TO_NUMPY[wire]
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise ValueError(
            f"expected {expected} bytes for shape {list(shape)} {wire}, got {len(buffer)}"
        )
    return np.ndarray(shape, dtype, buffer)  # a read-only view when the buffer is read-only
