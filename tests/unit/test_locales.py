"""The sandboxes' locale archive (``isolation.locales``): built from the host's locale
directories once per set of them, rebuilt when the host's change, and none where the host
has an archive already or nothing to archive."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agentbox.isolation import locales

C_UTF8 = Path("/usr/lib/locale/C.utf8")
pytestmark = pytest.mark.skipif(
    not (C_UTF8 / "LC_CTYPE").is_file() or shutil.which("localedef") is None,
    reason="needs the C.utf8 locale directory and localedef",
)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host locale directory with C.utf8 in it, as libc-bin ships it."""
    root = tmp_path / "usr-lib-locale"
    root.mkdir()
    shutil.copytree(C_UTF8, root / "C.utf8", symlinks=True)
    monkeypatch.setattr(locales, "HOST_LOCALES", root)
    monkeypatch.setattr(locales, "_last", None)
    return root


def _listed(directory: Path) -> list[str]:
    out = subprocess.run(
        ["localedef", "--list-archive", str(directory / locales.ARCHIVE)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.split()


def test_an_archive_of_the_hosts_locales_beside_copies_of_them(host: Path, tmp_path: Path) -> None:
    home, initfs = tmp_path / "home", tmp_path / "initfs"
    initfs.mkdir()
    made = locales.ensure(home, initfs)
    assert made is not None and made.parent == initfs
    assert _listed(made) == ["C.utf8"]
    assert (made / "C.utf8" / "LC_CTYPE").read_bytes() == (
        host / "C.utf8" / "LC_CTYPE"
    ).read_bytes()
    assert made.stat().st_mode & 0o777 == 0o755
    assert (made / locales.ARCHIVE).stat().st_mode & 0o777 == 0o644
    assert locales.ensure(home, initfs) == made  # the same host locales: made once
    assert sorted(p.name for p in initfs.iterdir()) == [made.name]  # no staging left


def test_a_change_on_the_host_makes_a_new_one_and_keeps_the_old(host: Path, tmp_path: Path) -> None:
    home, initfs = tmp_path / "home", tmp_path / "initfs"
    initfs.mkdir()
    first = locales.ensure(home, initfs)
    shutil.copytree(host / "C.utf8", host / "xx_XX", symlinks=True)  # a new locale
    second = locales.ensure(home, initfs)
    assert second is not None and second != first
    assert {"C.utf8", "xx_XX"} <= set(_listed(second))
    assert first is not None and first.is_dir()  # a running sandbox may have it bound


def test_nothing_where_the_host_has_an_archive_or_no_locale(
    host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, initfs = tmp_path / "home", tmp_path / "initfs"
    initfs.mkdir()
    (host / locales.ARCHIVE).write_bytes(b"the host's own")
    assert locales.ensure(home, initfs) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(locales, "HOST_LOCALES", empty)
    assert locales.ensure(home, initfs) is None
    assert list(initfs.iterdir()) == []
