"""Directory watches (runtime/watches.py) stay inside the sandbox root: a fake sandbox
root beside a "host" directory the sandbox user could even write; symlinks in the watched
tree (absolute, climbing, swapped in for a directory) are entries, never watched through.
The control test shows the same change is seen when the host directory is the one watched,
so the confinement tests would fail if the watch followed a link.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentbox.errors import FileNotFound
from agentbox.runtime.files import SandboxFiles
from agentbox.runtime.watches import DirWatch, Watches

UID, GID = 100777, 100778
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, setfsuid)")


@dataclass
class Env:
    base: Path
    root: Path
    host: Path
    watches: Watches

    def files(self, root: Path | None = None) -> SandboxFiles:
        return SandboxFiles(str(root or self.root), UID, GID)

    def steps(self, watch: DirWatch) -> list[tuple[str, str]]:
        self.watches.drain()  # every event queued so far is dispatched when it returns
        return [(e.path, e.kind) for e in self.watches.take(watch)]


@pytest.fixture
def env() -> Iterator[Env]:
    base = Path(tempfile.mkdtemp(prefix="agentbox-watch-"))  # traversable, unlike tmp_path
    watches = Watches()
    try:
        base.chmod(0o755)
        root, host = base / "root", base / "host"
        (root / "workspace" / "w").mkdir(parents=True)
        host.mkdir()
        for d in (root / "workspace", root / "workspace" / "w", host):
            os.chown(d, UID, GID)
            d.chmod(0o777)
        yield Env(base, root, host, watches)
    finally:
        shutil.rmtree(base)


def test_control_a_watch_of_the_host_directory_sees_the_change(env: Env) -> None:
    watch = env.watches.add(env.files(env.base), "/host", depth=5)
    (env.host / "x").write_text("1")
    assert ("/host/x", "create") in env.steps(watch)
    env.watches.remove(watch)


def test_symlinks_in_a_recursive_watch_are_never_followed(env: Env) -> None:
    w = env.root / "workspace" / "w"
    (w / "abs").symlink_to(env.host)  # the host's absolute path: in the root, nothing
    (w / "up").symlink_to("../../../host")  # climbs: clamped at the root
    (w / "root").symlink_to("/")
    watch = env.watches.add(env.files(), "/workspace/w", depth=10)
    (env.host / "x").write_text("1")
    (env.root / "workspace" / "beside").write_text("1")
    assert env.steps(watch) == []
    # made after the watch began: a link is created, and not watched through either
    (w / "late").symlink_to(env.host)
    (env.host / "y").write_text("1")
    assert env.steps(watch) == [("/workspace/w/late", "create")]
    env.watches.remove(watch)


def test_a_watched_path_through_a_symlink_stays_in_the_root(env: Env) -> None:
    (env.root / "workspace" / "link").symlink_to(env.host)
    with pytest.raises(FileNotFound):  # resolved inside the root: no such directory there
        env.watches.add(env.files(), "/workspace/link", depth=0)
    (env.root / "workspace" / "up2").symlink_to("../../host")
    with pytest.raises(FileNotFound):  # .. stops at the root: /host, not there
        env.watches.add(env.files(), "/workspace/up2", depth=0)
    (env.root / "workspace" / "up").symlink_to("../../..")
    watch = env.watches.add(env.files(), "/workspace/up", depth=0)  # clamped: the root itself
    (env.host / "x").write_text("1")
    assert env.steps(watch) == []
    env.watches.remove(watch)


def test_a_new_directory_is_covered_and_its_early_entries_announced(env: Env) -> None:
    watch = env.watches.add(env.files(), "/workspace/w", depth=10)
    made = env.host / "made"
    (made / "deep").mkdir(parents=True)  # outside, then moved in: seen where it lands
    (made / "deep" / "f").write_text("1")
    made.rename(env.root / "workspace" / "w" / "made")
    assert env.steps(watch) == [
        ("/workspace/w/made", "create"),
        ("/workspace/w/made/deep", "create"),
        ("/workspace/w/made/deep/f", "create"),
    ]
    (env.root / "workspace" / "w" / "made" / "deep" / "f").write_text("22")
    assert set(env.steps(watch)) == {("/workspace/w/made/deep/f", "write")}  # truncate, write
    env.watches.remove(watch)
    assert not env.watches._wds  # every kernel watch released with the last DirWatch
