"""The snapshot stream's codecs: written in this process, read through the zstd program;
same bytes and digest as the in-process codec, frames either side reads, and a failure on
either side is an error, not a short archive."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import threading
from pathlib import Path

import pytest
import zstandard

from agentbox.errors import InvalidRequest
from agentbox.storage import hashedzstd, zstdpipe
from agentbox.storage.zstdpipe import CHUNK, PipeReader

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program")


def payload() -> bytes:
    # compressible and incompressible parts, not a multiple of the chunk size
    return os.urandom(3 * CHUNK + 12345) + b"agentbox " * 200_000


def test_a_file_is_written_in_process_and_read_through_the_program(tmp_path: Path) -> None:
    with (tmp_path / "a").open("wb") as out, zstdpipe.writer(out, level=3) as w:
        assert isinstance(w, hashedzstd.HashingZstdWriter)
    with (tmp_path / "a").open("rb") as source, zstdpipe.reader(source) as r:
        assert isinstance(r, PipeReader)


def test_a_stream_without_a_descriptor_uses_the_in_process_codec() -> None:
    with zstdpipe.writer(io.BytesIO(), level=3) as w:
        assert isinstance(w, hashedzstd.HashingZstdWriter)
    source = io.BytesIO(zstandard.ZstdCompressor().compress(b"x"))
    with zstdpipe.reader(source) as r:
        assert isinstance(r, hashedzstd.HashingZstdReader)


def test_written_frame_digest_and_size_match_the_data(tmp_path: Path) -> None:
    data = payload()
    target = tmp_path / "out.zst"
    with target.open("wb") as out, zstdpipe.writer(out, level=3) as w:
        for i in range(0, len(data), 10_240):  # tarfile's record size
            w.write(memoryview(data)[i : i + 10_240])
    assert w.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
    assert w.size == len(data)
    # the in-process codec (a host without the program) and the program read it
    with target.open("rb") as f:
        assert zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read() == data
    with target.open("rb") as f, zstdpipe.reader(f) as r:
        assert io.BufferedReader(r, CHUNK).read() == data


def test_reader_gives_the_data_and_its_digest_of_an_in_process_frame(tmp_path: Path) -> None:
    data = payload()
    source = tmp_path / "in.zst"
    source.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    with source.open("rb") as f, zstdpipe.reader(f) as r:
        got = io.BufferedReader(r, CHUNK).read()
        assert got == data
        assert r.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
        assert r.read(10) == b""


@pytest.mark.parametrize("damage", ["garbled", "truncated"])
def test_a_damaged_frame_is_a_typed_error_at_the_end(tmp_path: Path, damage: str) -> None:
    frame = bytearray(zstandard.ZstdCompressor(level=3).compress(payload()))
    if damage == "garbled":
        frame[len(frame) // 2 :] = b"\xff" * (len(frame) - len(frame) // 2)
    else:
        del frame[len(frame) // 2 :]
    source = tmp_path / "bad.zst"
    source.write_bytes(bytes(frame))
    with source.open("rb") as f, zstdpipe.reader(f) as r:
        with pytest.raises(InvalidRequest, match="damaged"):
            io.BufferedReader(r, CHUNK).read()


def test_a_full_disk_under_the_writer_is_an_error(tmp_path: Path) -> None:
    with open("/dev/full", "wb") as out:
        with pytest.raises(OSError, match="No space left"):
            with zstdpipe.writer(out, level=3) as w:
                for _ in range(64):
                    w.write(os.urandom(CHUNK))


def test_a_reader_closed_early_ends_zstd(tmp_path: Path) -> None:
    source = tmp_path / "big.zst"
    source.write_bytes(zstandard.ZstdCompressor(level=1).compress(os.urandom(40 * CHUNK)))
    with source.open("rb") as f, zstdpipe.reader(f) as r:
        assert len(r.read(100)) == 100
    assert isinstance(r, PipeReader)
    assert r._proc.returncode is not None


def test_the_forward_reader_never_seeks_back() -> None:
    from agentbox.storage.forwardread import ForwardReader

    stream = ForwardReader(io.BufferedReader(io.BytesIO(bytes(range(200)))))
    assert stream.read(10) == bytes(range(10))
    assert stream.seek(50) == 50 and stream.read(1) == bytes([50])
    with pytest.raises(io.UnsupportedOperation):
        stream.seek(5)
    out = io.BytesIO()
    assert stream.copy_into(out, 500, 64) == 149  # what was left, not what was asked
    assert out.getvalue() == bytes(range(51, 200))


def test_the_reader_hashes_on_a_thread_of_its_own(tmp_path: Path) -> None:
    # On the reading thread the SHA-256 was a third of a restore's time: it runs beside.
    data = payload()
    source = tmp_path / "in.zst"
    source.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    with source.open("rb") as f, zstdpipe.reader(f) as r:
        assert isinstance(r, PipeReader)
        assert r.read(10) == data[:10]
        assert "restore-hash" in {t.name for t in threading.enumerate()}
        rest = io.BufferedReader(r, CHUNK).read()
    # the digest is taken after the reader closed, as a restore does: still all of it
    assert data[:10] + rest == data
    assert r.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
    assert "restore-hash" not in {t.name for t in threading.enumerate()}


def test_a_reader_closed_early_ends_its_hashing_thread(tmp_path: Path) -> None:
    source = tmp_path / "big.zst"
    source.write_bytes(zstandard.ZstdCompressor(level=1).compress(os.urandom(40 * CHUNK)))
    with source.open("rb") as f, zstdpipe.reader(f) as r:
        assert len(r.read(3 * CHUNK)) > 0
    assert "restore-hash" not in {t.name for t in threading.enumerate()}
    assert r.sha256.hexdigest() != hashlib.sha256(b"").hexdigest()  # a part: no hang
