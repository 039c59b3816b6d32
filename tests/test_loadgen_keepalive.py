"""The load generator resends once when a kept-alive connection closes under a request."""

from __future__ import annotations

import asyncio

from analyzer.loadgen.shard import Shard, ShardConfig

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"
REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_a_connection_closed_as_the_request_goes_out_is_resent_once():
    """A server's idle timeout can close a connection just as a request is written to it."""
    seen: list[int] = []

    async def run() -> Shard:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            number = len(seen)
            seen.append(number)
            while await reader.readuntil(b"{}"):
                if number == 1:  # the second connection: read the request, close unanswered
                    writer.close()
                    return
                writer.write(OK)
                await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            shard = Shard(ShardConfig("http", "127.0.0.1", port, [REQUEST]))
            await shard.open()  # connection 0: opened, then dropped by the client below
            shard.idle.pop().transport.close()
            await shard.request()  # connection 1 closes under it; resent on connection 2
            await shard.request()  # connection 2 kept alive
            return shard
        finally:
            server.close()

    shard = asyncio.run(run())
    assert shard.c_ok == [True, True] and not shard.errors
    assert shard.connections == 3 and len(seen) == 3


def test_a_connection_closed_after_answer_bytes_arrived_is_an_error_not_a_resend():
    async def run() -> Shard:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"{}")
            writer.write(OK[:20])  # half an answer, then gone: resending could run it twice
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            shard = Shard(ShardConfig("http", "127.0.0.1", port, [REQUEST]))
            await shard.open()
            await shard.request()
            return shard
        finally:
            server.close()

    shard = asyncio.run(run())
    assert shard.c_ok == [False] and sum(shard.errors.values()) == 1
