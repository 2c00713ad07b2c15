"""Egress mode ask end to end: real sandboxes, the egress daemon, a real gateway, curl.

A sandbox in mode ``ask`` reaches its allowlist at once; a connection to any other name
is held until a person decides through the gateway (here its REST API, which the console
and ``agentbox approvals`` call), and answered either way. The upstream hosts live in a
namespace this test builds (nettopo); every name resolves through the sandbox's static
host map, so no packet leaves the host.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agentbox import Sandbox
from agentbox.audit.log import read_records
from agentbox.egressd import daemon as egressd
from agentbox.state.postgres import migrate
from gateway_harness import AGENTBOX, RunningGateway, issue, running_gateway
from nettopo import UPSTREAM_A, UPSTREAM_B, Internet, internet
from pgkit import PgServer

WAIT = 60.0  # bound on every poll below (a loaded host is slow, never this slow)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with internet(tmp_path_factory.mktemp("net")) as world:
        yield world


@pytest.fixture(scope="module")
def gw(
    net: Internet, agentbox_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("ask-gw")) as gateway:
        yield gateway


def _names(*names: str) -> dict[str, str]:
    """Fresh names for one test (approvals and grants outlive a run in a kept home),
    mapped to the test internet's two hosts."""
    return {f"{n}-{secrets.token_hex(3)}.test": (UPSTREAM_A, UPSTREAM_B)[i % 2]
            for i, n in enumerate(names)}  # fmt: skip


def _create(gw: RunningGateway, hosts: dict[str, str], project: str = "default",
            **network: Any) -> Sandbox:  # fmt: skip
    body = {
        "memory": "256MiB",
        "disk": "64MiB",
        "project": project,
        "network": {"mode": "ask", "allow": ["listed.test"], "hosts": {
            "listed.test": UPSTREAM_A, **hosts}, **network},
    }  # fmt: skip
    with gw.operator() as op:
        created = op.post("/v1/sandboxes", json=body)
    assert created.status_code == 201, created.text
    return Sandbox.connect(created.json()["id"], home=gw.home)


@pytest.fixture
def make(gw: RunningGateway) -> Iterator[Callable[..., Sandbox]]:
    made: list[Sandbox] = []

    def factory(hosts: dict[str, str], **kw: Any) -> Sandbox:
        made.append(_create(gw, hosts, **kw))
        return made[-1]

    yield factory
    for sb in made:
        sb.kill()


def _curl(sb: Sandbox, url: str, *args: str) -> tuple[int, str]:
    r = sb.commands.run(["curl", "-sS", "--max-time", "90", "-o", "-", "-w", "\n%{http_code}",
                         *args, url], timeout=120)  # fmt: skip
    lines = r.stdout.rsplit("\n", 1)
    return int(lines[-1] or 0), lines[0]


def _pending(gw: RunningGateway, sandbox: str, count: int = 1) -> list[dict[str, Any]]:
    """The pending approvals of ``sandbox``, once there are ``count`` (bounded wait)."""
    deadline = time.monotonic() + WAIT
    with gw.operator() as op:
        while True:
            found = [a for a in op.get("/v1/approvals", params={"status": "pending"}).json()
                     if a["sandbox"] == sandbox]  # fmt: skip
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, "no approval was requested"
            time.sleep(0.05)


def _decide(gw: RunningGateway, approval: str, verdict: str, scope: str = "once") -> Any:
    with gw.operator() as op:
        r = op.post(f"/v1/approvals/{approval}/{verdict}", params={"scope": scope})
    assert r.status_code == 200, r.text
    return r.json()


def _eventually(check: Callable[[], Any], what: str) -> Any:
    """``check()`` once it is truthy (bounded wait): the proxy records a connection when
    it ends, which may be just after curl has its answer."""
    deadline = time.monotonic() + WAIT
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return found


def _cli(gw: RunningGateway, *args: str) -> str:
    """``agentbox approvals ...``, the real CLI, against ``gw`` with the operator token."""
    env = {**os.environ, "AGENTBOX_URL": gw.url, "AGENTBOX_TOKEN": gw.operator_token}
    done = subprocess.run([AGENTBOX, "approvals", *args], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _egress(home: Path, sandbox: str, decision: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_records(egressd.audit_path(home), limit=None)
            if r["sandbox"] == sandbox and decision in (None, r["decision"])]  # fmt: skip


# The three ways a sandbox's connection reaches the proxy: a proxied request, a CONNECT
# tunnel (curl --proxytunnel), and a direct connection nftables redirects (by Host).
PATHS = {
    "proxy request": lambda name, ip: [],
    "CONNECT": lambda name, ip: ["--proxytunnel"],
    "direct": lambda name, ip: ["--noproxy", "*", "--resolve", f"{name}:80:{ip}"],
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_held_connection_goes_through_once_a_person_approves(
    gw: RunningGateway, make: Callable[..., Sandbox], net: Internet, path: str
) -> None:
    hosts = _names("held")
    (name, ip), = hosts.items()  # fmt: skip
    sb = make(hosts)
    assert _curl(sb, "http://listed.test/")[0] == 200  # the allowlist needs no one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_curl, sb, f"http://{name}/", *PATHS[path](name, ip))
        (approval,) = _pending(gw, sb.id)
        assert approval["tool"] == "egress" and approval["summary"] == f"connect to {name}:80"
        assert f"sandbox {sb.id} (project default)" in approval["requested_by"]
        assert not held.done() and name not in net.seen(), "not held: it reached upstream"
        decided = _decide(gw, approval["id"], "approve")
        assert decided["status"] == "approved" and decided["decided_by"] == "operator"
        code, body = held.result(WAIT)
    assert code == 200 and body.startswith(f"hello from {name}"), body
    why = f"approved once by operator ({approval['id']})"
    _eventually(
        lambda: [r for r in _egress(gw.home, sb.id, "egress_allowed")
                 if r["host"] == name and why in r["reason"]],
        f"no egress_allowed record for {name} saying {why}",
    )  # fmt: skip


def test_a_denied_connection_is_refused(
    gw: RunningGateway, make: Callable[..., Sandbox], net: Internet
) -> None:
    hosts = _names("denied")
    (name, _), = hosts.items()  # fmt: skip
    sb = make(hosts)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_curl, sb, f"http://{name}/")
        (approval,) = _pending(gw, sb.id)
        _decide(gw, approval["id"], "deny")
        code, body = held.result(WAIT)
    assert code == 403 and f"denied by operator ({approval['id']})" in body, body
    assert name not in net.seen()
    # The decision and who made it: in the gateway's own trail (the REST route) and, from
    # the egress daemon, copied into it by the ingest.
    _eventually(
        lambda: [r for r in read_records(gw.audit_path, limit=None)
                 if r["decision"] == "approval_denied" and r.get("approval") == approval["id"]
                 and r["actor"] == "operator"],
        "the gateway's trail has no approval_denied record by the operator",
    )  # fmt: skip
    decided = _eventually(
        lambda: _egress(gw.home, sb.id, "egress_approval_decided"), "no decided record"
    )
    assert [(r["host"], r["outcome"], r["by"]) for r in decided] == [(name, "denied", "operator")]


def test_no_decision_before_the_timeout_is_a_denial(
    gw: RunningGateway, make: Callable[..., Sandbox], net: Internet
) -> None:
    hosts = _names("late")
    (name, _), = hosts.items()  # fmt: skip
    sb = make(hosts, ask_timeout=2)
    code, body = _curl(sb, f"http://{name}/")  # curl would wait 90 s: the proxy answers
    assert code == 403 and "nobody approved it within 2 s" in body, body
    with gw.operator() as op:
        (expired,) = [a for a in op.get("/v1/approvals", params={"status": "expired"}).json()
                      if a["sandbox"] == sb.id]  # fmt: skip
    assert expired["decided_by"] == "timeout"
    assert name not in net.seen()


def test_many_held_connections_to_one_name_need_one_decision(
    gw: RunningGateway, make: Callable[..., Sandbox], net: Internet
) -> None:
    hosts = _names("many")
    (name, ip), = hosts.items()  # fmt: skip
    sb = make(hosts)
    n = 12
    # Half through the proxy, half direct: every one held on the same approval.
    direct = f"--noproxy '*' --resolve {name}:80:{ip}"
    script = " ".join(
        f"curl -sS --max-time 90 -o /dev/null -w '%{{http_code}}' {direct if i % 2 else ''}"
        f" http://{name}/ > /tmp/code{i} 2>&1 &"
        for i in range(n)
    )
    script += f" wait; cd /tmp && for i in $(seq 0 {n - 1}); do cat code$i; echo; done"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(sb.commands.run, ["bash", "-c", script], timeout=120)
        _eventually(lambda: len(_egress(gw.home, sb.id, "egress_held")) >= n, f"not {n} held")
        (approval,) = _pending(gw, sb.id)  # one request for all of them
        assert len(_egress(gw.home, sb.id, "egress_approval_requested")) == 1
        _decide(gw, approval["id"], "approve")
        r = held.result(WAIT)
    assert r.stdout.split() == ["200"] * n, r.stdout + r.stderr
    assert net.seen().count(f"http 80 {name}") == n


def test_sandbox_scope_lasts_for_the_sandbox_only(
    gw: RunningGateway, make: Callable[..., Sandbox]
) -> None:
    hosts = _names("mine")
    (name, _), = hosts.items()  # fmt: skip
    sb, other = make(hosts), make(hosts)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_curl, sb, f"http://{name}/")
        (approval,) = _pending(gw, sb.id)
        listed = _cli(gw, "ls", "--status", "pending")
        assert f"connect to {name}:80" in listed and approval["id"] in listed
        out = _cli(gw, "approve", approval["id"], "--scope", "sandbox")
        assert out.strip() == f"{approval['id']} approved (sandbox)"
        assert held.result(WAIT)[0] == 200
    assert _curl(sb, f"http://{name}/")[0] == 200  # no second question
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(_curl, other, f"http://{name}/")
        (again,) = _pending(gw, other.id)  # another sandbox is asked anew
        _decide(gw, again["id"], "deny")
        assert asked.result(WAIT)[0] == 403


def test_a_destroyed_sandboxs_grants_approvals_and_tokens_end(gw: RunningGateway) -> None:
    """However a sandbox goes (here the SDK in another process's place, not the gateway's
    route), the gateway ends what it held: the names granted to it alone, the approvals
    still waiting for a person (nobody is left to run what they would allow), its tokens."""
    hosts = _names("granted", "waiting")
    (granted, _), (waiting, _) = hosts.items()  # fmt: skip
    sb = _create(gw, hosts)
    token = issue(gw, sb.id)
    with gw.client(token) as c:  # the control: the token works while the sandbox lives
        assert c.get(f"/v1/sandboxes/{sb.id}").status_code == 200
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_curl, sb, f"http://{granted}/")
        (first,) = _pending(gw, sb.id)
        _decide(gw, first["id"], "approve", "sandbox")
        assert held.result(WAIT)[0] == 200
    db = sqlite3.connect(gw.home / "gateway.db")
    grants = "SELECT host FROM egress_grants WHERE scope = 'sandbox' AND owner = ?"
    assert db.execute(grants, (sb.id,)).fetchall() == [(granted,)]
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(_curl, sb, f"http://{waiting}/")  # ends with the sandbox, either way
    (second,) = _pending(gw, sb.id)
    sb.kill()
    pool.shutdown(wait=True)

    def ended() -> dict[str, Any] | None:
        with gw.operator() as op:
            mine = [a for a in op.get("/v1/approvals").json() if a["id"] == second["id"]]
        return mine[0] if mine and mine[0]["status"] != "pending" else None

    approval = _eventually(ended, "the destroyed sandbox's approval is still pending")
    assert (approval["status"], approval["decided_by"]) == ("expired", "sandbox-destroyed")
    assert db.execute(grants, (sb.id,)).fetchall() == []
    with gw.client(token) as c:
        assert c.get(f"/v1/sandboxes/{sb.id}").status_code == 401
    db.close()


def test_always_is_the_projects_allowlist_and_survives_a_gateway_restart(
    net: Internet, agentbox_home: Path, tmp_path: Path
) -> None:
    hosts = _names("kept")
    (name, _), = hosts.items()  # fmt: skip
    project = "ask-" + secrets.token_hex(3)
    made: list[Sandbox] = []
    try:
        with running_gateway(agentbox_home, tmp_path / "first") as first:
            made.append(_create(first, hosts, project))
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(_curl, made[0], f"http://{name}/")
                (approval,) = _pending(first, made[0].id)
                _decide(first, approval["id"], "approve", "always")
                assert held.result(WAIT)[0] == 200
        with running_gateway(agentbox_home, tmp_path / "second") as second:
            with second.operator() as op:
                listed = op.get("/v1/egress/allowlist", params={"project": project}).json()
            assert [(g["host"], g["decided_by"], g["approval"]) for g in listed] == [
                (name, "operator", approval["id"])
            ]
            assert name in _cli(second, "allowlist", "--project", project)
            made.append(_create(second, hosts, project))  # a new sandbox of the project
            for sb in made:
                code, body = _curl(sb, f"http://{name}/")
                assert code == 200 and body.startswith(f"hello from {name}"), body
            # Taken off the list, the name is asked about again.
            _cli(second, "forget", name, "--project", project)
            assert name not in _cli(second, "allowlist", "--project", project)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(_curl, made[1], f"http://{name}/")
                (again,) = _pending(second, made[1].id)
                _decide(second, again["id"], "deny")
                assert held.result(WAIT)[0] == 403
            with second.operator() as op:
                pending = op.get("/v1/approvals", params={"status": "pending"}).json()
            assert not [a for a in pending if a["sandbox"] in {m.id for m in made}]
    finally:
        for sb in made:
            sb.kill()


def test_a_running_daemon_files_where_the_gateway_serving_the_home_now_decides(
    gw: RunningGateway, make: Callable[..., Sandbox], net: Internet, postgres: PgServer,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The egress daemon outlives gateways. One started on another state database
    (PostgreSQL after SQLite, and back) publishes where approvals go, and the daemon
    already running files its next request there: it used to keep the table of the
    gateway it started under, so a person deciding through the new one never saw it."""
    hosts = _names("moved", "back")
    (moved, _), (back, _) = hosts.items()  # fmt: skip
    sb = make(hosts)
    assert _curl(sb, "http://listed.test/")[0] == 200  # the daemon runs, under gw (SQLite)
    url = postgres.new_database()
    migrate(url)
    try:
        with running_gateway(gw.home, tmp_path / "pg", state=url) as pg:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(_curl, sb, f"http://{moved}/")
                (approval,) = _pending(pg, sb.id)
                assert approval["summary"] == f"connect to {moved}:80"
                _decide(pg, approval["id"], "approve")
                assert held.result(WAIT)[0] == 200
        with gw.operator() as op:  # the SQLite table never heard of it
            listed = op.get("/v1/approvals").json()
        assert approval["id"] not in {a["id"] for a in listed}
        with running_gateway(gw.home, tmp_path / "sqlite") as again:  # back on SQLite
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(_curl, sb, f"http://{back}/")
                (approval,) = _pending(again, sb.id)
                assert approval["summary"] == f"connect to {back}:80"
                _decide(gw, approval["id"], "deny")  # one table: the home's gateway.db
                assert held.result(WAIT)[0] == 403
    finally:
        egressd.publish_state(gw.home, "sqlite")  # gw's own state, for the tests after


def test_ask_as_the_gateways_default_mode(
    net: Internet, agentbox_home: Path, tmp_path: Path
) -> None:
    """``sandbox.network.mode: ask`` in the gateway's config: a sandbox created without a
    network of its own asks, and goes through once a person approves."""
    hosts = _names("by-default")
    (name, address), = hosts.items()  # fmt: skip
    config = (f"sandbox:\n  template: default\n  network:\n    mode: ask\n"
              f"    hosts: {{{name}: {address}}}\n")  # fmt: skip
    with running_gateway(agentbox_home, tmp_path, extra_yaml=config) as gateway:
        with gateway.operator() as op:
            created = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "64MiB"})
        assert created.status_code == 201, created.text
        sb = Sandbox.connect(created.json()["id"], home=gateway.home)
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(_curl, sb, f"http://{name}/")
                (approval,) = _pending(gateway, sb.id)
                assert approval["tool"] == "egress" and name in approval["summary"]
                _decide(gateway, approval["id"], "approve")
                code, body = held.result(WAIT)
            assert code == 200 and body.startswith(f"hello from {name}"), body
        finally:
            sb.kill()


def test_the_sandbox_cannot_decide_its_own_request(
    gw: RunningGateway, make: Callable[..., Sandbox], net: Internet
) -> None:
    """A session token (what the agent holds) may not approve, in any scope; the sandbox
    itself cannot reach the gateway at all (its only peer is the proxy)."""
    hosts = _names("self")
    (name, _), = hosts.items()  # fmt: skip
    sb = make(hosts)
    with gw.operator() as op:
        token = op.post("/v1/tokens", json={"sandbox": sb.id}).json()["token"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_curl, sb, f"http://{name}/")
        (approval,) = _pending(gw, sb.id)
        with gw.client(token) as agent:
            for scope in ("once", "sandbox", "always"):
                r = agent.post(f"/v1/approvals/{approval['id']}/approve", params={"scope": scope})
                assert r.status_code == 403, r.text
            assert agent.get("/v1/egress/allowlist").status_code == 403
        assert _pending(gw, sb.id)[0]["status"] == "pending"
        _decide(gw, approval["id"], "deny")
        assert held.result(WAIT)[0] == 403


def test_held_and_decided_connections_are_counted(
    gw: RunningGateway, make: Callable[..., Sandbox]
) -> None:
    hosts = _names("counted")
    (name, _), = hosts.items()  # fmt: skip
    sb = make(hosts)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(_curl, sb, f"http://{name}/")
        (approval,) = _pending(gw, sb.id)
        _decide(gw, approval["id"], "approve")
        assert held.result(WAIT)[0] == 200
    wanted = ('outcome="held"', 'outcome="requested"', 'outcome="approved"')

    def counted() -> bool:
        with gw.operator() as op:
            text = op.get("/metrics").text
        lines = [line for line in text.splitlines()
                 if line.startswith("agentbox_egress_approvals_total")]  # fmt: skip
        return all(any(w in line for line in lines) for w in wanted)

    _eventually(counted, f"/metrics lacks agentbox_egress_approvals_total with {wanted}")


def test_an_mcp_client_is_asked_and_its_call_goes_on_after_the_decision(
    gw: RunningGateway, make: Callable[..., Sandbox], net: Internet
) -> None:
    """A current (2026-07-28) MCP client with the agent's session token: its
    ``terminal_run`` held by an egress question gets an input-required elicitation naming
    the name and approval; its user decides (here: the operator, in the callback), and the
    client's retry returns the result of the same command, which ran on meanwhile."""
    hosts = _names("mcp")
    (name, _), = hosts.items()  # fmt: skip
    sb = make(hosts)
    with gw.operator() as op:
        token = op.post("/v1/tokens", json={"sandbox": sb.id}).json()["token"]
    prompts: list[str] = []

    async def user_decides(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        prompts.append(params.message)
        (approval,) = await anyio.to_thread.run_sync(_pending, gw, sb.id)
        await anyio.to_thread.run_sync(_decide, gw, approval["id"], "approve")
        return types.ElicitResult(action="accept", content={"recheck": True})

    fetch = f"import urllib.request as u; print(u.urlopen('http://{name}/').read().decode())"

    async def main() -> Any:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=120) as http:  # fmt: skip
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=http),
                              elicitation_callback=user_decides) as client:  # fmt: skip
                return await client.call_tool("terminal_run", {"command": f'python3 -c "{fetch}"'})

    result = anyio.run(main)
    assert not result.is_error, result.content
    assert f"hello from {name}" in result.structured_content["stdout"]
    assert len(prompts) == 1 and name in prompts[0], prompts
    assert "agentbox approvals approve ap-" in prompts[0]
    assert net.seen().count(f"http 80 {name}") == 1  # one command, run once
