"""Zero-copy relaying with ``splice(2)``: socket -> pipe -> socket, the bytes never enter
Python. A relay through asyncio streams costs two extra copies per byte plus a coroutine
switch per chunk (about 60 % of direct throughput here); splicing gets within a few
percent of a direct download.

The streams are handed over: reading is paused on the source transport (so asyncio does
not consume what we splice), whatever the source's StreamReader already buffered is sent
first, the destination transport's write buffer is flushed, and the two sockets are
driven through duplicated descriptors with ``add_reader``/``add_writer``. The transports
still own the sockets and close them afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
from collections.abc import Callable
from typing import cast

# os.splice arrived in Python 3.10 and exists on Linux only.
AVAILABLE = hasattr(os, "splice")
PIPE_SIZE = 1024 * 1024  # /proc/sys/fs/pipe-max-size's default; smaller is fine too
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_ROUNDS_PER_WAKEUP = 8


def take_over(
    src: tuple[asyncio.StreamReader, asyncio.StreamWriter], dst: asyncio.StreamWriter
) -> tuple[socket.socket, socket.socket, bytes] | None:
    """Stop asyncio reading ``src`` and return (source socket, destination socket, bytes
    already buffered) as duplicated sockets, or None when this pair cannot be spliced."""
    reader, writer = src
    # StreamReader has no public "take what is buffered": its buffer is read directly.
    # If a future Python renames it, we fall back to copying through the streams.
    buffer = getattr(reader, "_buffer", None)
    if not AVAILABLE or not isinstance(buffer, bytearray) or reader.exception() is not None:
        return None
    if writer.transport.is_closing() or dst.transport.is_closing():
        return None
    src_fd = _fileno(writer)
    dst_fd = _fileno(dst)
    if src_fd < 0 or dst_fd < 0:
        return None
    cast(asyncio.Transport, writer.transport).pause_reading()
    pending = bytes(buffer)
    buffer.clear()
    src_sock = socket.socket(fileno=os.dup(src_fd))
    try:
        dst_sock = socket.socket(fileno=os.dup(dst_fd))
    except BaseException:
        src_sock.close()
        raise
    return src_sock, dst_sock, pending


def _fileno(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    try:
        return int(sock.fileno()) if sock is not None else -1
    except (OSError, ValueError):
        return -1


async def flushed(writer: asyncio.StreamWriter) -> None:
    """Wait until the transport has handed every byte written through it to the kernel
    (spliced bytes must not overtake them)."""
    transport = writer.transport
    if transport.get_write_buffer_size():
        transport.set_write_buffer_limits(high=0, low=0)
        await writer.drain()


class Splicer:
    """One direction: ``src`` -> pipe -> ``dst``, until EOF on ``src`` and everything is
    delivered. Driven by readiness callbacks, not by a coroutine per chunk."""

    def __init__(
        self,
        src: socket.socket,
        dst: socket.socket,
        pending: bytes,
        counted: Callable[[int], None],
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.src, self.dst = src.fileno(), dst.fileno()
        self.dst_sock = dst
        self.pending = pending
        self.counted = counted
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.pipe_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.in_pipe = 0
        self.eof = False
        self.reading = self.writing = False

    async def run(self) -> None:
        try:
            self._flush()
            await self.done
        finally:
            self._stop_reading()
            self._stop_writing()
            os.close(self.pipe_r)
            os.close(self.pipe_w)

    def _on_readable(self) -> None:
        # Move what has arrived and deliver it, a few rounds per wake-up: each round trip
        # through the event loop costs more than a splice.
        for _ in range(_ROUNDS_PER_WAKEUP):
            try:
                moved = os.splice(self.src, self.pipe_w, PIPE_SIZE, flags=_FLAGS)
            except BlockingIOError:
                if self.in_pipe:  # the pipe is full: _flush resumes reading once it drains
                    self._stop_reading()
                return
            except OSError as e:
                self._fail(e)
                return
            if moved:
                self.in_pipe += moved
            else:
                self.eof = True
                self._stop_reading()
            self._flush()
            if self.eof or self.writing or self.done.done():
                return  # finished, or the destination is full: _flush carries on

    def _flush(self) -> None:
        try:
            while self.pending:
                sent = self.dst_sock.send(self.pending)
                self.pending = self.pending[sent:]
                self.counted(sent)
            while self.in_pipe:
                moved = os.splice(self.pipe_r, self.dst, self.in_pipe, flags=_FLAGS)
                self.in_pipe -= moved
                self.counted(moved)
        except BlockingIOError:
            self._want_writing()
            return
        except OSError as e:
            self._fail(e)
            return
        self._stop_writing()
        if self.eof:
            if not self.done.done():
                self.done.set_result(None)
        else:
            self._want_reading()

    def _fail(self, error: OSError) -> None:
        self._stop_reading()
        self._stop_writing()
        if not self.done.done():
            self.done.set_exception(error)

    def _want_reading(self) -> None:
        if not self.reading and not self.done.done():
            self.loop.add_reader(self.src, self._on_readable)
            self.reading = True

    def _stop_reading(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.src)
            self.reading = False

    def _want_writing(self) -> None:
        if not self.writing and not self.done.done():
            self.loop.add_writer(self.dst, self._flush)
            self.writing = True

    def _stop_writing(self) -> None:
        if self.writing:
            self.loop.remove_writer(self.dst)
            self.writing = False
