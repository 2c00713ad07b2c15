"""A snapshot comes back from a store someone else may write to (an S3 bucket): restoring
a hostile archive must not write outside the new sandbox's disk, create devices, keep
setuid bits, or accept content that does not match the snapshot's digest."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard

from agentbox.errors import InvalidRequest
from agentbox.runtime.snapshots import _extract


@dataclass
class FakeHost:
    host_uid: int = 2_000_123
    host_gid: int = 2_000_123


def archive(tmp: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> tuple[Path, str]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    tar_bytes = raw.getvalue()
    path = tmp / "snap.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(tar_bytes))
    return path, hashlib.sha256(tar_bytes).hexdigest()


def entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = b"x", **kw: object
          ) -> tuple[tarfile.TarInfo, bytes | None]:  # fmt: skip
    info = tarfile.TarInfo(name)
    info.type = kind
    info.uid = info.gid = 1000
    info.mode = 0o644
    if kind == tarfile.REGTYPE and data is not None:
        info.size = len(data)
    for key, value in kw.items():
        setattr(info, key, value)
    return info, data if kind == tarfile.REGTYPE else None


@pytest.fixture
def target(tmp_path: Path) -> Path:
    disk = tmp_path / "disk"
    disk.mkdir()
    return disk


def unpack(path: Path, target: Path, digest: str) -> None:
    with path.open("rb") as archive:
        _extract(archive, target, FakeHost(), digest)  # type: ignore[arg-type]


def refused(tmp_path: Path, target: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]
            ) -> str:  # fmt: skip
    path, digest = archive(tmp_path, members)
    with pytest.raises(InvalidRequest) as caught:
        unpack(path, target, digest)
    return caught.value.message


@pytest.mark.parametrize(
    "name", ["../escape", "workspace/../../escape", "/etc/agentbox-pwned", "procs/x", "work/x",
             "workspace//x", "./workspace/x"],
)  # fmt: skip
def test_names_outside_the_kept_parts_are_refused(tmp_path: Path, target: Path, name: str) -> None:
    refused(tmp_path, target, [entry(name)])
    assert not (tmp_path / "escape").exists() and not Path("/etc/agentbox-pwned").exists()


def test_no_write_through_a_planted_symlink(tmp_path: Path, target: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    message = refused(tmp_path, target, [
        entry("workspace", tarfile.DIRTYPE, mode=0o755),
        entry("workspace/a", tarfile.SYMTYPE, linkname=str(outside)),
        entry("workspace/a/pwned", data=b"owned"),
    ])  # fmt: skip
    assert "non-directory" in message
    assert list(outside.iterdir()) == []


def test_hard_links_stay_inside(tmp_path: Path, target: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host")
    refused(tmp_path, target, [entry("workspace/h", tarfile.LNKTYPE,
                                     linkname="../host-secret")])  # fmt: skip
    refused(tmp_path, target, [entry("workspace/h", tarfile.LNKTYPE, linkname=str(secret))])
    assert secret.stat().st_nlink == 1


def test_devices_are_refused_but_whiteouts_kept(tmp_path: Path, target: Path) -> None:
    refused(tmp_path, target, [entry("upper/null", tarfile.CHRTYPE, devmajor=1, devminor=3)])
    refused(tmp_path, target, [entry("upper/sda", tarfile.BLKTYPE, devmajor=8, devminor=0)])
    refused(tmp_path, target, [entry("upper/fifo", tarfile.FIFOTYPE)])
    path, digest = archive(tmp_path, [entry("upper/etc/gone", tarfile.CHRTYPE)])
    unpack(path, target, digest)
    whiteout = os.lstat(target / "upper/etc/gone")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0


def test_setuid_bits_dropped_and_ids_mapped(tmp_path: Path, target: Path) -> None:
    path, digest = archive(tmp_path, [
        entry("workspace/tool", mode=0o6755),
        entry("workspace/rootfile", uid=0, gid=0),
    ])  # fmt: skip
    unpack(path, target, digest)
    tool = os.lstat(target / "workspace/tool")
    assert stat.S_IMODE(tool.st_mode) == 0o755
    assert (tool.st_uid, tool.st_gid) == (FakeHost.host_uid, FakeHost.host_gid)
    assert os.lstat(target / "workspace/rootfile").st_uid == 0


def test_content_must_match_the_digest(tmp_path: Path, target: Path) -> None:
    path, _ = archive(tmp_path, [entry("workspace/a", data=b"tampered")])
    with pytest.raises(InvalidRequest, match="digest"):
        unpack(path, target, "0" * 64)


def test_a_file_cut_short_is_refused(tmp_path: Path, target: Path) -> None:
    # The header promises more than the archive holds: the end of the stream is not
    # silently taken for the end of the file.
    info, _ = entry("workspace/big", data=b"y" * 5000)
    header = info.tobuf(tarfile.PAX_FORMAT)
    tar_bytes = header + b"y" * 1000
    path = tmp_path / "short.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(tar_bytes))
    with pytest.raises(InvalidRequest, match=r"cut short|damaged"):
        unpack(path, target, hashlib.sha256(tar_bytes).hexdigest())


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_SPARSE, tarfile.CONTTYPE])
def test_regular_file_kinds_snapshots_never_write_are_refused(
    tmp_path: Path, target: Path, kind: bytes
) -> None:
    # A sparse entry's map could point its reads anywhere in the stream.
    info, data = entry("workspace/s", data=b"z" * 600)
    info.type = kind
    assert "never hold" in refused(tmp_path, target, [(info, data)])
    assert not (target / "workspace/s").exists()
