"""The snapshot stream's codec: which one writes, which one reads.

Writing is in this process (``hashedzstd.HashingZstdWriter``): the SHA-256 on one thread,
zstd on another (the ``zstandard`` library, its frames standard ones), beside the caller
that reads and secret-scans. It used to pipe the stream to ``zstd -T0``, as the shell
pipeline does; on two cores the pipe's two copies of every byte and the program's own
reading thread cost about twice the CPU of compressing in place, and CPU is what bounds
a snapshot there (300 MB of noise: 0.6 s of zstd's CPU against 0.3 s).

Restore reads ``zstd -d``'s output from a pipe and hashes it on the reading thread, or,
without the program (or a descriptor), uses ``hashedzstd.HashingZstdReader``. The frames
are standard zstd frames either way, so archives written by one are read by the other.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
from typing import IO, Any

from agentbox.errors import InvalidRequest
from agentbox.storage import hashedzstd

CHUNK = hashedzstd.CHUNK
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named from Python 3.10 on some builds only


def _fileno(f: IO[bytes]) -> int | None:
    try:
        return f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


def _zstd() -> str | None:
    return shutil.which("zstd", path=os.defpath + ":/usr/local/bin")


def writer(out: IO[bytes], *, level: int) -> hashedzstd.HashingZstdWriter:
    """A hashing, compressing writer into ``out`` (``sha256`` and ``size`` after close):
    in this process (``hashedzstd``), whose compression costs half the CPU of piping to
    the program (measured: 0.3 s against 0.6 s for 300 MB of noise)."""
    return hashedzstd.HashingZstdWriter(out, level=level, threads=-1)


def reader(source: IO[bytes]) -> PipeReader | hashedzstd.HashingZstdReader:
    """A decompressing, hashing reader of ``source`` (``sha256`` once read to its end)."""
    program = _zstd()
    fd = _fileno(source)
    if program is None or fd is None:
        return hashedzstd.HashingZstdReader(source)
    return PipeReader(program, fd)


def _bigger_pipe(fd: int) -> None:
    # 64 KiB by default: a 1 MiB pipe takes a whole chunk per system call.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, CHUNK)


def _failed(proc: subprocess.Popen[bytes], what: str) -> str:
    err = proc.stderr.read() if proc.stderr is not None else b""
    return f"zstd {what} failed (exit {proc.returncode}): {err.decode(errors='replace').strip()}"


class PipeReader(io.RawIOBase):
    """Read the uncompressed stream of a zstd file (descriptor ``source_fd``, from its
    current offset), decompressed by ``zstd -d``; each chunk read is hashed on a thread
    of its own (``hashlib`` releases the GIL), so that the caller unpacks the next one
    meanwhile: on the reading thread the SHA-256 was a third of a restore's time. At the
    end, a damaged or truncated frame is an ``InvalidRequest``; ``sha256`` is the digest
    of everything read once the end was read."""

    def __init__(self, program: str, source_fd: int) -> None:
        self._digest = hashlib.sha256()
        self._proc = subprocess.Popen(
            [program, "-q", "-d", "-c"],
            stdin=source_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        self._fd = self._proc.stdout.fileno()
        _bigger_pipe(self._fd)
        self._eof = False
        self._hasher = hashedzstd.Worker("restore-hash", self._hash)
        self._hashed = False  # the hashing thread ended: ``_digest`` is final

    def _hash(self, worker: hashedzstd.Worker) -> None:
        while (chunk := worker.get()) is not None:
            if not chunk:  # the end
                return
            self._digest.update(chunk)

    @property
    def sha256(self) -> Any:
        """The digest of the stream: whole once ``read`` returned b"" (then it waits for
        the hashing thread to finish); of a part if taken before the end."""
        self._finish()
        self._hasher.raise_error()
        return self._digest

    def _finish(self) -> None:
        """End the hashing thread: after the chunks queued (at the end), or at once."""
        if self._hashed:
            return
        self._hashed = True
        if self._eof and self._hasher.put(b""):
            self._hasher.join()
        else:
            self._hasher.stop()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._eof:
            return 0
        if self._hashed:
            raise ValueError("read after the digest was taken")
        view = memoryview(buffer).cast("B")
        data = os.read(self._fd, len(view))  # a bytes of its own: hashed while we go on
        n = len(data)
        if n:
            view[:n] = data
            if not self._hasher.put(data):
                self._hasher.raise_error()
                raise ValueError("the snapshot's hashing thread stopped")
            return n
        self._eof = True
        if self._proc.wait() != 0:
            raise InvalidRequest(
                f"the snapshot's archive is damaged: {_failed(self._proc, 'decompression')}"
            )
        return 0

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._finish()
        if self._proc.poll() is None:  # closed before the end: nobody reads zstd's output
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()
