"""The init tmpfs: one copy of the launcher binary per home, other versions kept (a process
of another agentbox version may be about to bind one), taken down with the home."""

from __future__ import annotations

from pathlib import Path

from agentbox.fsutil import is_mountpoint
from agentbox.isolation import initfs


def test_versions_live_side_by_side_and_release_unmounts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "lib").mkdir(parents=True)
    old, new = tmp_path / "agentbox-nsexec-aaaa", tmp_path / "agentbox-nsexec-bbbb"
    old.write_bytes(b"old binary")
    new.write_bytes(b"new binary")
    try:
        first = initfs.ensure(home, old)
        second = initfs.ensure(home, new)
        assert is_mountpoint(initfs.initfs_dir(home))  # a tmpfs, not the home's filesystem
        assert first.read_bytes() == b"old binary" and second.read_bytes() == b"new binary"
        assert first.stat().st_mode & 0o777 == 0o755
        assert initfs.ensure(home, new) == second  # present: nothing done again
        assert sorted(p.name for p in initfs.initfs_dir(home).iterdir()) == [old.name, new.name]
    finally:
        initfs.release(home)
    assert not is_mountpoint(initfs.initfs_dir(home))
