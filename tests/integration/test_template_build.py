"""A real mmdebstrap build of a small template from the Debian archive the host uses.

Fails (never skips) when the host cannot build: a template build is a core feature, and a
skipped test would hide a broken mirror or a missing tool.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentbox.errors import SandboxError
from agentbox.runtime.templates import TemplateStore, host_debian_sources

SUITE = "bookworm"


def _require_build_host() -> None:
    """Fail with what is missing: root, mmdebstrap, or a reachable Debian archive."""
    if os.geteuid() != 0:
        pytest.fail("template builds need root (mmdebstrap --mode=root); run this test as root")
    if shutil.which("mmdebstrap") is None:
        pytest.fail("mmdebstrap is not installed: apt-get install mmdebstrap")
    sources = host_debian_sources(SUITE) or "URIs: http://deb.debian.org/debian\n"
    uri = next(line.split()[1] for line in sources.splitlines() if line.startswith("URIs:")).rstrip(
        "/"
    )
    url = f"{uri}/dists/{SUITE}/InRelease"
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            response.read(64)
    except (OSError, urllib.error.URLError) as exc:
        pytest.fail(
            f"the Debian archive the host's apt uses is unreachable ({url}: {exc}); "
            "a template build needs it (check /etc/apt/sources.list*, DNS and the proxy)"
        )


def _chroot(rootfs: Path, *argv: str) -> str:
    return subprocess.run(
        ["chroot", str(rootfs), *argv], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


@pytest.mark.timeout(280)
def test_real_build_then_cache_hit(tmp_path: Path) -> None:
    _require_build_host()
    store = TemplateStore(tmp_path / "home")
    progress: list[str] = []
    started = time.monotonic()
    t = store.build("py", ["python3-minimal"], suite=SUITE, progress=progress.append)
    build_seconds = time.monotonic() - started

    root = t.rootfs
    assert (root / "usr/bin/python3").exists()
    assert _chroot(root, "/usr/bin/python3", "-c", "print(6 * 7)") == "42"
    assert _chroot(root, "/usr/bin/id", "-u", "user") == "1000"
    assert _chroot(root, "/usr/bin/id", "-g", "user") == "1000"
    assert "user:x:1000:1000::/home/user:/bin/bash" in (root / "etc/passwd").read_text()
    assert (root / "workspace").is_dir() and (root / "home/user").is_dir()
    assert (root / "etc/resolv.conf").read_bytes() == b""  # not the host's
    assert (root / "etc/hostname").read_text() == "agentbox\n"  # not the host's
    assert not (root / "etc/apt/apt.conf.d/99mmdebstrap").exists()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = (Path(dirpath) / name).lstat()
            assert not stat.S_ISCHR(st.st_mode) and not stat.S_ISBLK(st.st_mode)
            assert (st.st_uid, st.st_gid) == (0, 0)
            if not stat.S_ISLNK(st.st_mode):
                assert not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH | stat.S_ISUID)
    # the person watching saw apt/dpkg work, line by line
    assert any(line.startswith("Setting up python3-minimal") for line in progress)
    assert len(progress) > 50
    assert t.size_bytes > 10_000_000

    progress_again: list[str] = []
    started = time.monotonic()
    again = store.build(
        "py-again", ["python3-minimal"], suite=SUITE, progress=progress_again.append
    )
    assert time.monotonic() - started < 2.0, "a cache hit must not rebuild"
    assert again.digest == t.digest and again.rootfs == root
    assert progress_again[0].startswith("cache hit")
    assert list((store.root / "tmp").iterdir()) == []
    print(f"\nbuild took {build_seconds:.1f}s")

    # A sandbox runs on it: its own /usr (no host /usr bind), python from the template.
    from agentbox import Sandbox
    from agentbox.runtime.template_tiers import TIERS

    # pytest's tmp dirs are 0700; sandbox uids must traverse to their root.
    for parent in [tmp_path, *tmp_path.parents]:
        if str(parent).startswith("/tmp/"):
            parent.chmod(parent.stat().st_mode | 0o001)
    for tier in TIERS:  # on each isolation tier, from the one build
        with Sandbox.create("py", memory="128MiB", disk="64MiB", isolation=tier,
                            home=tmp_path / "home") as sb:  # fmt: skip
            r = sb.commands.run(
                ["/usr/bin/python3", "-c", "import sys; print(sys.version_info[0])"]
            )
            assert (r.stdout, r.exit_code) == ("3\n", 0), tier
            assert sb.commands.run(["/bin/sh", "-c", "test -e /usr/bin/gcc"]).exit_code == 1
            assert sb.commands.run(["/usr/bin/id", "-un"]).stdout == "user\n", tier


@pytest.mark.timeout(120)
def test_real_build_failure_leaves_nothing(tmp_path: Path) -> None:
    """A suite the archive does not have fails fast; a typo'd package fails only after the
    essential set is installed (~30s), which the unit tests cover with a fake mmdebstrap."""
    _require_build_host()
    store = TemplateStore(tmp_path / "home")
    with pytest.raises(SandboxError) as err:
        store.build("bad", [], suite="agentbox-no-such-suite")
    assert "does not have a Release file" in err.value.message  # apt's complaint, quoted
    assert list((store.root / "tmp").iterdir()) == []
    assert not (store.root / "sha256").exists()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(store.root) not in mounts
