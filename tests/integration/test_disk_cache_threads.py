"""The formatted-disk cache of a fresh home, filled by parallel first creates (the threads
of one gateway or node): each thread stages its own image, and every disk made from the
cache has the layout in it (a node's first creates failed on a missing /workspace)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentbox.isolation import disk

THREADS = 8


def test_parallel_first_disks_in_one_process(tmp_path: Path) -> None:
    cache = tmp_path / "formatted"

    def layout(mountpoint: Path) -> None:
        (mountpoint / "workspace").mkdir()
        subprocess.run(["true"], check=True)  # forks meanwhile, as a busy gateway's threads do

    def make(i: int) -> bool:
        image = tmp_path / f"disk-{i}.img"
        disk.make_filesystem(image, 64 << 20, cache, layout, "workspace")
        mountpoint = tmp_path / f"mnt-{i}"
        disk.mount_disk(image, mountpoint)
        try:
            return (mountpoint / "workspace").is_dir()
        finally:
            disk.unmount(mountpoint)

    for _ in range(3):
        for p in cache.glob("*"):
            p.unlink()
        for p in tmp_path.glob("disk-*"):
            p.unlink()
        with ThreadPoolExecutor(THREADS) as pool:
            laid_out = list(pool.map(make, range(THREADS)))
        assert laid_out == [True] * THREADS
        cached = [p.name for p in cache.iterdir()]
        assert len(cached) == 1 and cached[0].startswith("ext4-"), cached  # no staging left
