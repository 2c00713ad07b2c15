"""Lifecycle through a real gateway: idle enforcement by its watcher, the events stream
(SSE), signed webhooks to a real HTTP receiver on loopback, and the audit trail."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway_harness import RunningGateway, running_gateway
from httpsink import Sink

WEBHOOK_SECRET = "whsec-test-0123456789"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Sink]:
    with Sink() as sink:
        yield sink


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None,
       receiver: Sink) -> Iterator[RunningGateway]:  # fmt: skip
    extra = f"""
lifecycle:
  check_interval: 0.5s
  webhooks:
    - url: http://127.0.0.1:{receiver.port}/hook
      secret_env: AGENTBOX_TEST_WEBHOOK_SECRET
"""
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwl"), extra_yaml=extra,
                         env={"AGENTBOX_TEST_WEBHOOK_SECRET": WEBHOOK_SECRET}) as running:  # fmt: skip
        yield running


def wait_for(predicate: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def read_sse(response: httpx2.Response, until: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Lifecycle events from an open SSE response until ``until(events)`` holds."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    event_id = None
    for line in response.iter_lines():
        assert time.monotonic() < deadline, f"no matching event in time; saw {seen}"
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            assert event["id"] == event_id
            seen.append(event)
            if until(seen):
                return seen
    raise AssertionError(f"the stream ended; saw {seen}")


def test_idle_sandbox_with_an_idle_open_stream_is_paused_and_told(
    gw: RunningGateway, receiver: Sink
) -> None:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB",
                                           "network": "none", "idle_timeout": "2s"})  # fmt: skip
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert r.json()["idle_timeout"] == 2 and r.json()["on_idle"] == "pause"
        try:
            r = op.post(f"/v1/sandboxes/{sid}/processes", json={"command": "sleep 600"})
            assert r.status_code == 201, r.text
            # an open stream on which nothing happens is not activity
            with (
                gw.client(gw.operator_token) as c,
                c.stream("GET", "/v1/events", params={"sandbox": sid}) as stream,
            ):
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                got = read_sse(stream, lambda ev: any(e["type"] == "paused" for e in ev))
            paused = next(e for e in got if e["type"] == "paused")
            assert paused["reason"] == "idle" and paused["sandbox"] == sid
            assert paused["actor"] == "agentbox"
            assert op.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
            # a call resumes it
            r = op.post(f"/v1/sandboxes/{sid}/commands", json={"command": "echo hi"})
            assert r.json()["stdout"] == "hi\n"
            assert op.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        finally:
            op.delete(f"/v1/sandboxes/{sid}")
    # the webhook got them, signed
    hooked = wait_for(lambda: [e for e in receiver.json_bodies() if e["sandbox"] == sid
                               and e["type"] == "destroyed"])  # fmt: skip
    assert hooked[0]["reason"] == "operator"
    types = [(e["type"], e["reason"]) for e in receiver.json_bodies() if e["sandbox"] == sid]
    assert types[:4] == [("created", "operator"), ("paused", "idle"),
                         ("resumed", "activity"), ("destroyed", "operator")]  # fmt: skip
    for headers, body in receiver.posts:
        expected = "sha256=" + hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["X-Agentbox-Signature-256"] == expected
        assert headers["X-Agentbox-Event"] == json.loads(body)["type"]
    # and the audit trail
    lifecycle = [
        json.loads(line) for line in gw.audit_path.read_text().splitlines()
        if '"lifecycle"' in line and sid in line
    ]  # fmt: skip
    assert ("paused", "idle") in [(r["event"], r["reason"]) for r in lifecycle]


def test_events_replay_and_scoping(gw: RunningGateway) -> None:
    with gw.operator() as op:
        start = int(op.get("/v1/events", params={"after": 0, "follow": "false"})
                    .text.rsplit("id: ", 1)[-1].split("\n")[0] or 0)  # fmt: skip
        sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB",
                                             "network": "none"}).json()["id"]  # fmt: skip
        other = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB",
                                               "network": "none"}).json()["id"]  # fmt: skip
        try:
            assert op.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
            assert op.post(f"/v1/sandboxes/{sid}/stop").json()["state"] == "stopped"
            assert op.post(f"/v1/sandboxes/{sid}/resume").json()["state"] == "running"
            # replay from an id, without following
            text = op.get("/v1/events", params={"after": start, "follow": "false"}).text
            mine = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: ")]
            mine = [(e["type"], e["reason"]) for e in mine if e["sandbox"] == sid]
            assert mine == [("created", "operator"), ("paused", "operator"),
                            ("stopped", "operator"), ("started", "operator")]  # fmt: skip
            # Last-Event-ID resumes after that id
            text = op.get("/v1/events", params={"follow": "false"},
                          headers={"Last-Event-ID": str(start)}).text  # fmt: skip
            assert text.count("event: lifecycle") >= 4
            # a session token sees its own sandbox only
            token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
            with gw.client(token) as c:
                text = c.get("/v1/events", params={"after": start, "follow": "false"}).text
                assert sid in text and other not in text
                r = c.get("/v1/events", params={"sandbox": other, "follow": "false"})
                assert r.status_code == 403
        finally:
            op.delete(f"/v1/sandboxes/{sid}")
            op.delete(f"/v1/sandboxes/{other}")
