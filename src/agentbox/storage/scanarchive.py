"""A PAX tar of a tree, secret-scanned in the same read: the bytes scanned are the bytes
stored.

A snapshot used to scan its tree, then read every file a second time to archive it: two
reads of everything, and only the frozen view promised that both saw the same bytes.
Here each regular file is read once, in 1 MiB chunks: each chunk goes to the archive's
writer (hashed and piped to zstd on another thread, compressed in another process) and
through the secret scan (``secretscan.FileScan``, whose pass in C releases the GIL), so
reading, scanning, hashing and compressing overlap, and every stored byte was scanned
(up to the scan budget; what is past it is reported, as ``scan_tree`` does).

What a finding does depends on when it is known. A file of at most ``HOLD`` bytes is held
in memory until its scan is done, then stored as it is or redacted. A bigger one is
streamed; a finding in it that must be redacted cannot be taken back from a stream already
hashed and compressed, so the archive is given up (``Outcome.complete`` is False), the
scan goes on to the end, and the caller runs it again with those files held
(``Outcome.hold``). A finding that refuses the snapshot gives the archive up at once; the
scan goes on, so that the refusal lists every finding.

Entries are in a fixed order (``treewalk``: a directory, its files, then its
subdirectories), so the same tree gives the same tar.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agentbox.errors import InvalidRequest
from agentbox.storage import secretscan, treewalk
from agentbox.storage.secretscan import AllowList, Finding

HOLD = 16 * 1024**2  # a file this small waits in memory for its scan before it is stored
_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt(3) parameters (glibc)


@functools.cache
def _reuse_freed_chunks() -> None:
    """Have glibc keep the 1 MiB chunks a snapshot frees for reuse. They are allocated
    here and freed on the hashing thread; with glibc's defaults their pages went back to
    the kernel and were faulted in (and zeroed) again: a page fault per 4 KiB of every
    snapshot, a third of the reading thread's time. The values are the ones glibc's own
    dynamic thresholds reach after freeing one 32 MiB chunk."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 * 1024**2)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 * 1024**2)


class Sink(Protocol):
    def write(self, data: bytes) -> int: ...


@dataclass(frozen=True)
class Tree:
    """What to archive and how its entries are named and owned."""

    root: Path
    parts: tuple[str, ...]  # directories of root, archived in this order under their names
    shown: Callable[[str, str], str]  # (part, path in it) -> the path findings name
    ids: Callable[[int, int], tuple[int, int]]  # host uid, gid -> the ones stored
    dir_headers: Callable[[int], dict[str, str]]  # a directory's fd -> extra PAX headers


@dataclass
class Outcome:
    entries: int = 0
    findings: list[Finding] = field(default_factory=list)  # not allowed, sorted
    redacted: list[str] = field(default_factory=list)  # shown paths stored redacted
    unscanned: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"}
    complete: bool = True  # False: the archive was given up (findings, or hold and rerun)
    hold: set[str] = field(default_factory=set)  # streamed files a rerun must hold


@dataclass(frozen=True)
class _Stored:
    """The first name of a file with more than one: later names link to it."""

    arcname: str
    found: frozenset[tuple[int, str]]  # (line, kind) of every finding, allowed or not
    redacted: frozenset[tuple[int, str]]  # those whose values the stored copy lacks


def archive(
    tree: Tree,
    sink: Sink,
    *,
    allow: AllowList | None = None,
    redact: bool = False,
    budget: int | None = None,
    hold: frozenset[str] = frozenset(),
    hold_bytes: int = HOLD,
) -> Outcome:
    """Write the tar of ``tree`` to ``sink`` while scanning it; see the module's doc.
    ``hold``: files (shown paths) held whatever their size; ``hold_bytes``: the size up
    to which every file is."""
    _reuse_freed_chunks()
    run = _Run(tree, sink, allow or AllowList(), redact, budget, hold, hold_bytes)
    for part in tree.parts:
        run.part(part)
    run.finish()
    return run.outcome


class _Run:
    def __init__(
        self,
        tree: Tree,
        sink: Sink,
        allow: AllowList,
        redact: bool,
        budget: int | None,
        hold: frozenset[str],
        hold_bytes: int,
    ) -> None:
        self.tree = tree
        self.sink: Sink | None = sink  # None once the archive is given up: scan only
        self.allow = allow
        self.redact = redact
        self.budget = secretscan.Budget(budget)
        self.hold = hold
        self.hold_bytes = hold_bytes
        self.outcome = Outcome()
        self.offset = 0
        self.stored: dict[tuple[int, int], _Stored] = {}

    # the tar stream --------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.sink is not None and data:
            self.sink.write(data)
            self.offset += len(data)

    def _add(self, info: tarfile.TarInfo) -> None:
        self._write(info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
        self.outcome.entries += 1

    def _pad(self, size: int) -> None:
        if size % _BLOCK:
            self._write(bytes(_BLOCK - size % _BLOCK))

    def _give_up(self) -> None:
        self.sink = None
        self.outcome.complete = False

    def finish(self) -> None:
        self._write(bytes(2 * _BLOCK))  # tarfile's end of archive, padded to a record
        if self.offset % _RECORD:
            self._write(bytes(_RECORD - self.offset % _RECORD))
        self.outcome.findings.sort()
        self.outcome.redacted.sort()

    def _info(self, st: os.stat_result, arcname: str, kind: bytes) -> tarfile.TarInfo:
        info = tarfile.TarInfo(arcname)
        info.type = kind
        info.mode = st.st_mode
        info.uid, info.gid = self.tree.ids(st.st_uid, st.st_gid)
        info.uname = info.gname = ""
        info.mtime = st.st_mtime
        return info

    # entries ---------------------------------------------------------------------------
    def part(self, part: str) -> None:
        over: list[str] = []
        unreadable: list[str] = []
        root = self.tree.root / part
        for entry in treewalk.walk(root, unreadable, directories=True):
            arcname = f"{part}/{entry.path}" if entry.path else part
            shown = self.tree.shown(part, entry.path)
            if entry.fd is not None:
                info = self._info(os.fstat(entry.fd), arcname, tarfile.DIRTYPE)
                info.pax_headers = self.tree.dir_headers(entry.fd)
                self._add(info)
                continue
            try:
                st = os.stat(entry.name, dir_fd=entry.dir_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    self._regular(entry, st, arcname, shown, over)
                else:
                    self._special(entry, st, arcname)
            except FileNotFoundError:
                continue  # removed meanwhile (not on a frozen view)
        shown_unreadable = [self.tree.shown(part, p) for p in unreadable]
        self.outcome.unscanned += [{"path": p, "reason": "over the scan budget"} for p in over]
        self.outcome.unscanned += [{"path": p, "reason": "unreadable"} for p in shown_unreadable]

    def _special(self, entry: treewalk.Entry, st: os.stat_result, arcname: str) -> None:
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            info = self._info(st, arcname, tarfile.SYMTYPE)
            info.linkname = os.readlink(entry.name, dir_fd=entry.dir_fd)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):  # overlay whiteouts are 0/0 chars
            kind = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
            info = self._info(st, arcname, kind)
            info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
        elif stat.S_ISFIFO(mode):
            info = self._info(st, arcname, tarfile.FIFOTYPE)
        else:
            return  # a socket: nothing to keep
        self._add(info)

    def _regular(
        self,
        entry: treewalk.Entry,
        st: os.stat_result,
        arcname: str,
        shown: str,
        over: list[str],
    ) -> None:
        inode = (st.st_ino, st.st_dev)
        first = self.stored.get(inode) if st.st_nlink > 1 else None
        if first is not None and self._link(entry, st, arcname, shown, first):
            return
        fd = secretscan.open_regular(entry.dir_fd, entry.name)
        if fd is None:
            raise InvalidRequest(f"{shown} changed type during the snapshot; take it again")
        try:
            fst = os.fstat(fd)  # what is read is this open file: its size, its header
            info = self._info(fst, arcname, tarfile.REGTYPE)
            info.size = fst.st_size
            scan = secretscan.FileScan(shown)
            held = fst.st_size <= self.hold_bytes or shown in self.hold
            streamed = self.sink is not None and not held
            if streamed:
                self._add(info)
            pieces: list[bytes] = []
            keep = self.sink is not None
            for piece in secretscan.read_file(fd, fst.st_size, scan, self.budget, archive=keep):
                if streamed:
                    self._write(piece)
                elif keep:
                    pieces.append(piece)
        finally:
            os.close(fd)
        if scan.left_out:
            over.append(shown)
        found = sorted(scan.found)
        refused = [f for f in found if not self.allow.allows(f)]
        self.outcome.findings += refused
        if refused and not self.redact:
            self._give_up()
        elif refused and streamed:
            self.outcome.hold.add(shown)  # its stored bytes hold the values: run again
            self._give_up()
        elif streamed:
            self._pad(info.size)
        elif self.sink is not None:
            if refused:
                pieces = [secretscan.redact_file(b"".join(pieces), refused)]
                info.size = len(pieces[0])
                self.outcome.redacted.append(shown)
            self._add(info)
            for piece in pieces:
                self._write(piece)
            self._pad(info.size)
        if st.st_nlink > 1 and inode not in self.stored and self.sink is not None:
            self.stored[inode] = _Stored(
                arcname,
                frozenset((f.line, f.kind) for f in found),
                frozenset((f.line, f.kind) for f in refused) if self.redact else frozenset(),
            )

    def _link(
        self,
        entry: treewalk.Entry,
        st: os.stat_result,
        arcname: str,
        shown: str,
        first: _Stored,
    ) -> bool:
        """Store a later name of a file as a hard link to its first, when what this name
        must not show is gone from that copy; False: it needs a copy of its own."""
        mine = [Finding(shown, line, kind) for line, kind in sorted(first.found)]
        refused = [f for f in mine if not self.allow.allows(f)]
        if not {(f.line, f.kind) for f in refused} <= first.redacted:
            return False  # an allow-list waived them for the first name, not this one
        self.outcome.findings += refused
        if refused:
            self.outcome.redacted.append(shown)
        info = self._info(st, arcname, tarfile.LNKTYPE)
        info.linkname = first.arcname
        self._add(info)
        return True


__all__ = ["HOLD", "Outcome", "Sink", "Tree", "archive"]
