"""Egress mode ``ask``: hold a connection to a new name until a person decides.

The egress daemon calls :class:`EgressAsk` (the proxy's ``ask`` hook, see
:func:`agentbox.network.decision.decide`) for a name on neither the allow nor the deny
list of a sandbox in mode ``ask``, after the port is checked and before the name is
resolved. It answers at once when a standing grant exists (a decision with scope
``sandbox`` or ``always``); otherwise it files one approval for (sandbox, name) in the
gateway's approval table (:mod:`agentbox.policy.approvals`, the same one that holds
high-risk commands: one queue for the console, ``agentbox approvals`` and MCP) and every
connection to that name waits on that one approval, up to the sandbox's
``ask_timeout``. No decision by then is a denial, so no connection hangs longer.

The round trip is the state database of the home (``gateway.db``): the daemon writes
the request, the gateway's operator routes write the decision, the daemon reads it. A
sandbox reaches neither: its only peer is the proxy, and deciding takes the operator's
token, never a session token. What happened is appended to the daemon's audit log
(``egress_held`` per held connection, ``egress_approval_requested`` (or
``egress_approval_rejoined``: an open one filed before a daemon restart) and
``egress_approval_decided`` per approval, with who decided) and counted by the
gateway's metrics through the egress ingest.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agentbox.network.decision import Conn, Denied, EgressPolicy
from agentbox.policy.approvals import EGRESS_TOOL, Approval, ApprovalStore

log = logging.getLogger("agentbox.egress")

# Distinct names one sandbox may have waiting at once: a sandbox cannot flood the
# person's queue (further names are denied at once, and say why).
MAX_PENDING_PER_SANDBOX = 16
RULE = "network.mode: ask"
_KIND_WORDS = {"connect": "CONNECT", "http": "proxy request", "transparent": "direct connection"}
# (decision, sandbox id, extra fields) -> appended to the egress audit log
Note = Callable[[str, str, Mapping[str, Any]], None]


def request_hash(host: str) -> str:
    """What identifies an egress request in the approval table: the name alone (every
    port of the policy's list is covered by one decision)."""
    return "sha256:" + hashlib.sha256(f"egress\0{host}".encode()).hexdigest()


class EgressAsk:
    def __init__(
        self,
        approvals: Callable[[], ApprovalStore],
        note: Note,
        max_pending: int = MAX_PENDING_PER_SANDBOX,
    ) -> None:
        # the table of the gateway serving the home now (see daemon.ServingApprovals)
        self.approvals = approvals
        self._note = note
        self.max_pending = max_pending
        # (sandbox, name) -> the one wait every held connection to that name shares
        self._waits: dict[tuple[str, str], asyncio.Task[Approval]] = {}

    async def __call__(self, policy: EgressPolicy, name: str, port: int, conn: Conn) -> str:
        sandbox = policy.sandbox_id
        store = await asyncio.to_thread(self.approvals)  # reads a file: off the loop
        grant = await asyncio.to_thread(store.egress_grant, sandbox, policy.project, name)
        if grant is not None:
            where = "for this sandbox" if grant.scope == "sandbox" else "always"
            return f"{name} approved {where} by {grant.decided_by} ({grant.approval})"
        key = (sandbox, name)
        task = self._waits.get(key)
        if task is None:
            if sum(1 for s, _ in self._waits if s == sandbox) >= self.max_pending:
                raise Denied(
                    f"{name}: {self.max_pending} names already wait for a person's decision "
                    "for this sandbox; retry once they are decided",
                    429,
                )
            task = asyncio.create_task(self._ask(policy, name, port, conn.kind))
            self._waits[key] = task
            task.add_done_callback(lambda t: self._forget(key, t))
        self._note("egress_held", sandbox, {"host": name, "port": port, "kind": conn.kind})
        # Shielded: one connection going away (or being cancelled) leaves the others waiting.
        approval = await asyncio.shield(task)
        if approval.status == "approved":
            scope, by = approval.scope or "once", approval.decided_by
            return f"{name} approved {scope} by {by} ({approval.id})"
        if approval.status == "expired":
            raise Denied(
                f"{name} is not on this sandbox's allowlist and nobody approved it within "
                f"{policy.ask_timeout:g} s ({approval.id}); retry when a person can answer "
                "(the agentbox console or `agentbox approvals`)"
            )
        raise Denied(f"{name} was denied by {approval.decided_by} ({approval.id})")

    def _forget(self, key: tuple[str, str], task: asyncio.Task[Approval]) -> None:
        if self._waits.get(key) is task:
            del self._waits[key]

    async def _ask(self, policy: EgressPolicy, name: str, port: int, kind: str) -> Approval:
        store = await asyncio.to_thread(self.approvals)  # filed and waited for in one table
        approval = await asyncio.to_thread(self._file, store, policy, name, port, kind)
        approval = await store.wait(approval.id)
        if approval.status == "pending":  # woke at the deadline: record the expiry
            approval = await asyncio.to_thread(store.get, approval.id)
        self._note(
            "egress_approval_decided",
            policy.sandbox_id,
            {
                "host": name,
                "approval": approval.id,
                "outcome": approval.status,
                "scope": approval.scope,
                "by": approval.decided_by,
            },
        )
        return approval

    def _file(
        self, store: ApprovalStore, policy: EgressPolicy, name: str, port: int, kind: str
    ) -> Approval:
        """The pending approval for this name: one left by an earlier daemon, or a new one."""
        digest = request_hash(name)
        found = store.find_pending(policy.sandbox_id, EGRESS_TOOL, digest)
        if found is not None:
            self._note(
                "egress_approval_rejoined",
                policy.sandbox_id,
                {"host": name, "port": port, "approval": found.id, "kind": kind},
            )
            return found
        approval = store.request(
            policy.sandbox_id,
            EGRESS_TOOL,
            f"connect to {name}:{port}",
            digest,
            f"sandbox {policy.sandbox_id} (project {policy.project}), "
            f"{_KIND_WORDS.get(kind, kind)}",
            RULE,
            policy.ask_timeout,
            detail={"host": name, "port": port, "project": policy.project, "kind": kind},
        )
        self._note(
            "egress_approval_requested",
            policy.sandbox_id,
            {"host": name, "port": port, "approval": approval.id, "kind": kind},
        )
        return approval

    def close(self) -> None:
        """Stop waiting (the daemon is exiting); the held connections are cancelled too."""
        for task in list(self._waits.values()):
            task.cancel()
