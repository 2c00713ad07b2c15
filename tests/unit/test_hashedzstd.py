"""The snapshot stream: hashing and zstd on a worker thread give the same bytes and
digest as doing them in turn, and an error on either side ends both without a hang."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import subprocess
import threading
from pathlib import Path

import pytest
import zstandard

from agentbox.storage.hashedzstd import CHUNK, HashingZstdReader, HashingZstdWriter


def payload() -> bytes:
    # compressible and incompressible parts, not a multiple of the chunk size
    return os.urandom(3 * CHUNK + 12345) + b"agentbox " * 200_000


def test_writer_digest_and_frame_match_the_data(tmp_path: Path) -> None:
    data = payload()
    target = tmp_path / "out.zst"
    with target.open("wb") as out, HashingZstdWriter(out, level=3) as w:
        for i in range(0, len(data), 10_240):  # tarfile's record size
            w.write(memoryview(data)[i : i + 10_240])
    assert w.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
    assert w.size == len(data)
    # the zstd CLI reads the frame: it is a complete, standard one
    cli = subprocess.run(["zstd", "-q", "-d", "-c", str(target)], capture_output=True, check=True)
    assert cli.stdout == data


def test_reader_gives_the_data_and_its_digest(tmp_path: Path) -> None:
    data = payload()
    source = io.BytesIO(zstandard.ZstdCompressor(level=3).compress(data))
    with HashingZstdReader(source) as r:
        got = io.BufferedReader(r, CHUNK).read()
        assert got == data
        assert r.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
        assert r.read(10) == b""


def test_a_damaged_frame_is_an_error_in_the_reader() -> None:
    frame = bytearray(zstandard.ZstdCompressor(level=3).compress(payload()))
    frame[len(frame) // 2 :] = b"\xff" * (len(frame) - len(frame) // 2)
    with HashingZstdReader(io.BytesIO(bytes(frame))) as r, pytest.raises(zstandard.ZstdError):
        io.BufferedReader(r, CHUNK).read()


class _FailingOut(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        raise OSError(28, "No space left on device")


def test_an_output_error_reaches_the_writer_and_nothing_hangs() -> None:
    with pytest.raises(OSError, match="No space left"):
        with HashingZstdWriter(_FailingOut(), level=3) as w:  # type: ignore[arg-type]
            for _ in range(200):  # far more than the queue holds
                w.write(os.urandom(CHUNK))
    assert not [t for t in threading.enumerate() if t.name == "snapshot-compress"]


def test_a_caller_error_abandons_the_worker() -> None:
    out = io.BytesIO()
    with pytest.raises(KeyError):
        with HashingZstdWriter(out, level=3) as w:
            w.write(b"x" * CHUNK)
            raise KeyError("the tar side failed")
    assert not [t for t in threading.enumerate() if t.name == "snapshot-compress"]


def test_a_reader_closed_early_stops_its_worker() -> None:
    source = io.BytesIO(zstandard.ZstdCompressor(level=1).compress(os.urandom(40 * CHUNK)))
    with HashingZstdReader(source) as r:
        assert len(r.read(100)) == 100
    assert not [t for t in threading.enumerate() if t.name == "snapshot-decompress"]


def test_hashing_and_compressing_run_on_threads_of_their_own(tmp_path: Path) -> None:
    names: set[str] = set()
    with (tmp_path / "out.zst").open("wb") as out, HashingZstdWriter(out, level=3) as w:
        w.write(os.urandom(CHUNK))
        names = {t.name for t in threading.enumerate()}
    assert {"snapshot-hash", "snapshot-compress"} <= names
    assert not {"snapshot-hash", "snapshot-compress"} & {t.name for t in threading.enumerate()}


def test_an_output_error_stops_the_hashing_thread_too() -> None:
    with pytest.raises(OSError, match="No space left"):
        with HashingZstdWriter(_FailingOut(), level=3) as w:  # type: ignore[arg-type]
            for _ in range(200):
                w.write(os.urandom(CHUNK))
    assert not [t for t in threading.enumerate() if t.name == "snapshot-hash"]


def test_the_archive_goes_to_the_disk_while_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caller fsyncs the archive before it is stored: started as it is written, the
    # disk writes are mostly done by then (a GB archive's fsync took 0.4 s at the end).
    from agentbox.storage import hashedzstd

    started: list[tuple[int, int]] = []
    real = hashedzstd._sync_file_range

    def recording(fd: int, offset: int, count: int) -> None:
        started.append((offset, count))
        real(fd, offset, count)

    monkeypatch.setattr(hashedzstd, "_sync_file_range", recording)
    data = os.urandom(40 * CHUNK)  # incompressible: as much written as given
    target = tmp_path / "out.zst"
    with target.open("wb") as out, HashingZstdWriter(out, level=3) as w:
        for i in range(0, len(data), CHUNK):
            w.write(data[i : i + CHUNK])
    assert len(started) >= 3
    assert started[0][0] == 0
    for (offset, count), (following, _) in itertools.pairwise(started):
        assert offset + count == following  # ranges in order, none skipped
    assert started[-1][0] + started[-1][1] >= len(data) // 2
    with target.open("rb") as f:
        assert zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read() == data


def _frames(archive: bytes) -> list[list[int]]:
    """The block types (0 raw, 1 RLE, 2 compressed) of each frame of a zstd stream."""
    frames, at = [], 0
    while at < len(archive):
        assert archive[at : at + 4] == (0xFD2FB528).to_bytes(4, "little")
        header = zstandard.frame_header_size(archive[at:])
        at += header
        types: list[int] = []
        while True:
            block = int.from_bytes(archive[at : at + 3], "little")
            kind, size = block >> 1 & 3, block >> 3
            types.append(kind)
            at += 3 + (1 if kind == 1 else size)
            if block & 1:
                break
        frames.append(types)
    return frames


def test_what_does_not_compress_is_stored_raw_and_read_back_whole(tmp_path: Path) -> None:
    # Noise is not given to zstd (it would try, then store it raw): its chunks go out as
    # frames of raw blocks, between the codec's frames of what does compress.
    text = b"agentbox " * (CHUNK // 9 + 1)
    data = text[:CHUNK] + os.urandom(2 * CHUNK) + text[:CHUNK] + os.urandom(CHUNK)
    target = tmp_path / "out.zst"
    with target.open("wb") as out, HashingZstdWriter(out, level=3) as w:
        for i in range(0, len(data), CHUNK):
            w.write(data[i : i + CHUNK])
    archive = target.read_bytes()
    frames = _frames(archive)
    raw = [f for f in frames if set(f) == {0}]
    assert len(raw) == 3 and all(len(f) == CHUNK // (128 * 1024) for f in raw)
    assert len(frames) == 5  # text, noise, noise, text, noise
    assert len(archive) < 3 * CHUNK + CHUNK // 8  # the text compressed
    cli = subprocess.run(["zstd", "-q", "-d", "-c", str(target)], capture_output=True, check=True)
    assert cli.stdout == data
    with target.open("rb") as f, HashingZstdReader(f) as r:
        assert io.BufferedReader(r, CHUNK).read() == data
        assert r.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
    assert w.sha256.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_raw_chunk_bigger_than_the_iovec_limit_is_written_whole(tmp_path: Path) -> None:
    data = os.urandom(200 * CHUNK + 5)  # one write: 1601 blocks, two writev(2) calls
    target = tmp_path / "out.zst"
    with target.open("wb") as out, HashingZstdWriter(out, level=3) as w:
        w.write(data)
    cli = subprocess.run(["zstd", "-q", "-d", "-c", str(target)], capture_output=True, check=True)
    assert cli.stdout == data


def test_the_archive_is_made_durable_while_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sync_file_range does not flush a disk's cache: the caller's fsync at the end waited
    # for all of it (~0.11 s a 100 MB here). A thread of its own syncs as it goes.
    synced_by: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced_by.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    target = tmp_path / "out.zst"
    with target.open("wb") as out, HashingZstdWriter(out, level=3) as w:
        for _ in range(48):
            w.write(os.urandom(CHUNK))
    assert synced_by and set(synced_by) == {"snapshot-sync"}
    assert "snapshot-sync" not in {t.name for t in threading.enumerate()}


def test_a_failed_sync_on_the_way_fails_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Linux may report a failed writeback once: to that sync, not to the caller's fsync.
    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        with (tmp_path / "out.zst").open("wb") as out, HashingZstdWriter(out, level=3) as w:
            for _ in range(48):
                w.write(os.urandom(CHUNK))
    assert "snapshot-sync" not in {t.name for t in threading.enumerate()}
