"""Moving bytes between two stream pairs: fast, with backpressure, half-close and an
idle timeout, counting what went each way.

Open-ended relays (a tunnel, a response body) are spliced in the kernel when they can be
(:mod:`splice`); otherwise, and for framed copies (a request body of known length), the
bytes go through the streams in large chunks with write/drain backpressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from agentbox.network import splice

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
T = TypeVar("T")
# Large reads keep the per-chunk Python overhead small next to the copy itself.
CHUNK = 256 * 1024
# StreamReader limit: a reader pauses its transport only past 2x this, so a fast sender
# is not stopped and restarted every 64 KiB (the asyncio default).
STREAM_LIMIT = 1024 * 1024
WRITE_HIGH = 1024 * 1024
WRITE_LOW = 256 * 1024


class IdleTimeout(Exception):
    """No byte moved either way for the whole idle timeout."""


class Traffic:
    """Bytes each way (up = client to upstream) and when a byte last moved."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.up = 0
        self.down = 0
        self.last = self.loop.time()

    def count(self, size: int, *, upward: bool) -> None:
        if upward:
            self.up += size
        else:
            self.down += size
        self.last = self.loop.time()


def tune(writer: asyncio.StreamWriter) -> None:
    """Write-buffer limits matching the read size, so drain() rarely has to wait."""
    with contextlib.suppress(Exception):
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)


def half_close(writer: asyncio.StreamWriter) -> None:
    """Shut down our write side (the peer reads EOF) unless the transport is gone."""
    if writer.transport.is_closing():
        return
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()


async def pump(
    src: Streams, dst: Streams, traffic: Traffic, *, upward: bool, zero_copy: bool = True
) -> None:
    """Copy ``src`` to ``dst`` until EOF on ``src``, then half-close ``dst``."""
    if zero_copy:
        await splice.flushed(dst[1])
        tune(dst[1])  # flushed() zeroed the limits
        handed = splice.take_over(src, dst[1])
        if handed is not None:
            src_sock, dst_sock, pending = handed
            try:
                counted = lambda size: traffic.count(size, upward=upward)  # noqa: E731
                await splice.Splicer(src_sock, dst_sock, pending, counted).run()
                with contextlib.suppress(OSError):
                    dst_sock.shutdown(socket.SHUT_WR)
            finally:
                src_sock.close()
                dst_sock.close()
            return
    reader, writer = src[0], dst[1]
    while data := await reader.read(CHUNK):
        writer.write(data)
        traffic.count(len(data), upward=upward)
        await writer.drain()
    half_close(writer)


async def copy_exactly(
    src: asyncio.StreamReader,
    dst: asyncio.StreamWriter,
    size: int,
    traffic: Traffic,
    *,
    upward: bool,
) -> None:
    """Copy exactly ``size`` bytes (a framed body); fewer is a ConnectionError."""
    while size > 0:
        data = await src.read(min(CHUNK, size))
        if not data:
            raise ConnectionError("peer closed before the end of the message")
        dst.write(data)
        traffic.count(len(data), upward=upward)
        size -= len(data)
        await dst.drain()


def send(dst: asyncio.StreamWriter, data: bytes, traffic: Traffic, *, upward: bool) -> None:
    """Write ``data`` (already read from the other side) and count it."""
    if data:
        dst.write(data)
        traffic.count(len(data), upward=upward)


async def supervise(
    traffic: Traffic,
    idle_timeout: float,
    main: Sequence[Coroutine[Any, Any, None]],
    others: Sequence[Coroutine[Any, Any, None]] = (),
) -> None:
    """Run ``main`` and ``others`` together until every one of ``main`` has ended.

    The first error in any of them, or ``idle_timeout`` seconds without a byte moving, is
    raised; whatever is still running is cancelled either way.
    """
    loop = asyncio.get_running_loop()
    main_tasks = [asyncio.ensure_future(c) for c in main]
    tasks = [*main_tasks, *(asyncio.ensure_future(c) for c in others)]
    waiting = set(tasks)
    try:
        while not all(task.done() for task in main_tasks):
            left = traffic.last + idle_timeout - loop.time()
            if left <= 0:
                raise IdleTimeout(f"no data for {idle_timeout:g} s")
            done, waiting = await asyncio.wait(
                waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                task.result()  # re-raises the task's error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_of(*coros: Coroutine[Any, Any, T]) -> list[asyncio.Task[T]]:
    """Run ``coros`` together until one ends (the two directions of a relay): the others
    are cancelled and waited for. The tasks that ended by themselves, in order."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    return [task for task in tasks if task in done]


async def relay(
    client: Streams,
    upstream: Streams,
    traffic: Traffic,
    idle_timeout: float,
    *,
    zero_copy: bool = True,
) -> None:
    """Both directions until both reach EOF; EOF one way half-closes the other side."""
    up = pump(client, upstream, traffic, upward=True, zero_copy=zero_copy)
    down = pump(upstream, client, traffic, upward=False, zero_copy=zero_copy)
    await supervise(traffic, idle_timeout, (up, down))


async def close(writer: asyncio.StreamWriter, *, abort: bool = False) -> None:
    """Close (or, after an error, abort) a connection and wait for it, ignoring errors."""
    try:
        if abort:
            writer.transport.abort()
        else:
            writer.close()
        await asyncio.wait_for(writer.wait_closed(), 5)
    except (OSError, RuntimeError, TimeoutError, ConnectionError):
        pass
