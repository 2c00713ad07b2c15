"""A SHA-256-addressed zstd stream, written or read with the hashing and the codec on
threads of their own.

A snapshot is a tar whose SHA-256 is its address, stored zstd-compressed. Done in turn on
one thread, building the tar (file reads, headers), hashing it and compressing it run at
about a third of ``tar | zstd -T0`` on two cores. Here the tar side hands 1 MiB chunks
through short queues to two workers, one hashing and one compressing (the reader: one
worker decompresses and hashes): ``hashlib`` and ``zstandard`` release the GIL on
buffers that size, so reading and scanning, hashing and compressing overlap.

A chunk that does not compress (noise, or data compressed already: archives, images,
packages) is not given to zstd: a probe of a few samples says so, and the chunk is
stored as it is, in a zstd frame of raw blocks. The stream is then a sequence of zstd
frames, which ``zstd -d`` and the readers here read as one.

An error on either side ends both: a worker's is raised in the caller at its next
write/read or at close; a caller that stops early stops the workers.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import io
import os
import queue
import threading
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any

CHUNK = 1 << 20
_DEPTH = 8  # chunks in flight: enough to ride out a slow file, 8 MiB of memory at most
_END = b""


class Worker:
    """A thread doing ``work`` beside the caller, trading chunks through ``queue``. The
    first error is kept for the caller; ``stop`` ends the thread at its next chunk."""

    def __init__(self, name: str, work: Callable[[Worker], None]) -> None:
        self.queue: queue.Queue[bytes] = queue.Queue(_DEPTH)
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self._work = work
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._work(self)
        except BaseException as e:  # handed to the caller, which raises it
            self.error = e
            self.stopping.set()

    def put(self, chunk: bytes) -> bool:
        """Queue ``chunk``; False once the other side stopped."""
        while not self.stopping.is_set():
            try:
                self.queue.put(chunk, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def get(self) -> bytes | None:
        """The next chunk; None once the other side stopped."""
        while not self.stopping.is_set():
            try:
                return self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
        return None

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join()

    def join(self) -> None:
        self._thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


class SnapshotWriter(io.RawIOBase):
    """What both snapshot writers share (this one and zstdpipe's): ``sha256`` and
    ``size`` of the uncompressed stream, and a ``with`` block left by an exception
    abandons the work (``_abandon``) instead of finishing it: the caller's error is the
    one that matters, and it discards the partial file."""

    size: int

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size  # what tarfile's mode "w" asks at its start

    def _abandon(self) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        """Give the stream up unfinished (its file is to be discarded); close() after it
        does nothing."""
        if not self.closed:
            io.RawIOBase.close(self)
            self._abandon()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.abandon()
            return
        self.close()


class HashingZstdWriter(SnapshotWriter):
    """Write the uncompressed stream; it is hashed on one worker thread and compressed
    into ``out`` on another, both beside the caller (``hashlib`` and ``zstandard``
    release the GIL on chunks this size), so that on two cores reading and scanning,
    hashing and compressing overlap. Small writes (tar headers, small files) are gathered
    into 1 MiB chunks first; a big one is handed over without a copy.

    In-process compression costs about half the CPU of piping the same bytes to the
    ``zstd`` program (no pipe copies either way, no reading thread in zstd): on two
    cores that CPU is the snapshot's throughput. ``threads``: zstd's own worker threads
    (0: on the compressing thread itself, the cheapest in CPU; -1: one per core).

    A chunk whose probe says zstd would save nothing on it (zstd's own rule: under
    1/64) is written as it is, as a frame of raw blocks (the codec's frame before it is
    ended): zstd stores such data raw anyway, after trying, which on noise was about
    1 s of CPU a GB, the bulk of a snapshot's on two cores.

    When ``out`` is a file, its written pages are sent to the disk as they come
    (``sync_file_range``, asynchronous), so that the caller's fsync at the end waits for
    the last few MiB, not for the whole archive.

    ``close()`` waits for both workers; then ``sha256`` and ``size`` are the uncompressed
    stream's digest and length. Leaving a ``with`` block by an exception abandons the
    frame (the caller discards the file)."""

    def __init__(self, out: IO[bytes], *, level: int, threads: int = 0) -> None:
        import zstandard  # only snapshot and restore pay for the codec's import

        self.sha256 = hashlib.sha256()
        self.size = 0
        self._out = out
        self._fd = _fileno(out)
        self._synced = 0  # bytes of ``out`` whose writing to the disk was started
        self._durable = 0  # bytes of ``out`` the syncing thread was asked to make durable
        self._syncer = _Syncer(self._fd) if self._fd is not None else None
        compressor = zstandard.ZstdCompressor(level=level, threads=threads)
        self._zout = compressor.stream_writer(out, closefd=False, write_size=CHUNK)
        self._end_frame = zstandard.FLUSH_FRAME
        self._prober = zstandard.ZstdCompressor(level=1)  # on the compressing thread only
        self._framed = False  # the codec has a frame open
        self._out_started = False  # a frame was begun
        self._pending = bytearray()
        self._hasher = Worker("snapshot-hash", self._hash)
        self._compressor = Worker("snapshot-compress", self._compress)

    def _hash(self, worker: Worker) -> None:
        while (chunk := worker.get()) is not None:
            if not chunk:  # _END: the writer closed
                return
            self.sha256.update(chunk)

    def _compress(self, worker: Worker) -> None:
        while (chunk := worker.get()) is not None:
            if not chunk:  # _END: the writer closed
                if self._framed or not self._out_started:  # (an empty stream: one frame)
                    self._zout.close()  # type: ignore[no-untyped-call]  # the frame's end; ``out`` stays open (closefd=False)
                return
            if len(chunk) >= _PROBED and not self._compressible(chunk):
                self._raw(chunk)
            else:
                self._zout.write(chunk)
                self._framed = True
            self._out_started = True
            self._write_back()

    def _compressible(self, chunk: bytes) -> bool:
        """Whether zstd would save anything on ``chunk``, judged on a few samples of it
        compressed fast: it stores a block raw when it saves under 1/64 of it (its
        ``ZSTD_minGain``), after trying, which on noise cost ~1 s of CPU a GB."""
        span = len(chunk) - _SAMPLE
        raw = _SAMPLES * _SAMPLE
        packed = 0
        for i in range(_SAMPLES):
            at = span * i // (_SAMPLES - 1)
            packed += len(self._prober.compress(chunk[at : at + _SAMPLE]))
            if packed + (_SAMPLES - 1 - i) * _WORST < raw - raw // 64:
                return True  # whatever the samples left give (text: after the first)
        return False

    def _raw(self, chunk: bytes) -> None:
        """``chunk`` as a zstd frame of its own made of raw (stored) blocks: the frame
        before it is ended (a stream of frames is a zstd stream; ``zstd -d`` reads it
        whole)."""
        if self._framed:
            self._zout.flush(self._end_frame)
            self._framed = False
        view = memoryview(chunk)
        pieces: list[bytes | memoryview] = [_raw_frame_header(len(chunk))]
        for at in range(0, len(chunk), _RAW_BLOCK):
            block = view[at : at + _RAW_BLOCK]
            last = at + _RAW_BLOCK >= len(chunk)
            pieces += [(len(block) << 3 | int(last)).to_bytes(3, "little"), block]
        if self._fd is None:
            for piece in pieces:
                self._out.write(piece)
            return
        self._out.flush()  # the codec's bytes before these
        _write_all(self._fd, pieces)
        self._out.seek(0, io.SEEK_CUR)  # the buffered file's idea of its offset, again

    def _write_back(self) -> None:
        """Start the disk writes of what was written since the last start, every 8 MiB;
        every 16 MiB, have the syncing thread make it durable."""
        if self._fd is None:
            return
        written = self._out.tell()
        if written - self._synced >= _DEPTH * CHUNK:
            self._out.flush()
            _sync_file_range(self._fd, self._synced, written - self._synced)
            if written - self._durable >= _DURABLE_EVERY and self._syncer is not None:
                self._syncer.ask()
                self._durable = written
            self._synced = written

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if n >= _DIRECT:  # handed over as it is: no copy (bytes cannot change after)
            self._flush()
            self._send(data if type(data) is bytes else bytes(data))
        else:
            self._pending += data  # the caller's buffer is reused once this returns
            if len(self._pending) >= CHUNK:
                self._flush()
        self.size += n
        return n

    def _send(self, chunk: bytes) -> None:
        for worker in (self._hasher, self._compressor):
            if not worker.put(chunk):
                self._hasher.raise_error()
                self._compressor.raise_error()
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
            for worker in (self._hasher, self._compressor):
                worker.put(_END)  # ignored by a worker that failed
                worker.join()
            if self._syncer is not None:
                self._syncer.close()
        self._compressor.raise_error()
        self._hasher.raise_error()
        if self._syncer is not None and self._syncer.error is not None:
            raise self._syncer.error  # once reported, the kernel may not say it again

    def _abandon(self) -> None:
        self._hasher.stop()
        self._compressor.stop()
        if self._syncer is not None:
            self._syncer.close()


class _Syncer:
    """``fdatasync`` of a file on a thread of its own, whenever asked (asks made while
    one runs make one more). The caller's fsync at the end makes the archive durable;
    on this host's disk (a VM's, its host caching writes) that fsync waited ~0.11 s for
    100 MB written and already sent (``sync_file_range`` does not flush the device's
    cache), most of a 100 MB snapshot's tail; made durable as it is written, the last
    few MiB are left. Its first error is kept (``error``) for the writer to raise: a
    failed fsync may be reported once only, so the caller's could not see it."""

    def __init__(self, fd: int) -> None:
        self._fd = os.dup(fd)  # its own: the caller's may be closed meanwhile
        self._asked = threading.Event()
        self._closing = False
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="snapshot-sync", daemon=True)
        self._thread.start()

    def ask(self) -> None:
        self._asked.set()

    def _run(self) -> None:
        try:
            while True:
                self._asked.wait()
                self._asked.clear()
                if self._closing:
                    return
                os.fdatasync(self._fd)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EROFS):  # those: a file that cannot sync
                self.error = e
        finally:
            os.close(self._fd)

    def close(self) -> None:
        """End the thread (after the sync it is running) and wait for it."""
        self._closing = True
        self._asked.set()
        self._thread.join()


_DIRECT = 256 * 1024  # a write this big goes to the workers without a copy
_DURABLE_EVERY = 16 * CHUNK  # of the archive, made durable as it is written
_PROBED = 64 * 1024  # a chunk this big is probed before it is compressed
_SAMPLES, _SAMPLE = 8, 4096  # the probe: this many pieces this big, spread over the chunk
_WORST = _SAMPLE + 16  # the most a sample compresses to (stored raw, with a frame's bytes)
_RAW_BLOCK = 128 * 1024  # zstd's largest block
_IOV_MAX = 1024  # pieces per writev(2)
# A frame of raw blocks (RFC 8878): the magic number; a descriptor saying an 8-byte
# content size follows the window (no checksum, no dictionary); a 128 KiB window.
_RAW_FRAME = (0xFD2FB528).to_bytes(4, "little") + bytes([0xC0, (17 - 10) << 3])


def _raw_frame_header(size: int) -> bytes:
    return _RAW_FRAME + size.to_bytes(8, "little")


def _write_all(fd: int, pieces: list[bytes | memoryview]) -> None:
    """``pieces`` written to ``fd`` in order, in as few system calls as it takes."""
    first = 0
    while first < len(pieces):
        n = os.writev(fd, pieces[first : first + _IOV_MAX])
        while first < len(pieces) and n >= len(pieces[first]):
            n -= len(pieces[first])
            first += 1
        if n:  # a short write: the rest of that piece next
            pieces[first] = memoryview(pieces[first])[n:]


_SYNC_FILE_RANGE_WRITE = 2


def _fileno(f: IO[bytes]) -> int | None:
    try:
        return f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


@functools.cache
def _libc_sync_file_range() -> Any:
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


def _sync_file_range(fd: int, offset: int, count: int) -> None:
    """Start writing ``[offset, offset + count)`` of ``fd`` to its disk, without waiting
    (a hint: nothing is promised until the caller's fsync)."""
    func = _libc_sync_file_range()
    if func is not None:
        func(fd, offset, count, _SYNC_FILE_RANGE_WRITE)  # an error: the fsync will say


class HashingZstdReader(io.RawIOBase):
    """Read the uncompressed stream of the zstd ``source``; decompression and hashing run
    on a worker thread ahead of the reader. ``sha256`` is the digest of what was
    decompressed (all of it once ``read`` returned b"")."""

    def __init__(self, source: IO[bytes]) -> None:
        import zstandard

        self.sha256 = hashlib.sha256()
        # A snapshot is a stream of frames (raw ones for what does not compress).
        self._stream = zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True)
        self._pending = memoryview(b"")
        self._eof = False
        self._worker = Worker("snapshot-decompress", self._decompress)

    def _decompress(self, worker: Worker) -> None:
        while True:
            chunk = self._stream.read(CHUNK)
            self.sha256.update(chunk)
            if not worker.put(chunk) or not chunk:
                return

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._pending:
            if self._eof:
                return 0
            chunk = self._worker.get()
            if chunk is None:
                self._worker.raise_error()
                raise ValueError("read from a closed snapshot stream")
            if not chunk:
                self._eof = True
                self._worker.join()
                return 0
            self._pending = memoryview(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._worker.stop()
