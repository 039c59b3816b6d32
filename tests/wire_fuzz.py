"""What the two wire fuzzes (test_grpc_frame_fuzz.py, test_http_wire_fuzz.py) share: mutated
conversations sent on fresh connections a batch at a time, a valid call after each batch, and the
worker's output as an oracle."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

AT_ONCE = 48  # connections in flight together
BATCH = AT_ONCE * 5  # connections between two valid calls

T = TypeVar("T")
A = TypeVar("A")


async def in_batches(
    cases: list[bytes], case: Callable[[bytes], Awaitable[T]],
    after_batch: Callable[[], Awaitable[A]],
) -> tuple[list[T], list[A]]:
    """`case(data)` of every case, AT_ONCE at a time, and `after_batch()` after each BATCH."""
    results: dict[int, T] = {}
    after: list[A] = []
    for start in range(0, len(cases), BATCH):
        gate = asyncio.Semaphore(AT_ONCE)

        async def one(i: int, gate: asyncio.Semaphore = gate) -> None:
            async with gate:
                results[i] = await case(cases[i])

        await asyncio.gather(*(one(i) for i in range(start, min(start + BATCH, len(cases)))))
        after.append(await after_batch())
    return [results[i] for i in range(len(cases))], after


async def until(call: Callable[[], Awaitable[T]], ok: Callable[[T], bool],
                seconds: float = 15) -> T:  # fmt: skip
    """`call()` until `ok` of what it returns or `seconds` have passed: connections a batch
    just closed may still hold their slots for a moment, a leaked slot holds it for good."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        got = await call()
        if ok(got) or loop.time() > deadline:
            return got
        await asyncio.sleep(0.2)


def faults(output: list[str]) -> list[str]:
    """The worker's lines that say a bug ran: a traceback, or an ERROR (asyncio logs a task
    collected while still pending as one)."""
    return [line for line in "".join(output).splitlines()
            if "Traceback" in line or " ERROR " in line]  # fmt: skip
