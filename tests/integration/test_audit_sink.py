"""The remote audit sink against a real HTTP server on 127.0.0.1 that goes down and up:
no record is lost (across outages and restarts), the bearer token is sent, and appends
never wait for the network."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentbox.audit.log import AuditLog, verify
from agentbox.audit.sink import RemoteSink

TOKEN = "test-token-123"


class Receiver:
    """A remote log service that can be started and stopped on one fixed port."""

    def __init__(self) -> None:
        with socket.socket() as s:  # a free port, closed again: "down" until start()
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/ingest"
        self.records: list[dict[str, Any]] = []
        self.auth: set[str | None] = set()
        self.keys: list[str | None] = []
        self.completed = 0
        self.entered = threading.Event()  # a POST has arrived
        self.release = threading.Event()  # answer POSTs (cleared: hold them)
        self.release.set()
        self._cond = threading.Condition()
        self._server: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.entered.set()
                assert receiver.release.wait(10)
                with receiver._cond:
                    receiver.records.extend(json.loads(body))
                    receiver.auth.add(self.headers.get("Authorization"))
                    receiver.keys.append(self.headers.get("Idempotency-Key"))
                    receiver.completed += 1
                    receiver._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def address_string(self) -> str:  # the default does a reverse DNS lookup
                return str(self.client_address[0])

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,))
        self._thread.start()

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        self._server = None

    def seqs(self) -> set[int]:
        with self._cond:
            return {r["seq"] for r in self.records}

    def wait_for(self, seqs: range, timeout: float = 10.0) -> None:
        want = set(seqs)
        with self._cond:
            got = self._cond.wait_for(lambda: want <= {r["seq"] for r in self.records}, timeout)
        assert got, f"the remote never got seqs {sorted(want - self.seqs())[:10]}..."


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    if r._server is not None:
        r.stop()


def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def quick_sink(receiver: Receiver, spool: Path) -> RemoteSink:
    return RemoteSink(
        receiver.url,
        spool,
        token=TOKEN,
        batch_records=20,
        batch_interval=0.01,
        backoff_base=0.01,
        backoff_max=0.05,
        request_timeout=2.0,
    )


def test_no_record_is_lost_while_the_remote_goes_down_and_up(
    tmp_path: Path, receiver: Receiver
) -> None:
    path = tmp_path / "audit.jsonl"
    sink = quick_sink(receiver, tmp_path / "audit.spool")
    log = AuditLog(path, fsync="batch", sink=sink)
    durations: list[float] = []

    def append(n: int) -> None:
        for _ in range(n):
            start = time.perf_counter()
            log.append(decision="allowed", tool="terminal.run", args={"cmd": "ls"})
            durations.append(time.perf_counter() - start)

    try:
        # 1. down: appends go on; the sink fails, backs off and spools to disk.
        append(30)
        eventually(
            lambda: sink.stats.failed_attempts >= 2, "the sink to fail against a closed port"
        )
        assert sink.spooled_files() and receiver.seqs() == set()

        # 2. up, with the first POST held open: an append returns while a ship is in flight.
        receiver.release.clear()
        receiver.start()
        assert receiver.entered.wait(10), "the sink never retried"
        append(1)
        assert receiver.completed == 0  # append 31 returned before any ship succeeded
        append(29)
        receiver.release.set()
        receiver.wait_for(range(1, 61))

        # 3. down again, 4. up again.
        receiver.stop()
        failures = sink.stats.failed_attempts
        append(30)
        eventually(lambda: sink.stats.failed_attempts > failures, "a failure while down")
        receiver.start()
        append(30)
        receiver.wait_for(range(1, 121))
    finally:
        log.close()

    assert not sink.spooled_files()
    assert receiver.seqs() == set(range(1, 121))  # at least once each, nothing invented
    assert receiver.auth == {f"Bearer {TOKEN}"}
    assert all(key and key.startswith("audit-") for key in receiver.keys)
    # The remote copy is the external anchor: it matches the local, verified chain.
    assert verify(path).ok
    local = {r["seq"]: r["hash"] for r in log.query(limit=None)}
    assert {r["seq"]: r["hash"] for r in receiver.records} == local
    assert max(durations) < 1.0, f"an append took {max(durations):.3f}s"  # typically < 1 ms


def test_records_spooled_by_one_instance_are_shipped_by_the_next(
    tmp_path: Path, receiver: Receiver
) -> None:
    path, spool = tmp_path / "audit.jsonl", tmp_path / "audit.spool"
    first = quick_sink(receiver, spool)
    log = AuditLog(path, sink=first, sink_close_timeout=0.2)
    for _ in range(25):
        log.append(decision="denied", tool="fs.write")
    eventually(lambda: first.stats.failed_attempts >= 1, "the first instance to fail")
    started = time.monotonic()
    log.close()  # the remote is down: close gives up after its bounded wait
    assert time.monotonic() - started < 3.0
    assert first.spooled_files(), "unshipped records must stay on disk"

    receiver.start()
    second = quick_sink(receiver, spool)
    with AuditLog(path, sink=second) as log:
        receiver.wait_for(range(1, 26))
        log.append(decision="allowed")
        receiver.wait_for(range(1, 27))
    assert not second.spooled_files() and receiver.seqs() == set(range(1, 27))


def test_records_a_crash_kept_from_the_spool_are_backfilled_from_the_log(
    tmp_path: Path, receiver: Receiver
) -> None:
    path, spool = tmp_path / "audit.jsonl", tmp_path / "audit.spool"
    with AuditLog(path) as log:  # history from before the sink was configured
        for _ in range(3):
            log.append(decision="allowed")
    receiver.start()
    with AuditLog(path, sink=quick_sink(receiver, spool)) as log:
        log.append(decision="allowed")
        log.append(decision="allowed")
        receiver.wait_for(range(4, 6))
    assert receiver.seqs() == {4, 5}  # a first start does not ship old history

    # Records that reached the local log but never the spool, as when the process dies
    # with them still queued in memory: the watermark in the spool stays at 5.
    with AuditLog(path) as log:
        for _ in range(5):
            log.append(decision="allowed")
    with AuditLog(path, sink=quick_sink(receiver, spool)):
        receiver.wait_for(range(4, 11))
    assert receiver.seqs() == set(range(4, 11))


def test_audit_fields_limit_what_leaves_the_host(tmp_path: Path, receiver: Receiver) -> None:
    """``audit.fields``: the remote gets the listed fields plus the chain fields (so its
    copy still anchors the local chain); the local file keeps whole records."""
    from agentbox.config.settings import AuditSettings, RemoteAuditSettings

    receiver.start()
    path = tmp_path / "audit.jsonl"
    settings = AuditSettings(
        path=path,
        sink=["local_jsonl", "remote_log_service"],
        remote=RemoteAuditSettings(url=receiver.url, token_env="SINK_TOKEN"),
        fields=["ts", "tool", "decision"],
    )
    with AuditLog.from_settings(settings, environ={"SINK_TOKEN": TOKEN}) as log:
        local = log.append(decision="allowed", tool="fs_read", actor="alice", error="e")
        receiver.wait_for(range(1, 2))
    (shipped,) = receiver.records
    assert set(shipped) == {"v", "seq", "prev", "hash", "ts", "tool", "decision"}
    assert shipped["hash"] == local["hash"] and shipped["tool"] == "fs_read"
    assert verify(path).ok and "alice" in path.read_text()
