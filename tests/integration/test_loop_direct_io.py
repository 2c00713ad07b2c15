"""A snapshot's read-only view reads its clone with a direct-I/O loop device where the
filesystem allows it (4 KiB blocks), and still mounts, buffered, where it does not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentbox.isolation import disk

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loop devices need root")


def _dio_of(mountpoint: Path) -> str:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mountpoint):
            source = line.split(" - ")[1].split()[1]  # /dev/loopN
            return Path(f"/sys/block/{Path(source).name}/loop/dio").read_text().strip()
    raise AssertionError(f"{mountpoint} is not mounted")


@pytest.mark.parametrize(("size", "dio"), [(1024**3, "1"), (64 * 1024**2, "0")])
def test_direct_io_where_the_blocks_allow(tmp_path: Path, size: int, dio: str) -> None:
    image, mnt = tmp_path / "d.img", tmp_path / "mnt"
    disk.make_filesystem(image, size)
    expected_blocks = 4096 if dio == "1" else 1024
    assert disk._ext4_block_size(image) == expected_blocks
    disk.mount_disk(image, mnt, readonly=True, direct_io=True)
    try:
        assert _dio_of(mnt) == dio
        assert (mnt / "lost+found").is_dir()  # the filesystem reads either way
    finally:
        disk.unmount(mnt)


def test_buffered_unless_asked(tmp_path: Path) -> None:
    image, mnt = tmp_path / "d.img", tmp_path / "mnt"
    disk.make_filesystem(image, 1024**3)
    disk.mount_disk(image, mnt, readonly=True)
    try:
        assert _dio_of(mnt) == "0"
    finally:
        disk.unmount(mnt)
