"""The gateway's tamper-evident audit trail: append-only JSONL with a hash chain.

The record format, the chain and what ``verify`` proves: :mod:`agentbox.audit.chain`;
reading and following: :mod:`agentbox.audit.reader`.

Files
    ``audit.jsonl`` is the file being written. Past ``rotate_bytes`` it is renamed to
    ``audit.jsonl.<N>`` where N = 1, 2, 3, … — **higher N is newer**, so rotation is one
    rename and old names never change. The chain runs on across files. Next to them:
    ``audit.head``, ``audit.lock`` (one writer at a time), ``audit.jsonl.torn-<ts>``
    (an interrupted last line set aside at open, never dropped) and ``audit.spool/``
    (the remote sink's outbox, see :mod:`agentbox.audit.sink`). At open the
    chain resumes from the last line of the newest file, read from the end (the file is
    not parsed whole).

Durability: ``fsync="always"`` fsyncs the file and writes the head before ``append``
returns (group commit: appenders that arrive during an fsync share the next one);
``"batch"`` lets a background flusher fsync at most ``batch_interval`` seconds or
``batch_records`` records after a write, and on close.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack

from agentbox.audit.chain import (
    FORMAT_VERSION,
    GENESIS,
    HASH_RE,
    MAX_RECORD_BYTES,
    Decision,
    Head,
    Record,
    VerifyResult,
    args_hash,
    canonical_json,
    default_audit_path,
    hashed_line,
    head_path,
    read_head,
    record_hash,
    rfc3339,
    rotated_files,
    spool_path,
    torn_files,
    verify,
)
from agentbox.audit.reader import (
    Filters,
    Source,
    check_limit,
    complete_end,
    follow,
    parse_record,
    read_records,
    reverse_lines,
    scan,
)
from agentbox.audit.sink import RemoteSink
from agentbox.config.audit_fields import RESERVED
from agentbox.errors import Conflict, InvalidConfig, InvalidRequest
from agentbox.fsutil import fsync_dir

if TYPE_CHECKING:
    from agentbox.config.settings import AuditSettings

log = logging.getLogger(__name__)

# What ``from agentbox.audit.log import …`` has always offered: the trail's public names.
__all__ = [
    "FORMAT_VERSION",
    "GENESIS",
    "MAX_RECORD_BYTES",
    "AuditLog",
    "Decision",
    "Head",
    "Record",
    "VerifyResult",
    "args_hash",
    "canonical_json",
    "default_audit_path",
    "follow",
    "head_path",
    "read_head",
    "read_records",
    "record_hash",
    "rfc3339",
    "rotated_files",
    "spool_path",
    "torn_files",
    "verify",
]

FsyncPolicy = Literal["always", "batch"]

_DECISION = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# The head is one block of this size, rewritten in place: a write within one 512-byte
# sector lands whole or not at all in a crash (what PostgreSQL's pg_control relies on),
# and an overwrite that keeps the file's size needs no journal commit, only the data
# block and a flush (fdatasync): ~0.2 ms, where a new file renamed over it took 0.6-1.4 ms
# (a journal commit shared with whatever else the host was writing). Once per append.
HEAD_BYTES = 256


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
        self._head_fd = -1  # the head file, rewritten in place once written whole

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
                sink.start(self._seq, self.records_after)
        except BaseException:
            if hasattr(self, "_fd"):
                os.close(self._fd)
            if self._head_fd >= 0:
                os.close(self._head_fd)
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
            record["hash"], line = hashed_line(record)
            line += b"\n"
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
        if digest is not None and not (isinstance(digest, str) and HASH_RE.match(digest)):
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

    def query(self, **filters: Unpack[Filters]) -> list[Record]:
        """The newest ``limit`` records with seq above ``since_seq`` matching the filters
        (:class:`Filters`), oldest first. Reads files from the end, newest first, and
        stops early."""
        check_limit(filters)
        sources = self._snapshot()
        try:
            return scan(sources, filters)
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

    def _snapshot(self) -> list[Source]:
        """Open every file under the lock (so no rotation interleaves), newest first."""
        sources: list[Source] = []
        with self._lock:
            try:
                sources.append(Source(self.path.name, open(self.path, "rb"), self._size))  # noqa: SIM115
                for _, rotated in reversed(rotated_files(self.path)):
                    f = open(rotated, "rb")  # noqa: SIM115
                    sources.append(Source(rotated.name, f, os.fstat(f.fileno()).st_size))
            except BaseException:
                for source in sources:
                    source.file.close()
                raise
        return sources

    def records_after(self, seq: int) -> list[Record]:
        """Every record with a seq above ``seq``, oldest first (read from the files)."""
        return self.query(since_seq=seq, limit=None)

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
                if self._head_fd >= 0:
                    os.close(self._head_fd)
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
            end = complete_end(f, size)
            cut, last = end, None
            lines = reverse_lines(f, end)
            newest = next(lines, None)
            if newest is not None:
                last = parse_record(newest[1])
                if last is None:  # a complete line of garbage: a crash can leave that too
                    cut = newest[0]
                    previous = next(lines, None)
                    last = parse_record(previous[1]) if previous else None
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
                    end = complete_end(f, os.fstat(f.fileno()).st_size)
                    newest = next(reverse_lines(f, end), None)
                    last = parse_record(newest[1]) if newest else None
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
        """Make the head durable. Callers serialize (lock, or the single flusher). The
        first write of an open log makes a new file (atomically, by rename: any earlier
        head was another size); later ones overwrite it in place (HEAD_BYTES)."""
        data = canonical_json({"v": FORMAT_VERSION, "seq": seq, "hash": digest})
        data = data.ljust(HEAD_BYTES - 1) + b"\n"  # JSON allows the padding
        if self._head_fd >= 0 and os.fstat(self._head_fd).st_nlink == 0:
            os.close(self._head_fd)  # something renamed another file over it: write anew
            self._head_fd = -1
        if self._head_fd >= 0:
            if os.pwrite(self._head_fd, data, 0) != len(data):
                raise OSError(f"short write to the audit head of {self.path}")
            os.fdatasync(self._head_fd)
            self._durable_seq = seq
            return
        head = head_path(self.path)
        tmp = head.with_name(head.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
            # No directory fsync: if the rename is lost in a crash the older head remains,
            # which verify accepts (records after the head): the log's durability is what
            # matters.
            os.replace(tmp, head)
        except BaseException:
            os.close(fd)
            raise
        self._head_fd = fd  # the same inode, now named audit.head
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
