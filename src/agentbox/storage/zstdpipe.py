"""The snapshot stream through the ``zstd`` program: compression (or decompression) in a
process of its own, the SHA-256 in this one.

``hashedzstd`` does both on a worker thread of this process, compression included, and on
two busy cores ran at a third of ``tar | zstd -T0``. Here ``zstd -T0`` compresses on its
own threads straight into the archive file, as the shell pipeline does (no copy of the
compressed stream through Python), and a thread of this process hashes each 1 MiB chunk
and writes it to zstd's pipe, both without the GIL, while the caller reads and
secret-scans the next one. Restore reads ``zstd -d``'s output from a pipe and hashes it on
the reading thread. The frames are standard zstd frames either way, so archives written by one are
read by the other.

``writer`` / ``reader`` pick this when the ``zstd`` program is installed and the file has
a descriptor, else the in-process codec of ``hashedzstd``.
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
_DIRECT = 256 * 1024  # a write this big goes to the hashing thread without a copy


def _fileno(f: IO[bytes]) -> int | None:
    try:
        return f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


def _zstd() -> str | None:
    return shutil.which("zstd", path=os.defpath + ":/usr/local/bin")


def writer(out: IO[bytes], *, level: int) -> PipeWriter | hashedzstd.HashingZstdWriter:
    """A hashing, compressing writer into ``out`` (``sha256`` and ``size`` after close)."""
    program = _zstd()
    fd = _fileno(out)
    if program is None or fd is None:
        return hashedzstd.HashingZstdWriter(out, level=level)
    return PipeWriter(program, out, fd, level)


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


class PipeWriter(hashedzstd.SnapshotWriter):
    """Write the uncompressed stream: hashed and piped to ``zstd -T0`` (which compresses
    into ``out``) on a thread of its own, so the caller's next chunk is read and scanned
    meanwhile (``hashlib`` and ``os.write`` release the GIL on chunks this size). Small
    writes (tar headers, small files) are gathered into 1 MiB chunks first. ``close()``
    waits for both and raises if zstd failed; leaving a ``with`` block by an exception
    kills it (the caller discards the partial file)."""

    def __init__(self, program: str, out: IO[bytes], out_fd: int, level: int) -> None:
        self.sha256 = hashlib.sha256()
        self.size = 0
        out.flush()
        self._proc = subprocess.Popen(
            [program, "-q", f"-{level}", "-T0", "-c"],
            stdin=subprocess.PIPE,
            stdout=out_fd,
            stderr=subprocess.PIPE,
        )
        assert self._proc.stdin is not None
        self._pipe = self._proc.stdin.fileno()
        _bigger_pipe(self._pipe)
        self._pending = bytearray()
        self._worker = hashedzstd.Worker("snapshot-hash", self._drain)

    def _drain(self, worker: hashedzstd.Worker) -> None:
        while (chunk := worker.get()) is not None:
            if not chunk:  # the writer closed
                return
            self.sha256.update(chunk)
            view = memoryview(chunk)
            try:
                while view:
                    view = view[os.write(self._pipe, view) :]
            except BrokenPipeError:
                self._proc.wait()
                raise OSError(_failed(self._proc, "compression")) from None

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if n >= _DIRECT:  # handed over as it is: no copy
            self._flush()
            self._send(data if type(data) is bytes else bytes(data))
        else:
            self._pending += data
            if len(self._pending) >= CHUNK:
                self._flush()
        self.size += n
        return n

    def _send(self, chunk: bytes) -> None:
        if not self._worker.put(chunk):
            self._worker.raise_error()
            raise ValueError("write to a finished snapshot stream")

    def _flush(self) -> None:
        if self._pending:
            self._send(bytes(self._pending))
            self._pending.clear()

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        try:
            self._flush()
        finally:
            self._worker.put(b"")  # the end (ignored by a worker that failed)
            self._worker.join()
            assert self._proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
            self._proc.wait()
        self._worker.raise_error()
        if self._proc.returncode != 0:
            raise OSError(_failed(self._proc, "compression"))
        self._close_stderr()

    def _close_stderr(self) -> None:
        if self._proc.stderr is not None:
            self._proc.stderr.close()

    def _abandon(self) -> None:
        self._proc.kill()  # first: a write blocked on the pipe fails now
        self._worker.stop()
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.close()
        self._proc.wait()
        self._close_stderr()


class PipeReader(io.RawIOBase):
    """Read the uncompressed stream of a zstd file (descriptor ``source_fd``, from its
    current offset), decompressed by ``zstd -d`` and hashed here as it is read. At the
    end, a damaged or truncated frame is an ``InvalidRequest``."""

    def __init__(self, program: str, source_fd: int) -> None:
        self.sha256 = hashlib.sha256()
        self._proc = subprocess.Popen(
            [program, "-q", "-d", "-c"],
            stdin=source_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        _bigger_pipe(self._proc.stdout.fileno())
        self._out = io.FileIO(self._proc.stdout.fileno(), "rb", closefd=False)
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._eof:
            return 0
        n = self._out.readinto(buffer)
        if n:
            self.sha256.update(memoryview(buffer)[:n])
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
        if self._proc.poll() is None:  # closed before the end: nobody reads zstd's output
            self._proc.kill()
        self._proc.wait()
        self._out.close()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()
