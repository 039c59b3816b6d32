"""Requests in flight as the wire saw them: a tcpdump capture of one load run, read back.

Both load generators time their requests with their own clocks, and both clocks include time
the request spent inside the client (a response waiting to be read, a next request waiting for
its thread or for a write). A capture on the loopback sees neither client's internals: a request
is in flight from the packet that carries its first byte to the packet that starts its answer.
Every slot of a closed loop of c is either there or inside its client, so
(c - in flight) / answers per second is the client's time per cycle, for any client.

HTTP/1.1: one request at a time per connection, so a span runs from the first client payload
after an answer to the next server payload. gRPC: HTTP/2 frames are read from each direction's
byte stream; a span runs from a client HEADERS frame to the server's first frame on that stream.
The capture must hold whole packets from each connection's start (snaplen 0).
"""

from __future__ import annotations

import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

_PCAP_NS = 0xA1B23C4D  # tcpdump --time-stamp-precision=nano
_HEADERS, _DATA = 1, 0


@dataclass
class Packet:
    at_ns: int
    src: int  # TCP ports
    dst: int
    payload: bytes


def packets(path: Path) -> list[Packet]:
    """The TCP payloads of a pcap of the loopback (Ethernet framing, IPv4), in capture order."""
    data = path.read_bytes()
    if len(data) < 24:
        return []
    scale = 1 if struct.unpack("<I", data[:4])[0] == _PCAP_NS else 1000
    out, offset = [], 24
    while offset + 16 <= len(data):
        sec, frac, captured, _ = struct.unpack_from("<IIII", data, offset)
        offset += 16
        frame = data[offset : offset + captured]
        offset += captured
        ip = frame[14:]
        if len(ip) < 20 or ip[0] >> 4 != 4:
            continue
        ihl = (ip[0] & 15) * 4
        total = struct.unpack_from(">H", ip, 2)[0]
        tcp = ip[ihl:]
        src, dst = struct.unpack_from(">HH", tcp)
        payload = tcp[(tcp[12] >> 4) * 4 : total - ihl]
        if payload:
            out.append(Packet(sec * 1_000_000_000 + frac * scale, src, dst, payload))
    return out


def http_spans(pkts: list[Packet], port: int) -> list[tuple[int, int]]:
    """(request's first packet, answer's first packet) of every HTTP/1.1 exchange."""
    by_conn: dict[int, list[tuple[int, bool]]] = {}
    for p in pkts:
        to_server = p.dst == port
        by_conn.setdefault(p.src if to_server else p.dst, []).append((p.at_ns, to_server))
    spans = []
    for events in by_conn.values():
        asking, since = False, 0
        for at, to_server in events:
            if to_server and not asking:
                asking, since = True, at
            elif not to_server:
                if asking:
                    spans.append((since, at))
                asking = False
    return spans


def grpc_spans(pkts: list[Packet], port: int) -> list[tuple[int, int]]:
    """(call's HEADERS, answer's first frame) of every gRPC call, from the HTTP/2 frames."""
    streams: dict[tuple[int, int], tuple[bytearray, list[tuple[int, int]]]] = {}
    for p in pkts:
        data, ends = streams.setdefault((p.src, p.dst), (bytearray(), []))
        data += p.payload
        ends.append((len(data), p.at_ns))
    asked: dict[tuple[int, int], int] = {}
    spans = []
    # the client's side of each connection first: an answer is matched to its call
    for (src, dst), (data, ends) in sorted(streams.items(), key=lambda kv: kv[0][1] != port):
        to_server = dst == port
        conn = src if to_server else dst
        offset = 24 if to_server and data.startswith(b"PRI * HTTP/2.0") else 0
        packet = 0
        while offset + 9 <= len(data):
            length = int.from_bytes(data[offset : offset + 3], "big")
            kind = data[offset + 3]
            stream = int.from_bytes(data[offset + 5 : offset + 9], "big") & 0x7FFFFFFF
            while ends[packet][0] <= offset:
                packet += 1
            at = ends[packet][1]
            if to_server and kind == _HEADERS:
                asked[(conn, stream)] = at
            elif not to_server and kind in (_HEADERS, _DATA) and (conn, stream) in asked:
                spans.append((asked.pop((conn, stream)), at))
            offset += 9 + length
    return spans


@dataclass
class WireFlight:
    in_flight: float  # mean requests between the client's packet and the answer's first
    answers_per_s: float
    client_us: float  # per slot and cycle, time outside the wire: (c - in flight) / answers

    @staticmethod
    def of(spans: list[tuple[int, int]], concurrency: int, seconds: float = 2.0) -> WireFlight:
        """Over `seconds` in the middle of the capture, where the load is steady."""
        if not spans:
            return WireFlight(0.0, 0.0, 0.0)
        mid = (min(s for s, _ in spans) + max(e for _, e in spans)) // 2
        t0, t1 = mid - int(seconds * 5e8), mid + int(seconds * 5e8)
        held = sum(max(0, min(e, t1) - max(s, t0)) for s, e in spans)
        answers = sum(1 for _, e in spans if t0 <= e < t1)
        in_flight = held / (t1 - t0)
        rate = answers / seconds
        client = (concurrency - in_flight) / rate * 1e6 if rate else 0.0
        return WireFlight(in_flight, rate, client)


class Capture:
    """tcpdump on the loopback for one port, pinned to `cpus`, for the life of a `with`.

    It runs at a higher priority than the worker it shares a core with; a capture that still
    lost packets (`dropped`) cannot be read back (an HTTP/2 byte stream loses its frames).
    """

    def __init__(self, port: int, out: Path, cpus: str) -> None:
        self.port, self.out, self.cpus = port, out, cpus
        self.process: subprocess.Popen | None = None
        self.dropped = 0

    def __enter__(self) -> Capture:
        self.out.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            ["nice", "-n", "-10", "taskset", "-c", self.cpus, "tcpdump", "-i", "lo", "-s", "0",
             "-B", "262144", "-j", "host", "--time-stamp-precision=nano", "-w", str(self.out), "-q",
             f"tcp port {self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        # tcpdump says "listening on lo" once its filter is in place
        assert self.process.stderr is not None
        said = self.process.stderr.readline().decode(errors="replace").strip()
        if "listening" not in said:
            self.process.wait(10)
            raise RuntimeError(f"tcpdump did not start: {said}")
        return self

    def __exit__(self, *exc) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(10)
        assert self.process.stderr is not None
        summary = self.process.stderr.read().decode(errors="replace")
        self.process.stderr.close()
        found = re.search(r"(\d+) packets? dropped by kernel", summary)
        self.dropped = int(found.group(1)) if found else 0

    def flight(self, protocol: str, concurrency: int) -> WireFlight | None:
        """None when the capture lost packets."""
        if self.dropped:
            return None
        pkts = packets(self.out)
        spans = grpc_spans(pkts, self.port) if protocol == "grpc" else http_spans(pkts, self.port)
        return WireFlight.of(spans, concurrency)
