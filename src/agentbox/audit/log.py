# Whole on purpose: writer, reader and verify share the record format, chain and file layout
"""The gateway's tamper-evident audit trail: append-only JSONL with a hash chain.

Record format
    One JSON object per line, written in canonical form (keys sorted, no whitespace,
    UTF-8)::

        {"actor":"op","args_hash":"sha256:…","bytes_out":120,"decision":"allowed",
         "duration_ms":12.5,"error":null,"exit_code":0,"hash":"sha256:…",
         "prev":"sha256:…","sandbox":"sb-1","seq":7,"session":"s-1","tool":"terminal.run",
         "ts":"2025-01-31T12:00:00.123456Z","v":1}

    ``ts`` is RFC 3339 UTC with microseconds; ``seq`` counts from 1 and never restarts,
    across rotated files; ``decision`` is one of :class:`Decision` (or another
    ``snake_case`` word). Tool arguments appear only as ``args_hash`` (see
    :func:`args_hash`); the caller's ``extra`` fields are merged at top level but can
    never replace the reserved keys above. The ``redact`` hook runs over every string
    the caller supplies (actor, session, sandbox, tool, error and strings inside extra);
    not over the hashes and timestamps the log generates itself, which a secret scanner
    could mistake for keys.

The chain
    ``prev`` is the ``hash`` of the previous record (``GENESIS``, 64 zeros, for seq 1);
    ``hash`` = ``"sha256:" + sha256(canonical JSON of the record without "hash")``. After
    each fsync, ``audit.head`` is replaced atomically (temp file + rename) with the seq
    and hash of the last durable record, so removing records from the end is visible.

Files
    ``audit.jsonl`` is the file being written. Past ``rotate_bytes`` it is renamed to
    ``audit.jsonl.<N>`` where N = 1, 2, 3, … — **higher N is newer**, so rotation is one
    rename and old names never change. The chain runs on across files. Next to them:
    ``audit.head``, ``audit.lock`` (one writer at a time), ``audit.jsonl.torn-<ts>``
    (an interrupted last line set aside at open, never dropped) and ``audit.spool/``
    (the remote sink's outbox, see :mod:`agentbox.audit.sink`). At open the
    chain resumes from the last line of the newest file, read from the end (the file is
    not parsed whole).

What :func:`verify` proves
    That the rotation set is complete and contiguous from seq 1; that every record is
    exactly as written (hash and canonical form); that none was removed, reordered or
    inserted (seq and ``prev``); and that nothing was cut from the end since the head
    was last written. It reports torn tails set aside after a crash.

What it does NOT prove
    The files live on the host: an attacker who can rewrite them *all* — recomputing
    every hash and the head — produces a consistent chain that verifies. The defence is
    external anchoring: the remote sink ships every record (with seq, prev and hash) to
    a log service the host cannot rewrite, so the two copies can be compared. Nor does
    verify prove that a record tells the truth, that records were not withheld before
    being written, or that the clock was right. ``args_hash`` is a plain sha256: it hides
    arguments from a reader, not from someone who can guess a low-entropy value.

Durability: ``fsync="always"`` fsyncs the file and writes the head before ``append``
returns (group commit: appenders that arrive during an fsync share the next one);
``"batch"`` lets a background flusher fsync at most ``batch_interval`` seconds or
``batch_records`` records after a write, and on close.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from agentbox.audit.sink import RemoteSink
from agentbox.config.audit_fields import RESERVED
from agentbox.config.host import agentbox_home
from agentbox.errors import Conflict, InvalidConfig, InvalidRequest
from agentbox.fsutil import fsync_dir

if TYPE_CHECKING:
    from agentbox.config.settings import AuditSettings

log = logging.getLogger(__name__)

Record = dict[str, Any]
FsyncPolicy = Literal["always", "batch"]

FORMAT_VERSION = 1
GENESIS = "sha256:" + "0" * 64
MAX_RECORD_BYTES = 1024 * 1024
_CHUNK = 64 * 1024
_FOLLOW_CHUNK = 4 * 1024 * 1024
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")
_DECISION = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class Decision(StrEnum):
    """The decisions the gateway records. Other ``snake_case`` words are accepted too."""

    ALLOWED = "allowed"
    DENIED = "denied"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_DENIED = "approval_denied"
    TOKEN_ISSUED = "token_issued"  # noqa: S105 - a decision, not a secret
    TOKEN_REVOKED = "token_revoked"  # noqa: S105
    SANDBOX_CREATED = "sandbox_created"
    SANDBOX_DESTROYED = "sandbox_destroyed"
    EGRESS_ALLOWED = "egress_allowed"
    EGRESS_DENIED = "egress_denied"


# -- hashing --------------------------------------------------------------------------------


# One encoder for every record: json.dumps with options builds a new one per call.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: object) -> bytes:
    """Sorted keys, no whitespace, UTF-8, no NaN: the bytes every hash here is taken over."""
    return _CANONICAL.encode(value).encode("utf-8")


def record_hash(record: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``record`` without its ``hash`` key."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def args_hash(args: object) -> str:
    """``sha256:<hex>`` over the canonical JSON of a tool call's arguments.

    Key order does not matter. Arguments must be JSON values (as tool calls are).
    """
    try:
        text = _CANONICAL.encode(args)
    except (TypeError, ValueError) as e:
        raise InvalidRequest(f"tool arguments must be JSON values to be audited: {e}") from None
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def rfc3339(moment: datetime) -> str:
    """``2025-01-31T12:00:00.123456Z``: UTC, always with microseconds."""
    # isoformat is ~10x faster than strftime, and this runs once per record.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


# -- file layout ----------------------------------------------------------------------------


def default_audit_path() -> Path:
    """``$AGENTBOX_AUDIT_PATH``, else ``$AGENTBOX_HOME/audit/audit.jsonl``."""
    configured = os.environ.get("AGENTBOX_AUDIT_PATH")
    return Path(configured) if configured else agentbox_home() / "audit" / "audit.jsonl"


def head_path(path: Path) -> Path:
    return path.with_suffix(".head")


def spool_path(path: Path) -> Path:
    return path.with_suffix(".spool")


def rotated_files(path: Path) -> list[tuple[int, Path]]:
    """``(N, path)`` of each ``<name>.<N>``, oldest (lowest N) first."""
    pattern = re.compile(re.escape(path.name) + r"\.([1-9][0-9]*)$")
    found = []
    for candidate in path.parent.glob(path.name + ".*"):
        m = pattern.match(candidate.name)
        if m:
            found.append((int(m.group(1)), candidate))
    return sorted(found)


def torn_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".torn-*"))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass(frozen=True)
class Head:
    seq: int
    hash: str


def read_head(path: Path) -> Head | None:
    """The head file next to the log ``path``; None when absent. ValueError when corrupt."""
    try:
        data = json.loads(head_path(path).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable: {e}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    seq, digest = data.get("seq"), data.get("hash")
    if type(seq) is not int or seq < 0 or not isinstance(digest, str) or not _HASH.match(digest):
        raise ValueError("seq or hash missing or malformed")
    return Head(seq, digest)


# -- reading lines from the end ----------------------------------------------------------


def _complete_end(f: IO[bytes], size: int) -> int:
    """Offset just past the last newline before ``size`` (0 when there is none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - _CHUNK)
        f.seek(start)
        i = f.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def _reverse_lines(f: IO[bytes], end: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of the non-empty lines before ``end`` (a line boundary), last first."""
    pos, carry = end, b""
    while pos > 0:
        start = max(0, pos - _CHUNK)
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


def _parse_record(line: bytes) -> Record | None:
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
class _Source:
    name: str
    file: IO[bytes]
    end: int


def _scan(
    sources: Iterable[_Source],
    *,
    since_seq: int | None,
    sandbox: str | None,
    tool: str | None,
    decision: str | None,
    limit: int | None,
) -> list[Record]:
    """Newest matching records from ``sources`` (newest file first), returned oldest first."""
    found: list[Record] = []
    for source in sources:
        for _, line in _reverse_lines(source.file, source.end):
            rec = _parse_record(line)
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


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise InvalidRequest(f"limit must be at least 1, got {limit}")


def read_records(
    path: str | os.PathLike[str],
    *,
    since_seq: int | None = None,
    sandbox: str | None = None,
    tool: str | None = None,
    decision: str | None = None,
    limit: int | None = 100,
) -> list[Record]:
    """Recent records of the log at ``path`` without opening it for writing (CLI, tools).

    Same filters as :meth:`AuditLog.query`; safe while a writer appends (an unfinished
    last line is skipped; a rotation during the read can only duplicate, which is
    removed by seq).
    """
    _check_limit(limit)
    path = Path(path)
    opened: list[_Source] = []
    try:
        active_ino = None
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed in the finally below
        except FileNotFoundError:
            pass
        else:
            st = os.fstat(f.fileno())
            active_ino = (st.st_dev, st.st_ino)
            opened.append(_Source(path.name, f, _complete_end(f, st.st_size)))
        for _, rotated in reversed(rotated_files(path)):
            try:
                f = open(rotated, "rb")  # noqa: SIM115
            except FileNotFoundError:
                continue
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) == active_ino:  # renamed while we looked: seen already
                f.close()
                continue
            opened.append(_Source(rotated.name, f, _complete_end(f, st.st_size)))
        records = _scan(
            opened, since_seq=since_seq, sandbox=sandbox, tool=tool, decision=decision, limit=limit
        )
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
            rec = _parse_record(line)
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
        pos = _complete_end(f, os.fstat(f.fileno()).st_size)
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


# -- verification ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify`. ``first_bad`` is a seq: the one on the offending line, or
    the first missing one when there is no line to point at. ``line`` is 1-based."""

    ok: bool
    records: int
    first_bad: int | None
    file: str | None
    line: int | None
    reason: str
    torn: tuple[str, ...] = ()


def _check_line(line: bytes, expected_seq: int, prev: str) -> tuple[str | None, Record | None]:
    if not line:
        return "empty line", None
    try:
        rec = json.loads(line)
    except ValueError:
        return "not valid JSON", None
    if not isinstance(rec, dict):
        return "not a JSON object", None
    seq, digest = rec.get("seq"), rec.get("hash")
    if type(seq) is not int:
        return "seq is missing or not an integer", None
    if not isinstance(digest, str) or not _HASH.match(digest):
        return "hash is missing or malformed", rec
    try:
        actual = record_hash(rec)
        canonical = canonical_json(rec)
    except ValueError:
        return "holds a value canonical JSON cannot encode (NaN?): the line was rewritten", rec
    if actual != digest:
        return "hash mismatch: the record was altered after it was written", rec
    if line != canonical:
        return "not in canonical form (spacing, key order or duplicate keys): rewritten", rec
    missing = sorted(RESERVED - rec.keys())
    if missing:
        return f"missing fields {', '.join(missing)}: not written by agentbox", rec
    if seq > expected_seq:
        gap = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}..{seq - 1}"
        return f"seq jumps from {expected_seq - 1} to {seq}: record(s) {gap} are missing", rec
    if seq < expected_seq:
        return f"seq {seq} follows seq {expected_seq - 1}: records were reordered or inserted", rec
    if rec["prev"] != prev:
        before = f"record {expected_seq - 1}" if expected_seq > 1 else "the genesis value"
        return f"prev does not match the hash of {before}: the chain is broken here", rec
    return None, rec


def check_line(line: bytes, expected_seq: int, prev: str) -> tuple[str | None, Record | None]:
    """One chain line (no newline) after the record whose hash is ``prev``: (what is
    wrong with it or None, the record when it parses). Also used on the copies of a
    cluster's chains (cluster/audit_verify.py)."""
    return _check_line(line, expected_seq, prev)


def verify(path: str | os.PathLike[str]) -> VerifyResult:
    """Check the whole rotation set of the log at ``path`` and its head, oldest first.

    Reads line by line (constant memory). The head is read *before* the files so a writer
    appending meanwhile cannot cause a false alarm; a rotation during verify can (rerun).
    """
    path = Path(path)
    torn = tuple(p.name for p in torn_files(path))

    def bad(first: int | None, file: str | None, line: int | None, why: str) -> VerifyResult:
        return VerifyResult(False, count, first, file, line, why, torn)

    count = 0
    try:
        head = read_head(path)
    except ValueError as e:
        return bad(None, head_path(path).name, None, f"head file {e}")
    rotated = rotated_files(path)
    if head is None and not rotated and not path.exists():
        return bad(None, None, None, f"no audit log at {path}")

    expected, prev = 1, GENESIS
    unfinished = False
    files: list[tuple[int | None, Path]] = [*rotated, (None, path)]
    next_number = 1
    for number, file in files:
        if number is not None:
            if number != next_number:
                missing = f"{path.name}.{next_number}"
                why = f"rotated file {missing} is missing: records from seq {expected} are gone"
                return bad(expected, missing, None, why)
            next_number += 1
        try:
            f = open(file, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            if number is None:  # the writer had just rotated: no active file yet
                continue
            return bad(expected, file.name, None, "file vanished during verify: rerun")
        with f:
            for lineno, raw in enumerate(f, 1):
                if not raw.endswith(b"\n"):
                    if number is None:
                        unfinished = True  # an interrupted append; never covered by the head
                        break
                    return bad(expected, file.name, lineno, "unterminated line in a rotated file")
                problem, rec = _check_line(raw[:-1], expected, prev)
                if problem:
                    seq = rec["seq"] if rec is not None else expected
                    return bad(seq, file.name, lineno, problem)
                assert rec is not None
                if head is not None and rec["seq"] == head.seq and rec["hash"] != head.hash:
                    why = "differs from the head file's hash: the log was rewritten from here"
                    return bad(rec["seq"], file.name, lineno, why)
                expected, prev = expected + 1, rec["hash"]
                count += 1
    last = expected - 1
    if head is None:
        if count:
            why = "the head file is missing: removal of records from the end cannot be ruled out"
            return bad(None, head_path(path).name, None, why)
    elif head.seq > last:
        why = (
            f"the log ends at seq {last} but the head file records seq {head.seq}: "
            f"records {last + 1}..{head.seq} were removed from the end"
        )
        return bad(last + 1, path.name, None, why)
    elif head.seq == 0 and head.hash != GENESIS:
        return bad(None, head_path(path).name, None, "head file has seq 0 but no genesis hash")
    notes = []
    if head is not None and head.seq < last:
        notes.append(
            f"{last - head.seq} record(s) newer than the head (not fsynced yet in batch mode, "
            "or written just before a crash)"
        )
    if unfinished:
        notes.append(f"an unfinished last line in {path.name} (set aside when the log reopens)")
    if torn:
        notes.append(f"torn lines set aside in {', '.join(torn)}")
    return VerifyResult(True, count, None, None, None, "; ".join(["ok", *notes]), torn)


# -- the writer -----------------------------------------------------------------------------


def _clean(value: object, redact: Callable[[str], str] | None, where: str) -> object:
    """A JSON value with every string redacted and made encodable; refuses anything else."""
    if isinstance(value, str):
        if redact is not None:
            value = redact(value)
            if not isinstance(value, str):
                raise InvalidRequest(f"the redact hook returned {type(value).__name__} for {where}")
        return value.encode("utf-8", "replace").decode("utf-8")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest(f"{where} must be a finite number, got {value}")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidRequest(f"{where} has a non-string key {k!r}")
            out[k] = _clean(v, redact, f"{where}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [_clean(v, redact, f"{where}[{i}]") for i, v in enumerate(value)]
    raise InvalidRequest(f"{where} must be a JSON value, not {type(value).__name__}")


class AuditLog:
    """The one writer of an audit log. Thread-safe; see the module docstring for the format.

    ``rotate_bytes`` is a size in **bytes** (None: never rotate); ``batch_interval`` is in
    **seconds**. Only one AuditLog (in any process) may hold a log: ``audit.lock`` is locked.
    Raises :class:`Conflict` at open when the files disagree with the head (records were
    removed) — appending would hide that; run ``agentbox audit verify``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "always",
        rotate_bytes: int | None = 64 * 1024 * 1024,
        batch_interval: float = 0.1,
        batch_records: int = 256,
        redact: Callable[[str], str] | None = None,
        sink: RemoteSink | None = None,
        sink_close_timeout: float = 5.0,
    ) -> None:
        if fsync not in ("always", "batch"):
            raise InvalidConfig(f"audit fsync must be 'always' or 'batch', got {fsync!r}")
        if rotate_bytes is not None and rotate_bytes < 1:
            raise InvalidConfig(f"audit rotate_bytes must be positive, got {rotate_bytes}")
        if batch_interval <= 0 or batch_records < 1:
            raise InvalidConfig("audit batch_interval and batch_records must be positive")
        self.path = Path(path)
        self.fsync: FsyncPolicy = fsync
        self.rotate_bytes = rotate_bytes
        self.sink = sink
        self._batch_interval = batch_interval
        self._batch_records = batch_records
        self._redact = redact
        self._sink_close_timeout = sink_close_timeout
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._subscribers: list[Callable[[Record], None]] = []
        self._unsynced = 0
        self._first_unsynced_at = 0.0
        self._sync_lock = threading.Lock()  # fsync=always: one group commit at a time
        self._synced_seq = 0
        self._durable_seq = 0
        self._not_durable: list[Record] = []  # written, not yet fsynced (fsync=always)
        self._flusher: threading.Thread | None = None

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._lock_fd = self._take_lock()
        try:
            self._fd = os.open(
                self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            self._seq, self._hash = self._resume()
            self._synced_seq = self._seq
            self._size = os.fstat(self._fd).st_size
            self._rotations = max((n for n, _ in rotated_files(self.path)), default=0)
            os.fsync(self._fd)
            self._write_head(self._seq, self._hash)
            fsync_dir(self.path.parent)  # the log's and the head's names are durable
            if sink is not None:
                sink.start(self._seq, self._records_after)
        except BaseException:
            if hasattr(self, "_fd"):
                os.close(self._fd)
            os.close(self._lock_fd)
            raise
        if fsync == "batch":
            self._flusher = threading.Thread(target=self._flush_loop, name="audit-fsync")
            self._flusher.daemon = True
            self._flusher.start()

    @classmethod
    def from_settings(
        cls,
        settings: AuditSettings,
        *,
        redact: Callable[[str], str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> AuditLog:
        """Build from the ``audit:`` section. The local file is always written: the chain
        lives there; ``remote_log_service`` in ``sink`` adds the remote copy."""
        sink = None
        path = settings.path or default_audit_path()
        if "remote_log_service" in settings.sink:
            if settings.remote is None:
                raise InvalidConfig(
                    "audit.sink includes remote_log_service but audit.remote is not set: "
                    "add remote: {url: ..., token_env: ...}"
                )
            sink = RemoteSink.from_settings(
                settings.remote, spool_path(path), environ, fields=settings.fields
            )
        return cls(
            path,
            fsync=settings.fsync,
            rotate_bytes=settings.rotate_bytes,
            redact=redact,
            sink=sink,
        )

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- appending --------------------------------------------------------------------------

    def append(
        self,
        *,
        decision: str,
        actor: str | None = None,
        session: str | None = None,
        sandbox: str | None = None,
        tool: str | None = None,
        args: object = None,
        args_hash: str | None = None,
        exit_code: int | None = None,
        duration_ms: float | None = None,
        bytes_out: int | None = None,
        error: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Record:
        """Write one record and return it as written. Give ``args`` (hashed here, never
        stored) or a precomputed ``args_hash``; ``duration_ms`` is in **milliseconds**.

        Durable on return with ``fsync="always"``. Raises InvalidRequest for a bad field,
        Conflict after close, OSError when the disk refuses (the record is then not in the
        log and the file stays well-formed).
        """
        fields = self._fields(
            decision=decision,
            caller={"actor": actor, "session": session, "sandbox": sandbox, "tool": tool},
            error=error,
            args=args,
            digest=args_hash,
            exit_code=exit_code,
            duration_ms=duration_ms,
            bytes_out=bytes_out,
            extra=extra,
        )
        with self._lock:
            if self._closed:
                raise Conflict("the audit log is closed; open a new AuditLog to append")
            record: Record = {
                **fields,
                "v": FORMAT_VERSION,
                "seq": self._seq + 1,
                "ts": rfc3339(datetime.now(UTC)),
                "prev": self._hash,
            }
            record["hash"] = record_hash(record)
            line = canonical_json(record) + b"\n"
            if len(line) > MAX_RECORD_BYTES:
                raise InvalidRequest(
                    f"audit record of {len(line)} bytes exceeds {MAX_RECORD_BYTES}: "
                    "put less into extra"
                )
            if self.rotate_bytes and self._size and self._size + len(line) > self.rotate_bytes:
                self._rotate()
            try:
                _write_all(self._fd, line)
            except OSError:
                os.ftruncate(self._fd, self._size)  # leave no torn line behind
                raise
            self._seq, self._hash = record["seq"], record["hash"]
            self._size += len(line)
            if self.fsync == "always":
                self._not_durable.append(record)
            else:
                if not self._unsynced:
                    self._first_unsynced_at = time.monotonic()
                    self._cond.notify_all()
                self._unsynced += 1
                if self._unsynced >= self._batch_records:
                    self._cond.notify_all()
                if self.sink is not None:
                    self.sink.submit(record)
            for callback in self._subscribers:
                try:
                    callback(record)
                except Exception:  # a broken listener must not break auditing
                    log.exception("audit subscriber %r failed", callback)
        if self.fsync == "always":
            self._sync_through(record["seq"])
        return record

    def _sync_through(self, seq: int) -> None:
        """Group commit: one fsync (and head write) covers every record written before it,
        so concurrent appenders share it instead of queueing one fsync each. Records go
        to the remote sink only once durable here, in seq order."""
        with self._sync_lock:
            if self._synced_seq >= seq:
                return  # another appender's fsync covered this record
            with self._lock:
                fd = os.dup(self._fd)  # survives a rotation closing self._fd meanwhile
                target, digest = self._seq, self._hash
                durable = list(self._not_durable)
                self._not_durable.clear()
            try:
                os.fsync(fd)
                self._write_head(target, digest)
            except BaseException:
                with self._lock:
                    self._not_durable[:0] = durable  # the next fsync retries them
                raise
            finally:
                os.close(fd)
            self._synced_seq = target
            if self.sink is not None:
                for record in durable:
                    self.sink.submit(record)

    async def append_async(self, **fields: Any) -> Record:
        """:meth:`append` from asyncio code, in a worker thread (it may fsync)."""
        return await asyncio.to_thread(lambda: self.append(**fields))

    def _fields(
        self,
        *,
        decision: str,
        caller: dict[str, str | None],
        error: str | None,
        args: object,
        digest: str | None,
        exit_code: int | None,
        duration_ms: float | None,
        bytes_out: int | None,
        extra: Mapping[str, Any] | None,
    ) -> Record:
        if not isinstance(decision, str) or not _DECISION.match(decision):
            raise InvalidRequest(f"decision must be a snake_case word, got {decision!r}")
        if args is not None and digest is not None:
            raise InvalidRequest("give args or args_hash, not both")
        if digest is not None and not (isinstance(digest, str) and _HASH.match(digest)):
            raise InvalidRequest("args_hash must look like sha256:<64 hex digits>")
        for name, value in (("exit_code", exit_code), ("bytes_out", bytes_out)):
            if value is not None and type(value) is not int:
                raise InvalidRequest(f"{name} must be an integer, got {value!r}")
        if bytes_out is not None and bytes_out < 0:
            raise InvalidRequest(f"bytes_out must not be negative, got {bytes_out}")
        if duration_ms is not None and (
            isinstance(duration_ms, bool) or not isinstance(duration_ms, int | float)
        ):
            raise InvalidRequest(f"duration_ms must be a number, got {duration_ms!r}")
        out: Record = {}
        if extra:
            clash = sorted(RESERVED & extra.keys())
            if clash:
                raise InvalidRequest(
                    f"extra fields may not replace reserved audit keys: {', '.join(clash)}"
                )
            cleaned = _clean(extra, self._redact, "extra")
            assert isinstance(cleaned, dict)
            out.update(cleaned)
        for name, text in [*caller.items(), ("error", error)]:
            if text is not None and not isinstance(text, str):
                raise InvalidRequest(f"{name} must be a string, got {type(text).__name__}")
            out[name] = _clean(text, self._redact, name)
        out["decision"] = str(decision)  # a Decision member is stored as its plain value
        out["args_hash"] = args_hash(args) if args is not None else digest
        out["exit_code"] = exit_code
        out["duration_ms"] = _clean(duration_ms, None, "duration_ms")
        out["bytes_out"] = bytes_out
        return out

    # -- reading ----------------------------------------------------------------------------

    def query(
        self,
        *,
        since_seq: int | None = None,
        sandbox: str | None = None,
        tool: str | None = None,
        decision: str | None = None,
        limit: int | None = 100,
    ) -> list[Record]:
        """The newest ``limit`` records with seq above ``since_seq`` matching the filters,
        oldest first. Reads files from the end, newest first, and stops early."""
        _check_limit(limit)
        sources = self._snapshot()
        try:
            return _scan(
                sources,
                since_seq=since_seq,
                sandbox=sandbox,
                tool=tool,
                decision=decision,
                limit=limit,
            )
        finally:
            for source in sources:
                source.file.close()

    def follow(
        self, *, since_seq: int | None = None, stop: threading.Event | None = None
    ) -> Iterator[Record]:
        """See the module-level :func:`follow`."""
        return follow(self.path, since_seq=since_seq, stop=stop)

    def subscribe(self, callback: Callable[[Record], None]) -> Callable[[], None]:
        """Call ``callback(record)`` after each append, in seq order, under the log's lock
        (so it must be quick: hand the record to a queue). Returns the unsubscribe function."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    def _snapshot(self) -> list[_Source]:
        """Open every file under the lock (so no rotation interleaves), newest first."""
        sources: list[_Source] = []
        with self._lock:
            try:
                sources.append(_Source(self.path.name, open(self.path, "rb"), self._size))  # noqa: SIM115
                for _, rotated in reversed(rotated_files(self.path)):
                    f = open(rotated, "rb")  # noqa: SIM115
                    sources.append(_Source(rotated.name, f, os.fstat(f.fileno()).st_size))
            except BaseException:
                for source in sources:
                    source.file.close()
                raise
        return sources

    def records_after(self, seq: int) -> list[Record]:
        """Every record with a seq above ``seq``, oldest first (read from the files)."""
        return self._records_after(seq)

    def _records_after(self, seq: int) -> list[Record]:
        sources = self._snapshot()
        try:
            return _scan(sources, since_seq=seq, sandbox=None, tool=None, decision=None, limit=None)
        finally:
            for source in sources:
                source.file.close()

    # -- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Fsync, write the head, release the lock; then give the remote sink up to
        ``sink_close_timeout`` seconds to catch up (what it cannot ship stays spooled)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        with self._sync_lock, self._lock:
            try:
                os.fsync(self._fd)
                self._write_head(self._seq, self._hash)
                self._synced_seq = self._seq  # late group commits find nothing to do
            finally:
                os.close(self._fd)
                os.close(self._lock_fd)
            if self.sink is not None:
                for record in self._not_durable:  # an appender's fsync had failed
                    self.sink.submit(record)
                self._not_durable.clear()
        if self.sink is not None:
            self.sink.close(self._sink_close_timeout)

    # -- internals --------------------------------------------------------------------------

    def _take_lock(self) -> int:
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Conflict(
                f"the audit log {self.path} is already open in another AuditLog or process: "
                "only one writer may extend the chain"
            ) from None
        return fd

    def _resume(self) -> tuple[int, str]:
        """Set aside a torn tail, then return the seq and hash to continue the chain from."""
        with open(self._fd, "rb", closefd=False) as f:
            size = os.fstat(self._fd).st_size
            end = _complete_end(f, size)
            cut, last = end, None
            lines = _reverse_lines(f, end)
            newest = next(lines, None)
            if newest is not None:
                last = _parse_record(newest[1])
                if last is None:  # a complete line of garbage: a crash can leave that too
                    cut = newest[0]
                    previous = next(lines, None)
                    last = _parse_record(previous[1]) if previous else None
                    if previous is not None and last is None:
                        raise Conflict(self._corrupt(self.path.name))
            if cut < size:
                f.seek(cut)
                self._set_aside(f.read(size - cut))
                os.ftruncate(self._fd, cut)
        if last is None:
            rotated = rotated_files(self.path)
            if rotated:
                name = rotated[-1][1]
                with open(name, "rb") as f:
                    end = _complete_end(f, os.fstat(f.fileno()).st_size)
                    newest = next(_reverse_lines(f, end), None)
                    last = _parse_record(newest[1]) if newest else None
                if last is None:
                    raise Conflict(self._corrupt(name.name))
        seq, digest = (last["seq"], last["hash"]) if last else (0, GENESIS)
        try:
            head = read_head(self.path)
        except ValueError as e:
            raise Conflict(f"the audit head file {head_path(self.path)} is {e}") from None
        if head is None and seq > 0:
            raise Conflict(
                f"the audit log {self.path} has records but its head file is missing, so "
                "records may have been removed from the end. Run `agentbox audit verify`, "
                "keep the files as evidence and move them aside to start a new chain"
            )
        if head is not None and (head.seq > seq or (head.seq == seq and head.hash != digest)):
            raise Conflict(
                f"the audit log {self.path} ends at seq {seq} but its head records seq "
                f"{head.seq} ({head.hash}): records were removed or rewritten. Appending "
                "would hide this. Run `agentbox audit verify`, keep the files as evidence "
                "and move them aside to start a new chain"
            )
        return seq, digest

    def _corrupt(self, name: str) -> str:
        return (
            f"the audit log's last record in {name} is unreadable: run `agentbox audit verify "
            f"{self.path}`, keep the files as evidence and move them aside to start a new chain"
        )

    def _set_aside(self, torn: bytes) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.path.name}.torn-{stamp}")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, torn)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.path.parent)  # the copy is durable before the original is cut
        log.warning(
            "audit: set aside %d torn bytes at the end of %s in %s", len(torn), self.path, target
        )

    def _rotate(self) -> None:
        """Called with the lock held: close the full file under its final name, start anew."""
        os.fsync(self._fd)
        os.close(self._fd)
        self._rotations += 1
        os.rename(self.path, self.path.with_name(f"{self.path.name}.{self._rotations}"))
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fsync_dir(self.path.parent)
        self._size = 0

    def _write_head(self, seq: int, digest: str) -> None:
        """Replace the head atomically. Callers serialize (lock, or the single flusher)."""
        head = head_path(self.path)
        tmp = head.with_name(head.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(
                fd, canonical_json({"v": FORMAT_VERSION, "seq": seq, "hash": digest}) + b"\n"
            )
            os.fsync(fd)
        finally:
            os.close(fd)
        # No directory fsync: if the rename is lost in a crash the older head remains, which
        # verify accepts (records after the head), so durability of the log is what matters.
        os.replace(tmp, head)
        self._durable_seq = seq

    @property
    def durable_seq(self) -> int:
        """The last seq fsynced with its head: a copy shipped elsewhere (cluster mode)
        stops here, so a crash never leaves the copy ahead of the file it resumes from."""
        return self._durable_seq

    def _flush_loop(self) -> None:
        """Batch mode: fsync and write the head when enough time or records have piled up."""
        while True:
            with self._cond:
                while not self._closed and not self._unsynced:
                    self._cond.wait()
                while not self._closed and self._unsynced < self._batch_records:
                    left = self._first_unsynced_at + self._batch_interval - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._closed:
                    return  # close() does the final fsync
                fd = os.dup(self._fd)  # survives a rotation closing self._fd meanwhile
                seq, digest = self._seq, self._hash
                self._unsynced = 0
            try:
                os.fsync(fd)
                self._write_head(seq, digest)
            except OSError:
                log.exception("audit: batch fsync of %s failed", self.path)
            finally:
                os.close(fd)
