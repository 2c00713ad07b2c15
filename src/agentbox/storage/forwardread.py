"""A stream that seeks forward only: what lets ``tarfile`` read a pipe in its plain mode.

In its stream mode (``r|``) tarfile re-buffers every byte in 10 KB records and copies each
file's data three more times on the way out (joins, slices, a reader's buffer): at a
restore of a GB that was most of the CPU, more than decompressing and hashing together.
In mode ``r`` it only reads headers and seeks forward past what it skips, which a pipe
can do by reading and dropping; a file's data is then read by the caller straight into
its own buffer (``copy_into``), one copy from the pipe, none in Python.
"""

from __future__ import annotations

import io
import os
from typing import IO, Any


class ForwardReader(io.RawIOBase):
    """``source`` (a buffered stream) with ``tell`` and forward-only ``seek``."""

    def __init__(self, source: io.BufferedReader) -> None:
        self._source = source
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # not for callers that would seek back

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        data = self._source.read(size)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._source.readinto(buffer)
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = offset if whence == os.SEEK_SET else self._pos + offset
        if whence not in (os.SEEK_SET, os.SEEK_CUR) or target < self._pos:
            raise io.UnsupportedOperation("this stream seeks forward only")
        while self._pos < target:
            if not self.read(min(target - self._pos, 1 << 20)):
                break  # the end: the caller's next read says so
        return self._pos

    def copy_into(self, out: IO[bytes], size: int, chunk: int) -> int:
        """Write the next ``size`` bytes to ``out``; the number copied (less at the end)."""
        buffer = memoryview(bytearray(min(size, chunk)))
        left = size
        while left:
            n = self.readinto(buffer[: min(left, len(buffer))])
            if not n:
                break
            view = buffer[:n]
            while view:
                view = view[out.write(view) or 0 :]
            left -= n
        return size - left
