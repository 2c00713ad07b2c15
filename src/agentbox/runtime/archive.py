"""Tar entries: the one checker of what an archive may carry (names, types), with a policy
per reader: uploads through the file API (:data:`UPLOAD`), snapshot restores
(``runtime.snapshots``) and image layers (``runtime.templates.oci``); and how walked
entries are described in a download.

The filesystem side (resolving every entry inside the root it is extracted into) lives
with each reader; this module never touches a path.
"""

from __future__ import annotations

import os
import stat
import tarfile
from dataclasses import dataclass
from typing import IO, Literal

from agentbox.errors import AgentboxError, InvalidRequest, PathEscape


def open_reader(fileobj: IO[bytes]) -> tarfile.TarFile:
    """A streaming reader (plain, gz, bz2 or xz): entries are read once, in order, so an
    upload never has to fit in memory or on disk before extraction."""
    try:
        return tarfile.open(fileobj=fileobj, mode="r|*")
    except (tarfile.TarError, EOFError) as exc:
        raise InvalidRequest(
            f"the upload is not a tar stream (plain, gzip, bzip2 or xz): {exc}"
        ) from None


Special = Literal["fifo", "device", "whiteout"]


@dataclass(frozen=True)
class EntryPolicy:
    """What one kind of archive may carry; :func:`checked` applies it. Whatever the policy,
    an entry with an absolute name, a ``..`` component or a NUL byte is refused, and so is
    a link without a target or a hard link whose target is refused by the same rules."""

    what: str  # names an entry in messages: "tar entry", "snapshot entry"
    holds: str  # what such archives hold, for the refusal of another type
    special: frozenset[Special] = frozenset()  # beyond files, directories and links
    top: tuple[str, ...] = ()  # when set: the first component is one of these
    exact: bool = False  # refuse empty and "." components instead of dropping them
    escape: type[AgentboxError] = PathEscape  # the error for a name that would leave


# Uploads through the file API: what `tar -C DIR -c .` makes of ordinary files.
UPLOAD = EntryPolicy("tar entry", "uploads may only hold files, directories and links")


@dataclass(frozen=True)
class Entry:
    parts: tuple[str, ...]  # the name's components, relative to where it is extracted
    link: tuple[str, ...] | None  # a hard link's target, likewise (None: not a hard link)


def checked(member: tarfile.TarInfo, policy: EntryPolicy) -> Entry:
    """``member``'s name and type under ``policy``, or the error that refuses it.

    Absolute names and ``..`` components are refused rather than rewritten: an archive
    that carries them was made to escape, or by mistake, and silently extracting it
    somewhere else would hide either.
    """
    what = f"{policy.what} {member.name!r}"
    parts = _parts(member.name, what, policy)
    link = None
    if member.issym() or member.islnk():
        if not member.linkname or "\0" in member.linkname:
            raise InvalidRequest(f"{what} is a link without a valid target", entry=member.name)
        if member.islnk():
            link = _parts(member.linkname, f"the hard link target of {what}", policy)
    elif not (member.isreg() or member.isdir() or _special(member) in policy.special):
        raise InvalidRequest(
            f"{what} is {_kind(member)}: {policy.holds}; remove it from the archive",
            entry=member.name,
        )
    return Entry(parts, link)


def _parts(name: str, what: str, policy: EntryPolicy) -> tuple[str, ...]:
    if "\0" in name:
        raise InvalidRequest(f"{what} has a NUL byte in its name; rebuild the archive")
    if name.startswith("/"):
        raise policy.escape(
            f"{what} has an absolute name ({name!r}); archive paths relative to the "
            "directory to extract into (tar -C DIR -c .)",
            entry=name,
        )
    raw = name.rstrip("/").split("/")
    parts = tuple(p for p in raw if p not in ("", "."))
    if ".." in parts:
        raise policy.escape(
            f"{what} contains a '..' component ({name!r}); entries must stay inside the "
            "directory they are extracted into",
            entry=name,
        )
    if policy.exact and len(parts) != len(raw):
        raise InvalidRequest(f"{what} has an empty or '.' component", entry=name)
    if policy.top and (not parts or parts[0] not in policy.top):
        raise InvalidRequest(f"{what} is not a path inside {', '.join(policy.top)}", entry=name)
    return parts


def _special(member: tarfile.TarInfo) -> Special | None:
    if member.ischr() and member.devmajor == 0 and member.devminor == 0:
        return "whiteout"  # how overlayfs marks a deleted lower entry
    if member.ischr() or member.isblk():
        return "device"
    return "fifo" if member.isfifo() else None


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr() or member.isblk():
        return "a device node"
    return "a fifo" if member.isfifo() else f"a special entry (type {member.type!r})"


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
