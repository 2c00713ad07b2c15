"""The formatted-disk cache of a fresh home, filled by parallel first creates (the threads
of one gateway or node): each thread stages its own image, and all of them get a disk."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentbox.isolation import disk


def test_parallel_first_disks_in_one_process(tmp_path: Path) -> None:
    cache = tmp_path / "formatted"

    def layout(mountpoint: Path) -> None:
        (mountpoint / "workspace").mkdir()

    def make(i: int) -> int:
        image = tmp_path / f"disk-{i}.img"
        disk.make_filesystem(image, 64 << 20, cache, layout, "workspace")
        return image.stat().st_size

    with ThreadPoolExecutor(6) as pool:
        sizes = list(pool.map(make, range(6)))
    assert sizes == [64 << 20] * 6
    cached = [p.name for p in cache.iterdir()]
    assert len(cached) == 1 and cached[0].startswith("ext4-"), cached  # no staging left
