"""Bounds on everything an outside client controls, with defaults a 2-core machine survives.

The worker is a network service: every resource a client can grow (body bytes, header bytes,
connections, replies waiting on a slow reader, gRPC messages and RPCs, model instances) has a cap
here. Each cap is a `serve` flag; `Limits()` holds the defaults. They are set well above what a
profile needs (a 64 MiB request is a batch of 128 224x224 FP32 images) and well below what takes
the machine down.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    # HTTP: Triton's --http-max-input-size (64 MiB) caps Content-Length, chunked bodies and the
    # inflated size of a compressed body alike; beyond it the answer is 413.
    max_input_bytes: int = 64 * MIB
    # bytes of request bodies still arriving, all connections together; beyond it 503
    max_buffered_bytes: int = 1 << 30
    # request line + headers; beyond it 431 (headers) or 414 (URL)
    max_header_bytes: int = 64 * 1024
    # a request must arrive whole (headers and body) this long after its first byte
    header_timeout_s: float = 30.0
    # a keep-alive connection with nothing in flight is closed after this long
    idle_timeout_s: float = 300.0
    # open HTTP connections; at the cap the longest-stalled half-sent one is dropped for a
    # newcomer, and with none to drop the newcomer is answered 503
    max_connections: int = 4096
    # replies a connection may have outstanding (pipelined requests); reading pauses beyond it
    max_pending_per_connection: int = 64
    # bytes of replies queued in the socket's buffer before reading from that client pauses
    write_high_water_bytes: int = 16 * MIB
    # gRPC: the largest message either way (after decompression) and RPCs served at once
    grpc_max_message_bytes: int = 64 * MIB
    grpc_max_concurrent_rpcs: int = 4096
    # requests one ModelStreamInfer stream may have unanswered; reading the stream pauses beyond
    # it (HTTP/2 flow control then holds the client back)
    grpc_max_stream_pending: int = 1024
    # model instances one model version may ask for (instance_group counts x GPUs)
    max_instance_count: int = 64


def parse_size(text: str) -> int:
    """'64MB', '1g', '65536' -> bytes (binary units), for the size flags."""
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    for suffix, factor in (("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30)):
        if value.endswith(suffix):
            value, scale = value[:-1], factor
            break
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"'{text}' is not a size (examples: 65536, 64MB, 1g)") from None
    if number <= 0:
        raise ValueError(f"size '{text}' must be positive")
    return int(number * scale)
