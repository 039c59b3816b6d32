"""Triton tensor datatypes: names, numpy equivalents and the BYTES wire format.

Shared by the worker, the load generator and the python backend, so every stage agrees on what
"FP32" or "TYPE_STRING" means and on how a BYTES tensor is laid out in a binary payload.
"""

from __future__ import annotations

import struct

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


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Each element as a 4-byte little-endian length followed by its bytes, in C order."""
    parts: list[bytes] = []
    for item in np.asarray(array, dtype=np.object_).ravel(order="C"):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes | bytearray | memoryview):
            item = str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes_tensor(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Inverse of serialize_bytes_tensor; raises ValueError on a truncated buffer.

    `count` comes from a client's shape: each element takes at least its 4-byte length, so a
    count the buffer cannot hold is refused before anything is sized from it.
    """
    view = memoryview(buffer)
    if count is not None and count * 4 > len(view):
        raise ValueError(
            f"{count} BYTES elements need at least {count * 4} bytes, {len(view)} given"
        )
    items: list[bytes] = []
    offset, end = 0, len(view)
    while offset < end and (count is None or len(items) < count):
        if offset + 4 > end:
            raise ValueError("truncated BYTES element length")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("truncated BYTES element")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise ValueError(f"expected {count} BYTES elements, got {len(items)}")
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
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
