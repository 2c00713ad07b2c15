"""Tokens (hashed, scoped, expiring, revocable), the rate limiter, approvals storage.
The stores' tests run on SQLite and on PostgreSQL (``state``, see tests/pgkit.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from agentbox.errors import Conflict, HostUnsupported, RateLimited, Unauthenticated
from agentbox.gateway.auth import RateLimiter, TokenStore, load_operator_token
from agentbox.policy.approvals import ApprovalStore
from pgkit import StateKit

OPERATOR = "operator-token-0123456789abcdef"


def test_tokens_are_stored_only_as_hashes(state: StateKit) -> None:
    store = TokenStore(state.where("g"), OPERATOR, default_ttl=60)
    token, info = store.issue("sb-1", tools=["fs_read"])
    dump = repr([tuple(r) for r in store.db.conn().execute("SELECT * FROM gateway_tokens")])
    assert token not in dump and info.id in dump
    p = store.authenticate(token)
    assert (p.kind, p.sandbox_id, p.tools) == ("session", "sb-1", frozenset({"fs_read"}))
    assert store.authenticate(OPERATOR).is_operator


def test_expiry_revocation_and_unknown(state: StateKit) -> None:
    store = TokenStore(state.where("g"), OPERATOR, default_ttl=60)
    short, _ = store.issue("sb-1", ttl=1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            store.authenticate(short)
        except Unauthenticated as e:
            assert "expired" in e.message
            break
        time.sleep(0.05)
    else:
        raise AssertionError("a 1-second token never expired")
    token, _ = store.issue("sb-2")
    other = TokenStore(state.where("g"), OPERATOR, default_ttl=60)  # another replica
    assert other.authenticate(token).sandbox_id == "sb-2"
    assert store.revoke_sandbox("sb-2") == 1
    with pytest.raises(Unauthenticated, match="revoked"):
        other.authenticate(token)
    kept, kept_info = store.issue("sb-3", tools=["terminal_run", "fs_read"])
    assert store.revoke(kept_info.id) and not store.revoke(kept_info.id)  # once
    with pytest.raises(Unauthenticated, match="revoked"):
        store.authenticate(kept)
    listed = {t.id: t for t in other.list()}
    assert listed[kept_info.id].tools == ["fs_read", "terminal_run"]
    assert listed[kept_info.id].revoked_at is not None
    assert [t.sandbox for t in other.list("sb-3")] == ["sb-3"]
    for bad in ("", "abx_nope", OPERATOR + "x"):
        with pytest.raises(Unauthenticated):
            store.authenticate(bad or None)


def test_operator_token_injection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OP_TOKEN", OPERATOR)
    assert load_operator_token("OP_TOKEN", None) == OPERATOR
    file = tmp_path / "token"
    file.write_text(OPERATOR + "\n")
    assert load_operator_token(None, file) == OPERATOR
    monkeypatch.setenv("OP_TOKEN", "short")
    with pytest.raises(HostUnsupported, match="too short"):
        load_operator_token("OP_TOKEN", None)
    monkeypatch.delenv("OP_TOKEN")
    with pytest.raises(HostUnsupported, match="no operator token"):
        load_operator_token("OP_TOKEN", None)


def test_rate_limiter_refuses_with_retry_after() -> None:
    limiter = RateLimiter(per_minute=3)
    for _ in range(3):
        limiter.check("token-a")
    with pytest.raises(RateLimited) as err:
        limiter.check("token-a")
    assert err.value.details["retry_after"] > 0
    limiter.check("token-b")  # buckets are per token


def test_approvals_persist_decide_once_and_expire(state: StateKit) -> None:
    store = ApprovalStore(state.where("g"))
    a = store.request("sb-1", "terminal_run", "rm -rf x", "sha256:" + "0" * 64, "token:t", None, 60)
    again = ApprovalStore(state.where("g"))  # a restart (or another replica) sees it
    assert [p.id for p in again.list("pending")] == [a.id]
    assert again.decide(a.id, True, "operator").status == "approved"
    with pytest.raises(Conflict):
        again.decide(a.id, False, "operator")
    late = store.request("sb-1", "terminal_run", "rm -rf y", "sha256:" + "1" * 64, "t", None, 0.2)
    assert asyncio.run(store.wait(late.id)).status == "expired"


def test_egress_grants_are_decided_in_one_transaction(state: StateKit) -> None:
    """Egress approvals (mode ask): a decision's scope and its standing grant are written
    together, on SQLite and PostgreSQL alike."""
    store = ApprovalStore(state.where("g"))
    detail = {"host": "pkg.test", "port": 443, "project": "p1", "kind": "connect"}
    a = store.request("sb-1", "egress", "pkg.test:443", "h1", "egressd", None, 60, detail)
    b = store.request("sb-2", "egress", "pkg.test:443", "h2", "egressd", None, 60, detail)
    assert store.decide(a.id, True, "operator", "always").scope == "always"
    assert store.decide(b.id, True, "operator", "sandbox").scope == "sandbox"
    again = ApprovalStore(state.where("g"))  # a restart sees both grants
    assert [g.host for g in again.egress_allowlist("p1")] == ["pkg.test"]
    found = again.egress_grant("sb-9", "p1", "pkg.test")
    assert found is not None and found.scope == "always"
    found = again.egress_grant("sb-2", "other", "pkg.test")
    assert found is not None and found.scope == "sandbox"
    assert again.egress_revoke("p1", "pkg.test") and again.egress_allowlist("p1") == ()
    with pytest.raises(Conflict):
        again.decide(a.id, False, "operator")


def test_waiters_wake_on_decision(state: StateKit) -> None:
    store = ApprovalStore(state.where("g"))
    a = store.request("sb-1", "terminal_run", "x", "sha256:" + "2" * 64, "t", None, 60)

    async def main() -> str:
        waiter = asyncio.create_task(store.wait(a.id))
        await asyncio.sleep(0)  # let the waiter register
        store.decide(a.id, False, "operator")
        return (await asyncio.wait_for(waiter, 5)).status

    assert asyncio.run(main()) == "denied"
