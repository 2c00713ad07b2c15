"""The audit trail's record format and hash chain: canonical JSON, record and argument
hashes, the file layout and head, and ``verify``, which checks a rotation set end to end.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from agentbox.config.audit_fields import RESERVED
from agentbox.config.host import agentbox_home
from agentbox.errors import InvalidRequest

Record = dict[str, Any]

FORMAT_VERSION = 1
GENESIS = "sha256:" + "0" * 64
MAX_RECORD_BYTES = 1024 * 1024
HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


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


def hashed_line(record: Mapping[str, Any]) -> tuple[str, bytes]:
    """``record_hash(record)`` and ``canonical_json`` of ``record`` with that ``hash``,
    encoding the record once: sorted keys put ``hash`` between the keys before it and the
    keys after it, so the line is the hashed body with ``"hash":...`` spliced in."""
    low = canonical_json({k: v for k, v in record.items() if k < "hash"})[1:-1]
    high = canonical_json({k: v for k, v in record.items() if k > "hash"})[1:-1]
    digest = "sha256:" + hashlib.sha256(_object(low, high)).hexdigest()
    return digest, _object(low, b'"hash":"' + digest.encode() + b'"', high)


def _object(*members: bytes) -> bytes:
    return b"{" + b",".join(m for m in members if m) + b"}"


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


@dataclass(frozen=True)
class Head:
    seq: int
    hash: str


def _stable_read(path: Path) -> bytes:
    """The file's bytes, read until two reads agree: a live log rewrites its head in place
    (AuditLog._write_head), and a read racing that write could see part of each."""
    data = path.read_bytes()
    for _ in range(8):
        again = path.read_bytes()
        if again == data:
            break
        data = again
    return data


def read_head(path: Path) -> Head | None:
    """The head file next to the log ``path``; None when absent. ValueError when corrupt."""
    try:
        data = json.loads(_stable_read(head_path(path)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable: {e}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    seq, digest = data.get("seq"), data.get("hash")
    if type(seq) is not int or seq < 0 or not isinstance(digest, str) or not HASH_RE.match(digest):
        raise ValueError("seq or hash missing or malformed")
    return Head(seq, digest)


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


def check_line(line: bytes, expected_seq: int, prev: str) -> tuple[str | None, Record | None]:
    """One chain line (no newline) after the record whose hash is ``prev``: (what is wrong
    with it or None, the record when it parses). Also run on the copies of a cluster's
    chains (cluster/audit_verify.py)."""
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
    if not isinstance(digest, str) or not HASH_RE.match(digest):
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
                problem, rec = check_line(raw[:-1], expected, prev)
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
