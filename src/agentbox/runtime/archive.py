"""Tar entry policy for the sandbox file API: which names, types and modes an upload may
carry, and how walked entries are described in a download.

The filesystem side (resolving every entry inside the sandbox root, with the sandbox
user's credentials) lives in ``agentbox.runtime.files``; this module never touches a path.
"""

from __future__ import annotations

import os
import stat
import tarfile
from typing import IO

from agentbox.errors import InvalidRequest, PathEscape


def open_reader(fileobj: IO[bytes]) -> tarfile.TarFile:
    """A streaming reader (plain, gz, bz2 or xz): entries are read once, in order, so an
    upload never has to fit in memory or on disk before extraction."""
    try:
        return tarfile.open(fileobj=fileobj, mode="r|*")
    except (tarfile.TarError, EOFError) as exc:
        raise InvalidRequest(
            f"the upload is not a tar stream (plain, gzip, bzip2 or xz): {exc}"
        ) from None


def member_parts(name: str, what: str) -> list[str]:
    """Path components of an archive name, relative to the extraction directory.

    Absolute names and ``..`` components are refused rather than rewritten: an archive
    that carries them was made to escape, or by mistake, and silently extracting it
    somewhere else would hide either. ``what`` names the entry in messages.
    """
    if "\0" in name:
        raise InvalidRequest(f"{what} has a NUL byte in its name; rebuild the archive")
    if name.startswith("/"):
        raise PathEscape(
            f"{what} has an absolute name ({name!r}); archive paths relative to the "
            "directory to extract into (tar -C DIR -c .)",
            entry=name,
        )
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathEscape(
            f"{what} contains a '..' component ({name!r}); entries must stay inside the "
            "directory they are extracted into",
            entry=name,
        )
    return parts


def check_member_type(member: tarfile.TarInfo) -> None:
    """Only files, directories, symlinks and hard links may be uploaded."""
    if member.isreg() or member.isdir() or member.islnk() or member.issym():
        if (member.issym() or member.islnk()) and (not member.linkname or "\0" in member.linkname):
            raise InvalidRequest(f"tar entry {member.name!r} is a link without a valid target")
        return
    if member.ischr() or member.isblk():
        kind = "a device node"
    elif member.isfifo():
        kind = "a fifo"
    else:
        kind = f"a special entry (type {member.type!r})"
    raise InvalidRequest(
        f"tar entry {member.name!r} is {kind}: uploads may only hold files, directories and "
        "links; remove it from the archive",
        entry=member.name,
    )


def member_mode(member: tarfile.TarInfo) -> int:
    """Permission bits only: setuid, setgid and sticky bits are stripped. Directories keep
    owner rwx so that the entries after them can still be extracted into them."""
    mode = member.mode & 0o777
    return mode | 0o700 if member.isdir() else mode


def _entry(arcname: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    # Ownership is not stored: host ids mean nothing elsewhere, and an upload makes the
    # extracting sandbox user own everything anyway.
    info = tarfile.TarInfo(arcname)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    return info


def regular_entry(arcname: str, st: os.stat_result) -> tarfile.TarInfo:
    info = _entry(arcname, st, tarfile.REGTYPE)
    info.size = st.st_size
    return info


def dir_entry(arcname: str, st: os.stat_result) -> tarfile.TarInfo:
    return _entry(arcname, st, tarfile.DIRTYPE)


def symlink_entry(arcname: str, st: os.stat_result, target: str) -> tarfile.TarInfo:
    info = _entry(arcname, st, tarfile.SYMTYPE)
    info.linkname = target
    return info
