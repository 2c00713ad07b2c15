"""A sandbox on the host's /usr loads its locale from an archive of the host's own
locales (``isolation.locales``): the same locales and data as the host's directories, one
mmap instead of a file per category, read-only, and nothing it can change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.isolation import locales


def _host_locale_names() -> list[str]:
    return sorted(p.name for p in locales.HOST_LOCALES.iterdir() if (p / "LC_CTYPE").is_file())


def test_the_sandbox_has_the_hosts_locales_in_an_archive(sandbox: Sandbox) -> None:
    if (locales.HOST_LOCALES / locales.ARCHIVE).exists():
        pytest.skip("the host has a locale archive of its own: the sandbox sees it as is")
    listed = sandbox.commands.run("localedef --list-archive", timeout=30)
    assert listed.exit_code == 0, listed.stderr
    assert set(_host_locale_names()) <= set(listed.stdout.split())
    # The directories are there too, as on the host (LOCPATH users, `locale -a`).
    host_all = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=True)
    inside = sandbox.commands.run("locale -a", timeout=30)
    assert inside.stdout.split() == host_all.stdout.split()


def test_the_default_locale_works_from_it(sandbox: Sandbox) -> None:
    result = sandbox.commands.run(
        "locale charmap; locale 2>&1 >/dev/null; printf '\\303\\251' | wc -m", timeout=30
    )
    assert result.exit_code == 0
    assert result.stdout.split() == ["UTF-8", "1"], result.stdout  # no "Cannot set" warning
    assert result.stderr == ""


def test_the_sandbox_cannot_change_it(sandbox: Sandbox, agentbox_home: Path) -> None:
    probe = (
        "for f in /usr/lib/locale/locale-archive /usr/lib/locale/new; do "
        "  (echo x >> $f) 2>/dev/null && echo WROTE $f; done; "
        "mount -o remount,rw /usr/lib/locale 2>/dev/null && echo REMOUNTED; true"
    )
    result = sandbox.commands.run(probe, timeout=30)
    assert result.ok, result  # the probe ran to its end
    assert "WROTE" not in result.stdout and "REMOUNTED" not in result.stdout
    # The shared copy on the host is root's and unchanged.
    shared = list((agentbox_home / "initfs").glob("locale-*"))
    assert shared, "no shared locale copy to check"
    for directory in shared:
        archive = directory / locales.ARCHIVE
        assert archive.stat().st_uid == 0 and archive.stat().st_mode & 0o777 == 0o644
        assert not (directory / "new").exists()
