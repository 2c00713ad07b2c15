"""A locale archive for sandboxes that see the host's ``/usr``, on the home's init tmpfs.

Every process of a sandbox starts with ``LANG=C.UTF-8``. Where the host has no
``/usr/lib/locale/locale-archive`` (Debian without ``locales-all``: only the ``C.utf8``
directory that libc-bin ships), glibc finds a locale by opening its ``LC_*`` files one by
one: 25 opens (the name as given, then normalised) and 12 mmaps in every program that
calls ``setlocale``, ~0.2 ms of CPU for each ``bash -c`` here, a fifth of its start. From
an archive it is one open and one mmap.

So a sandbox bound to the host's ``/usr`` gets, read-only at ``/usr/lib/locale``, a
directory holding the host's own locale directories, copied as they are, and an archive
that ``localedef --add-to-archive`` built from them: the same locales and the same data,
in the form glibc loads fastest. Built once per home and per set of host locales (named
by their digest, never changed in place: a running sandbox keeps the one it bound), on
the init tmpfs (a bind from there names no host path), and shared by every sandbox.
Where the host has an archive already, or nothing to archive, nothing is bound.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from agentbox.digest import sha256_hex
from agentbox.fsutil import locked

HOST_LOCALES = Path("/usr/lib/locale")
ARCHIVE = "locale-archive"
MAX_BYTES = 4 << 20  # more than a few locales in directories: left as the host has them
_failed: set[str] = set()  # host locale sets that could not be archived (not retried)
# The last walk: its directories, their (inode, mtime), and the key it gave.
_last: tuple[list[str], list[tuple[int, int]] | None, str | None] | None = None


def ensure(home: Path, initfs_root: Path) -> Path | None:
    """The directory to bind at ``/usr/lib/locale`` (made on the mounted init tmpfs
    ``initfs_root`` if need be), or None: bind nothing."""
    if (HOST_LOCALES / ARCHIVE).exists():
        return None
    key = _host_key()
    if key is None or key in _failed:
        return None
    target = initfs_root / f"locale-{key}"
    if target.is_dir():
        return target
    with locked(home / "lib" / "initfs.lock"):
        if target.is_dir():
            return target
        staging = initfs_root / f".locale-{os.getpid()}-{threading.get_ident()}"
        try:
            _build(staging)
            staging.rename(target)
        except (OSError, subprocess.SubprocessError) as e:  # e.g. the tmpfs is full
            import logging  # here: a rare path, and the SDK's import stays light
            import shutil

            logging.getLogger(__name__).warning(
                "no locale archive for sandboxes (%s): each process loads files", e
            )
            shutil.rmtree(staging, ignore_errors=True)
            _failed.add(key)
            return None
    return target


def _host_key() -> str | None:
    """A digest of the host's locale directories (names, sizes, times, link targets), or
    None when there are none or too many bytes of them. Walked again only when one of its
    directories changed (a package replaces files by renaming them in: the directory's
    mtime moves), so a create pays a few stats, not the walk."""
    global _last
    if _last is not None and _stats(_last[0]) == _last[1]:
        return _last[2]
    entries: list[str] = []
    directories = [str(HOST_LOCALES)]
    total = 0
    try:
        for root, dirs, files in os.walk(HOST_LOCALES):
            dirs.sort()
            directories += [os.path.join(root, d) for d in dirs]
            for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                path = os.path.join(root, name)
                st = os.lstat(path)
                target = os.readlink(path) if os.path.islink(path) else ""
                entries.append(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{target}")
                total += st.st_size
    except OSError:
        return None
    key = None
    if entries and total <= MAX_BYTES:
        key = sha256_hex("\n".join(entries).encode())[:16]
    _last = (directories, _stats(directories), key)
    return key


def _stats(directories: list[str]) -> list[tuple[int, int]] | None:
    try:
        return [(st.st_ino, st.st_mtime_ns) for st in map(os.lstat, directories)]
    except OSError:
        return None


def _build(staging: Path) -> None:
    """The host's locale directories and their archive, in ``staging`` (made here)."""
    import shutil  # once per home and host locale set

    staging.mkdir(mode=0o755)
    locales = sorted(
        p for p in HOST_LOCALES.iterdir()
        if p.is_dir() and not p.is_symlink() and (p / "LC_CTYPE").is_file()
    )  # fmt: skip
    for source in HOST_LOCALES.iterdir():
        if source.is_symlink():
            os.symlink(os.readlink(source), staging / source.name)
        elif source.is_dir():
            shutil.copytree(source, staging / source.name, symlinks=True)
        else:
            shutil.copy2(source, staging / source.name)
    # localedef writes PREFIX/usr/lib/locale/locale-archive (its compiled-in path).
    prefix = staging / ".prefix"
    (prefix / "usr/lib/locale").mkdir(parents=True)
    subprocess.run(
        ["localedef", "--prefix", str(prefix), "--add-to-archive", *map(str, locales)],
        check=True,
        capture_output=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
    )
    (prefix / "usr/lib/locale" / ARCHIVE).rename(staging / ARCHIVE)
    shutil.rmtree(prefix)
    # Readable by the sandbox user whatever our umask (copies keep the host's modes).
    os.chmod(staging, 0o755)  # noqa: S103 - public data, bound read-only
    os.chmod(staging / ARCHIVE, 0o644)
