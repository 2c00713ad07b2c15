"""The gateway over real HTTP: health, auth negatives, REST tools, policy, approvals, audit."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox.audit.log import verify
from gateway_harness import RunningGateway, running_gateway
from tierkit import not_on_gvisor

# Every test on both isolation tiers (tests/conftest.py, default_tier).
pytestmark = pytest.mark.usefixtures("default_tier")

SECRET = "planted-secret-value-7f3a9c"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gw"), approval_timeout="3s",
                         env={"AGENTBOX_TEST_PLANTED_SECRET": SECRET}) as running:  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def sandbox_id(gw: RunningGateway, default_tier: str) -> Iterator[str]:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        yield sid
        op.delete(f"/v1/sandboxes/{sid}")


def session_token(gw: RunningGateway, sandbox: str, **body: Any) -> str:
    with gw.operator() as op:
        r = op.post("/v1/tokens", json={"sandbox": sandbox, **body})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def run(gw: RunningGateway, token: str, sandbox: str, command: str) -> Any:
    with gw.client(token) as c:
        return c.post(f"/v1/sandboxes/{sandbox}/commands", json={"command": command})


def test_health_and_openapi(gw: RunningGateway) -> None:
    with gw.client() as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").status_code == 200
        spec = c.get("/openapi.json").json()
        assert "/v1/sandboxes/{sandbox_id}/commands" in spec["paths"]


def test_no_token_and_bad_tokens_get_401_with_www_authenticate(gw: RunningGateway,
                                                                sandbox_id: str) -> None:  # fmt: skip
    good = session_token(gw, sandbox_id)
    tampered = good[:-1] + ("A" if good[-1] != "A" else "B")
    for token in (None, "nonsense", tampered, "Basic abc"):
        with gw.client(token) as c:
            r = c.get(f"/v1/sandboxes/{sandbox_id}")
        assert r.status_code == 401, (token, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer ")
        assert r.json()["error"]["code"] == "unauthenticated"


def test_expired_and_revoked_tokens(gw: RunningGateway, sandbox_id: str) -> None:
    short = session_token(gw, sandbox_id, ttl=1)
    deadline = time.monotonic() + 10
    while run(gw, short, sandbox_id, "true").status_code == 200:
        assert time.monotonic() < deadline, "a 1-second token still worked after 10 s"
        time.sleep(0.1)
    r = run(gw, short, sandbox_id, "true")
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]

    token = session_token(gw, sandbox_id)
    with gw.operator() as op:
        token_id = next(t["id"] for t in op.get("/v1/tokens").json() if not t["revoked"])
        tokens = op.get("/v1/tokens", params={"sandbox": sandbox_id}).json()
        assert all("token" not in t for t in tokens)  # values are never listed
        for t in tokens:
            op.delete(f"/v1/tokens/{t['id']}")
    assert token_id
    assert run(gw, token, sandbox_id, "true").status_code == 401


def test_session_token_scope(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id)
    with gw.operator() as op:
        other = op.post("/v1/sandboxes", json={"memory": "128MiB", "disk": "64MiB"}).json()["id"]
    try:
        assert run(gw, token, other, "true").status_code == 403  # another sandbox
        with gw.client(token) as c:
            for method, path in [("POST", "/v1/sandboxes"), ("GET", "/v1/tokens"),
                                 ("GET", "/v1/audit"), ("DELETE", f"/v1/sandboxes/{sandbox_id}"),
                                 ("POST", "/v1/approvals/ap-000000000000/approve")]:  # fmt: skip
                r = c.request(method, path, json={} if method == "POST" else None)
                assert r.status_code == 403, (method, path, r.text)
                assert r.json()["error"]["code"] == "insufficient_scope"
            assert [s["id"] for s in c.get("/v1/sandboxes").json()] == [sandbox_id]
    finally:
        with gw.operator() as op:
            op.delete(f"/v1/sandboxes/{other}")


def test_tool_scoped_token(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id, tools=["fs_read"])
    with gw.client(token) as c:
        assert [t["name"] for t in c.get("/v1/tools").json()] == ["fs_read"]
    r = run(gw, token, sandbox_id, "true")
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"


def test_tokens_die_with_their_sandbox(gw: RunningGateway) -> None:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "128MiB", "disk": "64MiB"}).json()["id"]
    token = session_token(gw, sid)
    assert run(gw, token, sid, "true").status_code == 200
    with gw.operator() as op:
        assert op.delete(f"/v1/sandboxes/{sid}").json()["tokens_revoked"] >= 1
    assert run(gw, token, sid, "true").status_code == 401


def test_command_file_and_redaction(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id)
    r = run(
        gw, token, sandbox_id, f"echo out; echo {SECRET}; echo AKIAIOSFODNN7EXAMPLE >&2; exit 3"
    )
    body = r.json()
    assert r.status_code == 200 and body["exit_code"] == 3
    assert body["stdout"] == "out\n[REDACTED:AGENTBOX_TEST_PLANTED_SECRET]\n"
    assert body["stderr"] == "[REDACTED:aws-access-key]\n"
    with gw.client(token) as c:
        w = c.put(f"/v1/sandboxes/{sandbox_id}/files",
                  json={"path": "notes.txt", "content": "one\ntwo\n"})  # fmt: skip
        assert w.status_code == 200, w.text
        assert "+two" in w.json()["diff"]  # require_diff_summary
        assert c.get(f"/v1/sandboxes/{sandbox_id}/files",
                     params={"path": "notes.txt"}).json()["content"] == "one\ntwo\n"  # fmt: skip


def test_prompts_are_redacted(gw: RunningGateway, sandbox_id: str, default_tier: str) -> None:
    not_on_gvisor(default_tier, "no input detection there, so no prompt to redact "
                  "(docs/design.md, feature table)")  # fmt: skip
    token = session_token(gw, sandbox_id)
    asks = run(gw, token, sandbox_id, f"python3 -c 'input(\"key {SECRET}? \")'").json()
    assert asks["waiting_for_input"], asks
    assert asks["prompt"] == "key [REDACTED:AGENTBOX_TEST_PLANTED_SECRET]?"
    assert SECRET not in json.dumps(asks)
    with gw.client(token) as c:
        c.post(f"/v1/sandboxes/{sandbox_id}/processes/{asks['process_id']}/signal",
               json={"signal": "SIGKILL"})  # fmt: skip


def test_saved_output_is_redacted(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id)
    long = run(gw, token, sandbox_id, f"seq 1 9999; echo {SECRET}; seq 1 9999").json()
    assert long["truncated"] and SECRET not in json.dumps(long)
    with gw.client(token) as c:
        saved = c.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": long["stdout_file"]})
    assert "[REDACTED:AGENTBOX_TEST_PLANTED_SECRET]" in saved.json()["content"]
    assert SECRET not in saved.text


def test_streaming_output_over_sse(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id)
    events = []
    with gw.client(token) as c, c.stream(
        "POST", f"/v1/sandboxes/{sandbox_id}/commands", params={"stream": "true"},
        json={"command": "echo a; echo b >&2; echo c"},
    ) as r:  # fmt: skip
        assert r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[6:])))
    assert ("stderr", {"data": "b\n"}) in events
    assert events[-1][0] == "result" and events[-1][1]["stdout"] == "a\nc\n"


@pytest.mark.parametrize(
    "command",
    ["ls; curl http://x", "ls && curl x", "ls | xargs curl", "echo $(curl x)", "`curl x`",
     "env A=1 curl x", "/usr/bin/curl x", "/proc/self/root/usr/bin/curl x", "bash -c 'curl x'",
     "(curl x)", "nohup python3 x", "x=curl; $x y", "echo 'unbalanced"],
)  # fmt: skip
def test_policy_denials_name_the_rule(gw: RunningGateway, sandbox_id: str, command: str) -> None:
    r = run(gw, session_token(gw, sandbox_id), sandbox_id, command)
    assert r.status_code == 403, (command, r.text)
    error = r.json()["error"]
    assert error["code"] == "policy_denied" and error["details"]["rule"]


def test_protected_paths(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id)
    with gw.client(token) as c:
        for path in (".git/hooks/pre-commit", "/workspace/.mcp.json", "/etc/passwd", "../etc/x"):
            r = c.put(f"/v1/sandboxes/{sandbox_id}/files", json={"path": path, "content": "x"})
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"]["code"] == "policy_denied"


def _approve_when_pending(
    gw: RunningGateway, sandbox: str, verdict: str, done: threading.Event
) -> None:
    with gw.operator() as op:
        while not done.is_set():
            pending = op.get("/v1/approvals", params={"status": "pending"}).json()
            pending = [a for a in pending if a["sandbox"] == sandbox]
            if pending:
                op.post(f"/v1/approvals/{pending[0]['id']}/{verdict}")
                return
            done.wait(0.02)


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_approval_flow(gw: RunningGateway, sandbox_id: str, verdict: str) -> None:
    token = session_token(gw, sandbox_id)
    done = threading.Event()
    helper = threading.Thread(target=_approve_when_pending, args=(gw, sandbox_id, verdict, done))
    helper.start()
    try:
        r = run(gw, token, sandbox_id, "mkdir -p /tmp/x && rm -rf /tmp/x")
    finally:
        done.set()
        helper.join(10)
    if verdict == "approve":
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    else:
        assert r.status_code == 403 and r.json()["error"]["code"] == "approval_denied"


def test_approval_times_out_as_denial(gw: RunningGateway, sandbox_id: str) -> None:
    r = run(gw, session_token(gw, sandbox_id), sandbox_id, "rm -rf /tmp/nothing")
    assert r.status_code == 403
    assert "timed out" in r.json()["error"]["message"]


def test_bad_requests_are_clear_errors(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id)
    url = f"/v1/sandboxes/{sandbox_id}/commands"
    with gw.client(token) as c:
        cases = [
            c.post(url, content=b"{not json", headers={"content-type": "application/json"}),
            c.post(url, json={"command": "true", "surprise": 1}),
            c.post(url, content=b'{"command": "\xff\xfe"}', headers={"content-type": "application/json"}),
            c.post(url, json={"command": ""}),
        ]  # fmt: skip
        for r in cases:
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "invalid_request"
        big = c.post(
            url, content=b"x" * (9 * 1024 * 1024), headers={"content-type": "application/json"}
        )
        assert big.status_code == 413
    with gw.client(token, headers={"Host": "evil.example"}) as c:
        assert c.get("/healthz").status_code == 421
    with gw.client(token, headers={"Host": f"localhost:{gw.port}"}) as c:
        assert c.get("/healthz").status_code == 200
    with gw.client(token, headers={"Origin": "http://evil.example"}) as c:
        assert c.get("/healthz").status_code == 403


def test_the_tool_route_keeps_every_guard(gw: RunningGateway, sandbox_id: str) -> None:
    """POST /v1/tools/{name} is served ahead of FastAPI's routing: the Host/Origin checks,
    the body cap, auth and the typed errors must still hold there."""
    token = session_token(gw, sandbox_id)
    url = "/v1/tools/fs_stat"
    body = {"arguments": {"path": "/workspace"}}
    with gw.client(token) as c:
        assert c.post(url, json=body).json()["type"] == "dir"
        cases = {
            400: c.post(url, content=b"{not json", headers={"content-type": "application/json"}),
            404: c.post("/v1/tools/no_such_tool", json=body),
            413: c.post(url, content=b"x" * (9 * 1024 * 1024)),
        }  # fmt: skip
        for status, r in cases.items():
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] in {
                "invalid_request",
                "tool_not_found",
                "limit_exceeded",
            }
        # other methods and deeper paths still reach the router
        assert c.get(url).status_code == 405
        assert c.post(url + "/x", json=body).status_code == 404
    with gw.client(None) as c:
        r = c.post(url, json=body)
        assert r.status_code == 401 and "WWW-Authenticate" in r.headers
    with gw.client(token, headers={"Host": "evil.example"}) as c:
        assert c.post(url, json=body).status_code == 421
    with gw.client(token, headers={"Origin": "http://evil.example"}) as c:
        assert c.post(url, json=body).status_code == 403


def test_audit_records_everything_and_verifies(gw: RunningGateway, sandbox_id: str) -> None:
    token = session_token(gw, sandbox_id)
    run(gw, token, sandbox_id, f"echo {SECRET}")
    with gw.operator() as op:
        records = op.get("/v1/audit", params={"limit": 1000}).json()
    decisions = {r["decision"] for r in records}
    assert {"sandbox_created", "token_issued", "allowed", "denied"} <= decisions
    last = [r for r in records if r["tool"] == "terminal_run"][-1]
    for key in ("ts", "actor", "session", "sandbox", "tool", "args_hash", "decision",
                "exit_code", "duration_ms", "bytes_out", "error", "hash", "prev"):  # fmt: skip
        assert key in last
    text = gw.audit_path.read_text()
    assert SECRET not in text and token not in text
    assert verify(gw.audit_path).ok


SERVICE = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path,
                           "auth": self.headers.get("Authorization"),
                           "body": self.rfile.read(n).decode()}).encode()
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Service", "in-sandbox")
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8765), H).serve_forever()
"""


def test_a_sandbox_port_is_reachable_only_through_the_gateway(
    gw: RunningGateway, sandbox_id: str
) -> None:
    with gw.operator() as op:
        started = op.post(f"/v1/sandboxes/{sandbox_id}/processes",
                          json={"command": f"python3 -c '{SERVICE}'"})  # fmt: skip
        assert started.status_code == 201, started.text
        url = f"/v1/sandboxes/{sandbox_id}/ports/8765/api/items?x=1"
        deadline = time.monotonic() + 10
        while (r := op.post(url, content=b"payload")).status_code == 404:
            assert time.monotonic() < deadline, r.text  # the service is still starting
            time.sleep(0.05)
        assert r.status_code == 201 and r.headers["x-service"] == "in-sandbox", r.text
        seen = r.json()
        assert seen["path"] == "/api/items?x=1" and seen["body"] == "payload"
        assert seen["auth"] is None, "the gateway token was forwarded into the sandbox"
        assert op.get(f"/v1/sandboxes/{sandbox_id}/ports/8766/").json()["error"]["code"] == (
            "not_found"
        )
    # Nothing listens on the host: the service's socket lives in the sandbox's netns.
    host_listeners = Path("/proc/net/tcp").read_text() + Path("/proc/net/tcp6").read_text()
    assert f":{8765:04X} " not in host_listeners
    with gw.client() as anonymous:
        assert anonymous.get(url).status_code == 401
    with gw.operator() as op:
        other = op.post("/v1/sandboxes", json={"memory": "128MiB", "disk": "64MiB",
                                               "network": "none"}).json()["id"]  # fmt: skip
    try:
        with gw.client(session_token(gw, other)) as c:
            assert c.get(url).status_code == 403  # another sandbox's token
        with gw.client(session_token(gw, sandbox_id, tools=["fs_read"])) as c:
            assert c.get(url).status_code == 403  # a token without the ports scope
        with gw.client(session_token(gw, sandbox_id, tools=["ports"])) as c:
            assert c.get(url).status_code == 201
    finally:
        with gw.operator() as op:
            op.delete(f"/v1/sandboxes/{other}")


def test_egress_decisions_land_in_the_gateway_trail(gw: RunningGateway, sandbox_id: str) -> None:
    """The sandbox's default network (allowlist, nothing allowed): a request to a name is
    refused by the egress proxy (by name, before any lookup), and the gateway's trail
    shows the decision."""
    fetch = (
        'python3 -c \'import urllib.request as u\ntry: u.urlopen("http://denied.test/", '
        "timeout=5)\nexcept Exception as e: print(e.read().decode())'"
    )
    out = run(gw, gw.operator_token, sandbox_id, fetch)
    assert out.status_code == 200, out.text
    assert "denied.test" in out.json()["stdout"], out.text
    deadline = time.monotonic() + 10
    with gw.operator() as op:
        while True:
            found = op.get("/v1/audit", params={"sandbox": sandbox_id,
                                                "decision": "egress_denied"}).json()  # fmt: skip
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert found, "no egress_denied record reached the gateway's audit trail"
    assert found[-1]["host"] == "denied.test" and found[-1]["egress_seq"] >= 1
    # ... and its metrics (operator only)
    with gw.operator() as op:
        text = op.get("/metrics").text
    denied = [line for line in text.splitlines()
              if line.startswith('agentbox_egress_decisions_total{decision="egress_denied"')]  # fmt: skip
    assert denied and float(denied[0].rsplit(" ", 1)[1]) >= 1, text[:2000]
    assert 'agentbox_tool_calls_total{decision="allowed",tool="terminal_run"}' in text
    with gw.operator() as op:
        op.post("/v1/tools/made-up-name-123", json={"arguments": {}})
        text = op.get("/metrics").text
    assert "made-up-name-123" not in text and 'tool="unknown"' in text
    with gw.client(session_token(gw, sandbox_id)) as c:
        assert c.get("/metrics").status_code == 403
    with gw.client() as anonymous:
        assert anonymous.get("/metrics").status_code == 401
