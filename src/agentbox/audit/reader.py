"""Reading the audit trail: records newest first from the end of the files (without
parsing them whole), ``read_records`` with filters, and ``follow``, which tails the log
across rotations. ``AuditLog`` reads its own files through the same functions.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypedDict, Unpack

from agentbox.audit.chain import Record, rotated_files
from agentbox.errors import InvalidRequest

CHUNK = 64 * 1024
_FOLLOW_CHUNK = 4 * 1024 * 1024


# -- reading lines from the end ----------------------------------------------------------


def complete_end(f: IO[bytes], size: int) -> int:
    """Offset just past the last newline before ``size`` (0 when there is none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - CHUNK)
        f.seek(start)
        i = f.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def reverse_lines(f: IO[bytes], end: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of the non-empty lines before ``end`` (a line boundary), last first."""
    pos, carry = end, b""
    while pos > 0:
        start = max(0, pos - CHUNK)
        f.seek(start)
        buf = f.read(pos - start) + carry
        lines = buf.split(b"\n")
        carry = lines[0]
        offset = start + len(buf)
        for line in reversed(lines[1:]):
            offset -= len(line)
            if line:
                yield offset, line
            offset -= 1
        pos = start
    if carry:
        yield 0, carry


def parse_record(line: bytes) -> Record | None:
    """The record on ``line`` if it looks like one (not verified); None otherwise."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or type(rec.get("seq")) is not int:
        return None
    if not isinstance(rec.get("hash"), str):
        return None
    return rec


@dataclass
class Source:
    name: str
    file: IO[bytes]
    end: int


class Filters(TypedDict, total=False):
    """What :meth:`AuditLog.query` and :func:`read_records` select: records above
    ``since_seq``, of ``sandbox``, ``tool`` and ``decision``, the newest ``limit`` of them
    (100 unless given; None: all). Unset: any."""

    since_seq: int | None
    sandbox: str | None
    tool: str | None
    decision: str | None
    limit: int | None


def check_limit(filters: Filters) -> int | None:
    """``filters``' limit, refused below 1 (before any file is opened)."""
    limit = filters.get("limit", 100)
    if limit is not None and limit < 1:
        raise InvalidRequest(f"limit must be at least 1, got {limit}")
    return limit


def scan(sources: Iterable[Source], filters: Filters) -> list[Record]:
    """Newest matching records from ``sources`` (newest file first), returned oldest first."""
    since_seq, limit = filters.get("since_seq"), check_limit(filters)
    sandbox, tool, decision = filters.get("sandbox"), filters.get("tool"), filters.get("decision")
    found: list[Record] = []
    for source in sources:
        for _, line in reverse_lines(source.file, source.end):
            rec = parse_record(line)
            if rec is None:
                continue
            if since_seq is not None and rec["seq"] <= since_seq:
                return found[::-1]
            if (
                (sandbox is None or rec.get("sandbox") == sandbox)
                and (tool is None or rec.get("tool") == tool)
                and (decision is None or rec.get("decision") == decision)
            ):
                found.append(rec)
                if limit is not None and len(found) >= limit:
                    return found[::-1]
    return found[::-1]


def read_records(path: str | os.PathLike[str], **filters: Unpack[Filters]) -> list[Record]:
    """Recent records of the log at ``path`` without opening it for writing (CLI, tools).

    Same filters as :meth:`AuditLog.query`; safe while a writer appends (an unfinished
    last line is skipped; a rotation during the read can only duplicate, which is
    removed by seq).
    """
    check_limit(filters)
    path = Path(path)
    opened: list[Source] = []
    try:
        active_ino = None
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed in the finally below
        except FileNotFoundError:
            pass
        else:
            st = os.fstat(f.fileno())
            active_ino = (st.st_dev, st.st_ino)
            opened.append(Source(path.name, f, complete_end(f, st.st_size)))
        for _, rotated in reversed(rotated_files(path)):
            try:
                f = open(rotated, "rb")  # noqa: SIM115
            except FileNotFoundError:
                continue
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) == active_ino:  # renamed while we looked: seen already
                f.close()
                continue
            opened.append(Source(rotated.name, f, complete_end(f, st.st_size)))
        records = scan(opened, filters)
    finally:
        for source in opened:
            source.file.close()
    unique: dict[int, Record] = {r["seq"]: r for r in records}
    return [unique[s] for s in sorted(unique)]


def _read_new(f: IO[bytes], pos: int, last: int) -> Generator[Record, None, tuple[int, int]]:
    """Yield the complete records after ``pos`` with seq above ``last``; return both updated."""
    while True:
        f.seek(pos)
        chunk = f.read(_FOLLOW_CHUNK)
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            return pos, last
        for line in chunk[:cut].split(b"\n")[:-1]:
            rec = parse_record(line)
            if rec is not None and rec["seq"] > last:
                last = rec["seq"]
                yield rec
        pos += cut


def _open_when_present(path: Path, stop: threading.Event, poll: float) -> IO[bytes] | None:
    while True:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            if stop.wait(poll):
                return None


def follow(
    path: str | os.PathLike[str],
    *,
    since_seq: int | None = None,
    poll_interval: float = 0.25,
    stop: threading.Event | None = None,
) -> Iterator[Record]:
    """Yield records as they are appended to the log at ``path`` (``tail -f``), across rotations.

    With ``since_seq``, first the records after it; without, only records appended from
    now on. Polls every ``poll_interval`` **seconds**; ends when ``stop`` is set.
    """
    path = Path(path)
    stop = stop or threading.Event()
    f = _open_when_present(path, stop, poll_interval)
    if f is None:
        return
    try:
        pos = complete_end(f, os.fstat(f.fileno()).st_size)
        if since_seq is None:
            newest = read_records(path, limit=1)
            last = newest[-1]["seq"] if newest else 0
        else:
            last = since_seq
        while True:
            # Records in files we have not opened: the catch-up at start, and files that
            # were rotated away faster than we polled. Our file was opened first, so
            # anything newer than what this finds is in it; seq filters the overlap.
            for rec in read_records(path, since_seq=last, limit=None):
                last = rec["seq"]
                yield rec
            while True:
                pos, last = yield from _read_new(f, pos, last)
                try:
                    current, mine = os.stat(path), os.fstat(f.fileno())
                    rotated = (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino)
                except FileNotFoundError:
                    rotated = True
                if rotated:
                    break
                if stop.wait(poll_interval):
                    return
            # The writer fsyncs a full file before renaming it: drain ours, then move on.
            pos, last = yield from _read_new(f, pos, last)
            f.close()
            reopened = _open_when_present(path, stop, poll_interval)
            if reopened is None:
                return
            f, pos = reopened, 0
    finally:
        f.close()
