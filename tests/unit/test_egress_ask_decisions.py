"""Egress mode ask, its decision logic on a real approval database (no network).

The end-to-end behaviour (real sandboxes, the egress daemon, a gateway, curl) is in
tests/security/test_egress_ask.py; this file pins the rules: one approval per name however
many connections wait, each scope's reach, the deadline, the per-sandbox cap, and that
nothing is resolved before a person said yes.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentbox.egressd.ask import EgressAsk, request_hash
from agentbox.errors import Conflict, InvalidRequest
from agentbox.network.decision import Conn, Denied, EgressPolicy, decide
from agentbox.policy.approvals import ApprovalStore

Steps = list[tuple[str, str, dict[str, Any]]]


def _policy(sandbox: str = "sb-1", project: str = "p", timeout: float = 30.0) -> EgressPolicy:
    return EgressPolicy(
        sandbox_id=sandbox,
        mode="ask",
        allow=("listed.test",),
        deny=("blocked.test",),
        hosts={"new.test": "203.0.113.10", "listed.test": "203.0.113.10"},
        ask_timeout=timeout,
        project=project,
    )


def _asker(store: ApprovalStore, steps: Steps, **kw: Any) -> EgressAsk:
    def note(decision: str, sandbox: str, extra: Mapping[str, Any]) -> None:
        steps.append((decision, sandbox, dict(extra)))

    return EgressAsk(lambda: store, note, **kw)


async def _resolve_never(name: str, port: int) -> tuple[Any, ...]:
    raise AssertionError(f"{name} was resolved before anyone approved it")


async def _until_pending(store: ApprovalStore, count: int = 1) -> list[Any]:
    for _ in range(2000):  # bounded: the asks file their request in a worker thread
        pending = store.list("pending")
        if len(pending) >= count:
            return pending
        await asyncio.sleep(0.005)
    raise AssertionError("no approval was requested")


async def _until_held(steps: Steps, count: int) -> None:
    for _ in range(2000):
        if sum(1 for s in steps if s[0] == "egress_held") >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"fewer than {count} connections were held")


def _conn() -> Conn:
    return Conn(kind="connect", started=0.0, can_respond=True)


def test_many_connections_to_one_name_wait_on_one_approval(tmp_path: Path) -> None:
    store, steps = ApprovalStore(tmp_path / "g.db"), Steps()
    ask = _asker(store, steps)

    async def main() -> list[str]:
        held = [asyncio.create_task(ask(_policy(), "new.test", 80, _conn())) for _ in range(20)]
        await _until_held(steps, 20)  # all of them wait now, on one approval
        (approval,) = await _until_pending(store)
        assert approval.tool == "egress" and approval.summary == "connect to new.test:80"
        assert "sandbox sb-1 (project p)" in approval.requested_by
        assert approval.detail == {"host": "new.test", "port": 80, "project": "p",
                                   "kind": "connect"}  # fmt: skip
        store.decide(approval.id, True, "alice")
        return await asyncio.gather(*held)

    whys = asyncio.run(main())
    assert len(whys) == 20 and all("approved once by alice" in w for w in whys)
    assert [s[0] for s in steps].count("egress_held") == 20
    assert [s[0] for s in steps].count("egress_approval_requested") == 1
    decided = [s for s in steps if s[0] == "egress_approval_decided"]
    assert decided == [
        (
            "egress_approval_decided",
            "sb-1",
            {"host": "new.test", "approval": decided[0][2]["approval"], "outcome": "approved",
             "scope": "once", "by": "alice"},
        )
    ]  # fmt: skip


def test_once_reaches_only_the_held_connections(tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path / "g.db")
    ask = _asker(store, [])

    async def main() -> None:
        first = asyncio.create_task(ask(_policy(), "new.test", 80, _conn()))
        (a,) = await _until_pending(store)
        store.decide(a.id, True, "alice", "once")
        await first
        again = asyncio.create_task(ask(_policy(), "new.test", 80, _conn()))
        (b,) = await _until_pending(store)
        assert b.id != a.id  # asked again
        store.decide(b.id, False, "bob")
        with pytest.raises(Denied, match="denied by bob"):
            await again

    asyncio.run(main())


@pytest.mark.parametrize("scope", ["sandbox", "always"])
def test_sandbox_and_always_grants_answer_later_connections(tmp_path: Path, scope: Any) -> None:
    store = ApprovalStore(tmp_path / "g.db")
    ask = _asker(store, [])

    async def main() -> None:
        first = asyncio.create_task(ask(_policy(), "new.test", 443, _conn()))
        (a,) = await _until_pending(store)
        assert store.decide(a.id, True, "alice", scope).scope == scope
        await first
        # The same sandbox: no new approval. Another sandbox of the project: only "always".
        why = await ask(_policy(), "new.test", 80, _conn())
        assert f"by alice ({a.id})" in why
        other = asyncio.create_task(ask(_policy("sb-2"), "new.test", 80, _conn()))
        if scope == "always":
            assert "approved always" in await other
        else:
            (b,) = await _until_pending(store)
            assert b.sandbox == "sb-2"
            store.decide(b.id, False, "alice")
            with pytest.raises(Denied):
                await other
        # Another project never inherits it.
        elsewhere = asyncio.create_task(ask(_policy("sb-3", "q"), "new.test", 80, _conn()))
        pending = await _until_pending(store)
        assert [p.sandbox for p in pending] == ["sb-3"]
        store.decide(pending[0].id, False, "alice")
        with pytest.raises(Denied):
            await elsewhere

    asyncio.run(main())
    # "always" is the project's allowlist, in the database: a new store (a restarted
    # gateway or daemon) sees it.
    listed = ApprovalStore(tmp_path / "g.db").egress_allowlist("p")
    assert [(g.host, g.decided_by) for g in listed] == (
        [("new.test", "alice")] if scope == "always" else []
    )


def test_no_decision_by_the_deadline_denies(tmp_path: Path) -> None:
    store, steps = ApprovalStore(tmp_path / "g.db"), Steps()
    ask = _asker(store, steps)
    with pytest.raises(Denied, match=r"nobody approved it within 0\.3 s"):
        asyncio.run(ask(_policy(timeout=0.3), "new.test", 80, _conn()))
    (approval,) = store.list()
    assert approval.status == "expired" and approval.decided_by == "timeout"
    assert steps[-1][2]["outcome"] == "expired"


def test_a_sandbox_cannot_flood_the_queue(tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path / "g.db")
    ask = _asker(store, [], max_pending=3)

    async def main() -> None:
        held = [asyncio.create_task(ask(_policy(), f"n{i}.test", 80, _conn())) for i in range(3)]
        await _until_pending(store, 3)
        with pytest.raises(Denied, match="3 names already wait") as refused:
            await ask(_policy(), "n9.test", 80, _conn())
        assert refused.value.status == 429
        other = asyncio.create_task(ask(_policy("sb-2"), "n9.test", 80, _conn()))
        pending = await _until_pending(store, 4)  # another sandbox has its own budget
        for p in pending:
            store.decide(p.id, False, "alice")
        for task in [*held, other]:
            with pytest.raises(Denied):
                await task

    asyncio.run(main())


def test_a_restarted_daemon_waits_on_the_pending_approval(tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path / "g.db")
    left = store.request("sb-1", "egress", "connect to new.test:80", request_hash("new.test"),
                         "earlier daemon", "network.mode: ask", 30,
                         detail={"host": "new.test", "port": 80, "project": "p"})  # fmt: skip
    steps: Steps = []
    ask = _asker(ApprovalStore(tmp_path / "g.db"), steps)

    async def main() -> str:
        held = asyncio.create_task(ask(_policy(), "new.test", 80, _conn()))
        for _ in range(2000):  # bounded: the ask files (here: finds) its request in a thread
            if any(s[0] == "egress_approval_rejoined" for s in steps):
                break
            await asyncio.sleep(0.005)
        assert [s[2]["approval"] for s in steps if s[0] == "egress_approval_rejoined"] == [left.id]
        assert [p.id for p in store.list("pending")] == [left.id]
        store.decide(left.id, True, "alice")
        return await held

    assert left.id in asyncio.run(main())


def test_scopes_are_for_egress_approvals_and_decided_once(tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path / "g.db")
    command = store.request("sb-1", "terminal_run", "rm -rf x", "sha256:" + "0" * 64, "t", None, 60)
    with pytest.raises(InvalidRequest, match="only be decided once"):
        store.decide(command.id, True, "alice", "always")
    with pytest.raises(InvalidRequest, match="scope must be"):
        store.decide(command.id, True, "alice", "forever")  # type: ignore[arg-type]
    assert store.get(command.id).status == "pending"
    assert store.decide(command.id, True, "alice").scope == "once"
    with pytest.raises(Conflict):
        store.decide(command.id, False, "alice")


def test_decide_asks_only_for_unlisted_names_on_allowed_ports(tmp_path: Path) -> None:
    asked: list[tuple[str, int]] = []

    async def ask(policy: EgressPolicy, name: str, port: int, conn: Conn) -> str:
        asked.append((name, port))
        return "approved in a test"

    async def run(raw: str, port: int, resolve: Any = _resolve_never) -> Any:
        return await decide(_policy(), raw, port, _conn(), resolve, (), ask)

    with pytest.raises(Denied, match="deny pattern"):
        asyncio.run(run("blocked.test", 80))
    with pytest.raises(Denied, match="port 22"):
        asyncio.run(run("new.test", 22))
    with pytest.raises(Denied, match="IP literal"):
        asyncio.run(run("203.0.113.10", 80))
    assert asked == []  # refused before anyone is bothered
    target = asyncio.run(run("listed.test", 80))
    assert target.why == "listed.test matches listed.test" and asked == []
    target = asyncio.run(run("new.test", 443))
    assert target.why == "approved in a test" and asked == [("new.test", 443)]
    assert target.addresses == (ipaddress.ip_address("203.0.113.10"),)
    # No asker (a proxy built without one): mode ask denies what it cannot ask about.
    with pytest.raises(Denied, match="nobody can be asked"):
        asyncio.run(decide(_policy(), "new.test", 80, _conn(), _resolve_never))


def test_nothing_is_resolved_before_the_decision(tmp_path: Path) -> None:
    """The proxy resolves names (there is no DNS inside a sandbox): a name nobody
    approved is never looked up, so asking cannot leak it to a resolver."""
    store = ApprovalStore(tmp_path / "g.db")
    policy = EgressPolicy(sandbox_id="sb-1", mode="ask", project="p", ask_timeout=30)
    order: list[str] = []

    async def resolve(name: str, port: int) -> tuple[Any, ...]:
        order.append("resolved")
        return (ipaddress.ip_address("203.0.113.10"),)

    async def main() -> None:
        ask = _asker(store, [])
        held = asyncio.create_task(decide(policy, "fresh.test", 80, _conn(), resolve, (), ask))
        (a,) = await _until_pending(store)
        assert order == []
        order.append("denied")
        store.decide(a.id, False, "alice")
        with pytest.raises(Denied):
            await held

    asyncio.run(main())
    assert order == ["denied"]


def test_mode_ask_in_the_spec_and_the_gateway_config() -> None:
    from agentbox.config.settings import NetworkSettings
    from agentbox.config.specs import NetworkSpec

    spec = NetworkSpec.model_validate({"mode": "ask", "ask_timeout": "2m"})
    assert (spec.mode, spec.ask_timeout) == ("ask", 120.0)
    assert NetworkSpec.model_validate("ask").ask_timeout == 60.0
    configured = NetworkSettings.model_validate({"mode": "ask", "ask_timeout": "90s"})
    assert NetworkSpec.model_validate(configured.model_dump()).ask_timeout == 90.0
    with pytest.raises(InvalidRequest, match="ask_timeout must be positive"):
        NetworkSpec.model_validate({"mode": "ask", "ask_timeout": 0})


def test_a_held_mcp_call_is_resumed_only_by_its_own_caller(tmp_path: Path) -> None:
    """gateway/egress_elicit.py: while an egress question of the sandbox is open the call
    is handed back as Waiting (it runs on); only the same (token, tool, sandbox) may
    attach to it again, once."""
    from agentbox.gateway.egress_elicit import HeldCalls, Waiting

    store = ApprovalStore(tmp_path / "g.db")
    calls = HeldCalls(store, runtime=None)  # type: ignore[arg-type]  # applies() unused here
    owner = ("token:t1", "terminal_run", "sb-1")

    async def main() -> None:
        finish = asyncio.Event()
        runs: list[int] = []

        async def start() -> str:
            runs.append(1)
            await finish.wait()
            return "the command's result"

        question = store.request("sb-1", "egress", "connect to new.test:80", "sha256:" + "3" * 64,
                                 "sandbox sb-1", "network.mode: ask", 30)  # fmt: skip
        waiting = await calls.run(owner, None, start)
        assert isinstance(waiting, Waiting) and [q.id for q in waiting.questions] == [question.id]
        assert question.id in waiting.message("terminal_run")
        for stranger in (("token:t2", "terminal_run", "sb-1"), ("token:t1", "fs_read", "sb-1")):
            with pytest.raises(Conflict):
                await calls.run(stranger, waiting.key, start)
        again = await calls.run(owner, waiting.key, start)  # still open: asked again
        assert isinstance(again, Waiting) and again.key != waiting.key
        store.decide(question.id, True, "alice")
        finish.set()
        assert await calls.run(owner, again.key, start) == "the command's result"
        assert runs == [1]  # one command, attached to twice
        with pytest.raises(Conflict):
            await calls.run(owner, again.key, start)  # a key serves once

    asyncio.run(main())
