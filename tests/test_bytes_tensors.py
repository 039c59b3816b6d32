"""BYTES tensors on the wire: 4-byte little-endian lengths, each followed by its element."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from analyzer.datatypes import deserialize_bytes_tensor, serialize_bytes_tensor


def test_elements_round_trip_whatever_they_hold():
    words = np.array([[b"abc", b""], [b"\x00\xff", b"d" * 70_000]], dtype=object)
    assert deserialize_bytes_tensor(serialize_bytes_tensor(words), 4).tolist() == (
        words.ravel().tolist())
    many = np.array([str(i).encode() for i in range(100_000)], dtype=object)
    back = deserialize_bytes_tensor(memoryview(serialize_bytes_tensor(many)), many.size)
    assert back.dtype == object and back.tolist() == many.tolist()
    # strings are UTF-8, anything else its str(): the path for elements not all bytes
    mixed = np.array(["héllo", b"x", 3, 1.5], dtype=object)
    assert deserialize_bytes_tensor(serialize_bytes_tensor(mixed)).tolist() == [
        "héllo".encode(), b"x", b"3", b"1.5"]
    assert serialize_bytes_tensor(np.array([], dtype=object)) == b""
    assert deserialize_bytes_tensor(b"", 0).size == 0


@pytest.mark.parametrize(("buffer", "count", "error"), [
    (b"\x05\x00\x00\x00abc", None, "truncated BYTES element"),
    (struct.pack("<I", 1) + b"a" + b"\x01\x00", None, "truncated BYTES element length"),
    (struct.pack("<I", 1) + b"a", 2, "2 BYTES elements need at least 8 bytes, 5 given"),
    (struct.pack("<I", 0) * 2, 3, "3 BYTES elements need at least 12 bytes, 8 given"),
    (struct.pack("<I", 4) + b"abcd", 2, "expected 2 BYTES elements, got 1"),
])  # fmt: skip
def test_a_buffer_that_does_not_hold_its_elements_is_refused(buffer, count, error):
    with pytest.raises(ValueError, match=error):
        deserialize_bytes_tensor(buffer, count)
