"""Ship audit records to a remote log service, without ever making a tool call wait.

The remote copy is the external anchor of the audit chain: an attacker who rewrites the
local files (head included) cannot also rewrite what the remote already received.

Flow::

    AuditLog.append ──submit()──▶ memory queue ──(every batch_interval s / batch_records)──▶
        spool file in audit.spool/ (fsynced) ──POST JSON array──▶ remote ──2xx──▶ spool file deleted

- ``submit`` only enqueues; one background thread does all disk and network work.
- Every batch is written to the spool *before* it is sent (write-ahead), so an outage, a
  crash or a restart loses nothing: the next instance ships what the spool still holds.
- ``audit.spool/watermark`` holds the highest seq that reached the spool. At start, records
  of the local log above it (those that were still in memory when the process died) are
  queued again — see :meth:`RemoteSink.start`.
- Delivery is at-least-once, oldest seq first: a batch may be sent again after a timeout
  or a crash, so the receiver dedupes by ``seq`` (each request also carries an
  ``Idempotency-Key: audit-<first seq>-<last seq>`` header).
- Failures back off exponentially with "equal jitter" (half the delay fixed, half random),
  capped at ``backoff_max`` seconds; any non-2xx answer is a failure and is retried, since
  dropping a record is never an option (a wrong token shows up as a logged warning and a
  growing spool, not as lost records).
- The bearer token is read from the environment at start (``token_env``), never from the
  config file; plain ``http://`` is refused unless the host is loopback, so the token is
  not sent in clear over a network; redirects are not followed.

``audit.fields`` (``fields`` here) limits what leaves the host: only the listed record
fields are shipped, plus the chain fields ``v``, ``seq``, ``prev`` and ``hash``, which keep
the remote copy comparable with the local chain record by record (the local file always
keeps whole records: their hashes cover every field). Empty means everything.

Spool file names are ``<first seq>-<last seq>-<ns>.json`` (seqs zero-padded to 20 digits,
so name order is seq order); each holds one JSON array of records.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2

from agentbox.errors import Conflict, InvalidConfig
from agentbox.fsutil import fsync_dir

if TYPE_CHECKING:
    from agentbox.config.settings import RemoteAuditSettings

log = logging.getLogger(__name__)

Record = dict[str, Any]
WATERMARK = "watermark"
_LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
_CHAIN_FIELDS = frozenset({"v", "seq", "prev", "hash"})


@dataclass
class SinkStats:
    """Counters for metrics and tests. Written by the shipper thread only."""

    shipped_records: int = 0
    shipped_batches: int = 0
    failed_attempts: int = 0
    spooled_batches: int = 0
    last_error: str | None = None


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a fsynced temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class RemoteSink:
    """Batches audit records and POSTs them as JSON arrays, spooling to disk while down.

    Times are in **seconds**. Call :meth:`start` once (``AuditLog`` does), then
    :meth:`submit` for each record in seq order, then :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        spool_dir: str | os.PathLike[str],
        *,
        token: str | None = None,
        batch_records: int = 500,
        batch_interval: float = 0.5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        request_timeout: float = 10.0,
        transport: httpx2.BaseTransport | None = None,
        fields: Iterable[str] = (),
    ) -> None:
        parsed = httpx2.URL(url)
        if parsed.scheme not in ("https", "http") or not parsed.host:
            raise InvalidConfig(f"audit.remote.url {url!r} is not an http(s) URL")
        if parsed.scheme == "http" and parsed.host not in _LOOPBACK:
            raise InvalidConfig(
                f"audit.remote.url {url!r} uses plain http to a remote host, which would send "
                "the audit records and the token in clear: use https"
            )
        if batch_records < 1 or batch_interval <= 0 or backoff_base <= 0 or request_timeout <= 0:
            raise InvalidConfig("remote sink batch and timing settings must be positive")
        self.url = url
        self.fields = frozenset(fields) | _CHAIN_FIELDS if fields else None
        self.spool_dir = Path(spool_dir)
        self.stats = SinkStats()
        self._token = token
        self._batch_records = batch_records
        self._batch_interval = batch_interval
        self._backoff_base = backoff_base
        self._backoff_max = max(backoff_max, backoff_base)
        self._request_timeout = request_timeout
        self._transport = transport
        self._cond = threading.Condition()
        self._queue: deque[Record] = deque()
        self._first_queued_at = 0.0
        self._stopping = False
        self._deadline = 0.0
        self._spooled: list[Path] = []  # touched by the shipper thread only (after start)
        self._failures = 0
        self._next_attempt = 0.0
        self._watermark = 0
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(
        cls,
        remote: RemoteAuditSettings,
        spool_dir: str | os.PathLike[str],
        environ: Mapping[str, str] | None = None,
        fields: Iterable[str] = (),
    ) -> RemoteSink:
        """Build from ``audit.remote``; the token comes from the variable ``token_env`` names."""
        env = os.environ if environ is None else environ
        token = None
        if remote.token_env:
            token = env.get(remote.token_env)
            if not token:
                raise InvalidConfig(
                    f"audit.remote.token_env names {remote.token_env}, which is not set: "
                    "export the remote log service's token in it before starting the gateway"
                )
        return cls(remote.url, spool_dir, token=token, fields=fields)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, last_seq: int, read_after: Callable[[int], Iterable[Record]]) -> None:
        """Pick up the spool and the records a crash kept from it, then start shipping.

        ``last_seq`` is the newest seq in the local log; ``read_after(seq)`` yields the
        local records above ``seq`` in seq order. A first start (no watermark yet) begins
        at ``last_seq``: history written before the sink was configured is not shipped.
        """
        if self._thread is not None:
            raise Conflict("the remote audit sink is already started")
        self.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in self.spool_dir.glob(".*.tmp"):
            stale.unlink()
        self._spooled = sorted(self.spool_dir.glob("*.json"))
        mark = self._read_watermark()
        if mark is None or mark > last_seq:  # first start, or a new chain under old spool
            self._set_watermark(last_seq)
        else:
            self._watermark = mark
            if mark < last_seq:
                backlog = [self._project(r) for r in read_after(mark)]
                log.info("audit sink: re-queueing %d records not yet spooled", len(backlog))
                with self._cond:
                    self._queue.extend(backlog)
                    self._first_queued_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="audit-sink", daemon=True)
        self._thread.start()

    def submit(self, record: Record) -> None:
        """Queue one record for shipping. Never blocks on disk or network."""
        with self._cond:
            if self._stopping:
                raise Conflict("the remote audit sink is closed; open a new AuditLog")
            if not self._queue:  # wake the shipper to start the batch_interval timer
                self._first_queued_at = time.monotonic()
                self._cond.notify_all()
            self._queue.append(self._project(record))
            if len(self._queue) == self._batch_records:
                self._cond.notify_all()

    def _project(self, record: Record) -> Record:
        if self.fields is None:
            return record
        return {k: v for k, v in record.items() if k in self.fields}

    def close(self, timeout: float = 5.0) -> bool:
        """Spool what is queued and try to ship the spool for up to ``timeout`` seconds.

        Returns True when the remote has everything; otherwise the rest stays in the spool
        for the next start.
        """
        with self._cond:
            if not self._stopping:
                self._stopping = True
                self._deadline = time.monotonic() + timeout
            self._cond.notify_all()
        if self._thread is None:
            return not self._queue
        self._thread.join(timeout + 1.0)
        return not self._thread.is_alive() and not self._spooled

    def spooled_files(self) -> list[Path]:
        """The batches on disk waiting for the remote (oldest first)."""
        return sorted(self.spool_dir.glob("*.json"))

    # -- the shipper thread ---------------------------------------------------------------

    def _run(self) -> None:
        with httpx2.Client(
            transport=self._transport, follow_redirects=False, timeout=self._request_timeout
        ) as client:
            while True:
                batch, stopping = self._wait_for_work()
                try:
                    if batch:
                        self._spool(batch)
                    if stopping:
                        self._drain(client)
                        return
                    if self._spooled and time.monotonic() >= self._next_attempt:
                        self._ship_one(client, self._request_timeout)
                except Exception:  # the shipper must outlive any single failure
                    log.exception("audit sink: unexpected error; retrying")
                    self._failed("unexpected error")

    def _wait_for_work(self) -> tuple[list[Record], bool]:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                waits = []
                if self._queue:
                    due = self._first_queued_at + self._batch_interval
                    if len(self._queue) >= self._batch_records or now >= due:
                        break
                    waits.append(due - now)
                if self._spooled:
                    if now >= self._next_attempt:
                        break
                    waits.append(self._next_attempt - now)
                self._cond.wait(min(waits) if waits else None)
            batch = list(self._queue)
            self._queue.clear()
            return batch, self._stopping

    def _spool(self, batch: list[Record]) -> None:
        for i in range(0, len(batch), self._batch_records):
            chunk = batch[i : i + self._batch_records]
            first, last = chunk[0]["seq"], chunk[-1]["seq"]
            path = self.spool_dir / f"{first:020d}-{last:020d}-{time.time_ns()}.json"
            try:
                _write_atomically(path, json.dumps(chunk, separators=(",", ":")).encode())
            except OSError as e:
                # Keep the records in memory and try again later rather than drop them.
                log.error("audit sink: cannot write the spool in %s: %s", self.spool_dir, e)
                with self._cond:
                    self._queue.extendleft(reversed(batch[i:]))
                    self._cond.wait(self._backoff_base)
                return
            self._spooled.append(path)
            self._spooled.sort()
            self.stats.spooled_batches += 1
            if last > self._watermark:
                self._set_watermark(last)

    def _ship_one(self, client: httpx2.Client, timeout: float) -> bool:
        """POST the oldest spooled records (up to one batch); True when the remote took them."""
        files: list[Path] = []
        records: list[Record] = []
        for path in self._spooled:
            if files and len(records) >= self._batch_records:
                break
            try:
                loaded = json.loads(path.read_bytes())
            except (OSError, ValueError) as e:
                bad = path.with_suffix(".bad")
                log.error("audit sink: unreadable spool file %s (%s), kept as %s", path, e, bad)
                path.rename(bad)
                self._spooled.remove(path)
                return False
            files.append(path)
            records.extend(loaded)
        if not files:
            return True
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": f"audit-{records[0]['seq']}-{records[-1]['seq']}",
        }
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        body = json.dumps(records, separators=(",", ":")).encode()
        try:
            response = client.post(self.url, content=body, headers=headers, timeout=timeout)
        except httpx2.HTTPError as e:
            self._failed(f"{type(e).__name__}: {e}")
            return False
        if not response.is_success:
            self._failed(f"HTTP {response.status_code}")
            return False
        for path in files:
            path.unlink(missing_ok=True)
            self._spooled.remove(path)
        self._failures = 0
        self._next_attempt = 0.0
        self.stats.shipped_records += len(records)
        self.stats.shipped_batches += 1
        return True

    def _failed(self, why: str) -> None:
        self._failures += 1
        cap = min(self._backoff_max, self._backoff_base * 2 ** min(self._failures - 1, 30))
        delay = cap / 2 + random.uniform(0, cap / 2)
        self._next_attempt = time.monotonic() + delay
        self.stats.failed_attempts += 1
        self.stats.last_error = why
        log.warning(
            "audit sink: %s unreachable (%s); %d batch file(s) spooled, retry in %.2fs",
            self.url,
            why,
            len(self._spooled),
            delay,
        )

    def _drain(self, client: httpx2.Client) -> None:
        """On close: ship the spool until it is empty or the deadline passes."""
        while self._spooled:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                return
            wait = self._next_attempt - time.monotonic()
            if wait > 0:
                if wait >= remaining:
                    return
                time.sleep(wait)
                continue
            self._ship_one(client, min(self._request_timeout, max(remaining, 0.01)))

    # -- watermark ------------------------------------------------------------------------

    def _read_watermark(self) -> int | None:
        try:
            data = json.loads((self.spool_dir / WATERMARK).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            log.error("audit sink: unreadable watermark in %s; re-shipping nothing", self.spool_dir)
            return None
        seq = data.get("seq") if isinstance(data, dict) else None
        return seq if type(seq) is int and seq >= 0 else None

    def _set_watermark(self, seq: int) -> None:
        _write_atomically(self.spool_dir / WATERMARK, json.dumps({"seq": seq}).encode())
        self._watermark = seq
