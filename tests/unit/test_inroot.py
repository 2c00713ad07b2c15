"""The one in-root handle (agentbox.storage.inroot): paths resolve as if the tree were /,
whatever it holds. The file API's and the template finisher's escape tests run on it too
(tests/security/test_file_api_escapes.py, tests/unit/test_templates.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from agentbox.storage.inroot import InRoot


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "outside").write_text("host secret")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0\n")
    (root / "up").symlink_to("../../outside")
    (root / "abs").symlink_to(str(tmp_path / "outside"))
    (root / "etc" / "link").symlink_to("passwd")
    (root / "proc-self").symlink_to("/proc/self/root/etc/hostname")
    return root


@pytest.mark.parametrize("path", ["up", "abs", "../outside", "/../outside", "etc/../../outside"])
def test_nothing_outside_the_root_is_reached(tree: Path, path: str) -> None:
    with InRoot(tree) as root:
        assert root.read(path) is None and not root.exists(path)


def test_symlinks_resolve_inside_or_not_at_all(tree: Path) -> None:
    with InRoot(tree) as root:
        assert root.read("/etc/link") == b"root:x:0:0\n" and root.is_file("etc/link")
        assert not root.exists("proc-self")  # magic links: refused
    with InRoot(tree, symlinks=False) as strict:
        assert strict.read("etc/passwd") == b"root:x:0:0\n"
        assert strict.read("etc/link") is None and not strict.exists("etc/link")
        with pytest.raises(OSError):
            strict.open("etc/link", os.O_PATH)


def test_read_takes_regular_files_only_and_never_blocks(tree: Path) -> None:
    """A FIFO planted where a file is expected (an image's etc/passwd) returns None at
    once: opened non-blocking, not read."""
    os.mkfifo(tree / "etc" / "group")
    done = threading.Event()
    result: list[bytes | None] = []

    def read() -> None:
        with InRoot(tree) as root:
            result.append(root.read("etc/group"))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(30), "reading a FIFO blocked"
    assert result == [None]
    with InRoot(tree) as root:
        assert root.read("etc") is None and root.exists("etc", os.O_DIRECTORY)
        assert root.read("etc/passwd", 4) == b"root"
