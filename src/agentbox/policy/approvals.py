"""Human approval of high-risk tool calls and of new egress names.

A call that matches an approval pattern creates a *pending* approval (persisted, so it
survives a gateway restart) and waits: plain HTTP callers block up to
``approval_timeout``; MCP clients of the 2026-07-28 revision get an input-required result
and retry. Only the operator decides (``agentbox approvals approve|deny`` or the REST
API); a session token never can. No answer before the deadline means *deny*.

The egress daemon of a sandbox in network mode ``ask`` asks through the same table (tool
``egress``; it opens this database itself, see :mod:`agentbox.egressd.ask`). An
egress approval is decided with a *scope*: ``once`` (the connections held now),
``sandbox`` (this name for the rest of the sandbox's life) or ``always`` (the project's
persistent allowlist, :mod:`agentbox.policy.egress_grants`), written in the same
transaction as the decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from agentbox.errors import Conflict, InvalidRequest, NotFound, StateUnavailable
from agentbox.hints import Hint
from agentbox.policy import egress_grants
from agentbox.state.db import Connection, Database
from agentbox.state.sqlite import database
from agentbox.state.tables import EGRESS_GRANTS, GATEWAY_APPROVALS

Status = Literal["pending", "approved", "denied", "expired"]
Scope = Literal["once", "sandbox", "always"]
EGRESS_TOOL = "egress"

_INSERT = (
    "INSERT INTO gateway_approvals (id, sandbox, tool, summary, args_hash, requested_by, rule,"
    " status, created_at, deadline, decided_at, decided_by, scope, detail, used_at)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


@dataclass(frozen=True)
class Approval:
    id: str
    sandbox: str
    tool: str
    summary: str
    args_hash: str
    requested_by: str
    rule: str | None
    status: Status
    created_at: float
    deadline: float
    decided_at: float | None
    decided_by: str | None
    scope: Scope | None = None  # how far an approval reaches (egress); None: undecided
    detail: dict[str, Any] | None = None  # egress: host, port, project, kind
    used_at: float | None = None  # when the call it approved ran (an approval runs once)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)

    @staticmethod
    def from_row(row: Any) -> Approval:
        values = dict(row)
        values["detail"] = json.loads(values["detail"]) if values.get("detail") else None
        return Approval(**values)


class ApprovalStore:
    """``where``: the SQLite file (``HOME/gateway.db``), or the shared database (whose
    schema ``agentbox db migrate`` made)."""

    def __init__(self, where: Path | Database) -> None:
        self.db = database(where, (GATEWAY_APPROVALS, EGRESS_GRANTS), synchronous="FULL")
        self._events: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def _db(self) -> Connection:
        return self.db.conn()

    def request(
        self,
        sandbox: str,
        tool: str,
        summary: str,
        args_hash: str,
        requested_by: str,
        rule: str | None,
        timeout: float,
        detail: dict[str, Any] | None = None,
    ) -> Approval:
        now = time.time()
        approval = Approval(
            "ap-" + secrets.token_hex(6),
            sandbox,
            tool,
            summary,
            args_hash,
            requested_by,
            rule,
            "pending",
            now,
            now + timeout,
            None,
            None,
            None,
            detail,
        )
        values = {**approval.__dict__, "detail": json.dumps(detail) if detail else None}
        self._db().execute(_INSERT, tuple(values.values()))
        return approval

    def find_pending(self, sandbox: str, tool: str, args_hash: str) -> Approval | None:
        """The pending approval of this exact request, if one waits (asked again after the
        asker restarted: the person sees one request, not two)."""
        self.expire_overdue()
        row = (
            self._db()
            .execute(
                "SELECT * FROM gateway_approvals WHERE sandbox = ? AND tool = ? AND"
                " args_hash = ? AND status = 'pending' ORDER BY created_at LIMIT 1",
                (sandbox, tool, args_hash),
            )
            .fetchone()
        )
        return None if row is None else Approval.from_row(row)

    def get(self, approval_id: str) -> Approval:
        row = (
            self._db()
            .execute("SELECT * FROM gateway_approvals WHERE id = ?", (approval_id,))
            .fetchone()
        )
        if row is None:
            raise NotFound(
                f"no approval {approval_id}",
                hint=Hint("approval_list", {}, "{call} to list them"),
            )
        approval = Approval.from_row(row)
        if approval.status == "pending" and approval.deadline <= time.time():
            self._set(approval.id, "expired", "timeout")
            return self.get(approval_id)
        return approval

    def list(self, status: Status | None = None) -> list[Approval]:
        self.expire_overdue()
        query, args = "SELECT * FROM gateway_approvals", cast(tuple[str, ...], ())
        if status:
            query, args = query + " WHERE status = ?", (status,)
        rows = self._db().execute(query + " ORDER BY created_at", args).fetchall()
        return [Approval.from_row(r) for r in rows]

    def decide(self, approval_id: str, approve: bool, by: str, scope: Scope = "once") -> Approval:
        """Approve or deny; ``scope`` (egress approvals only) ``sandbox`` or ``always``
        also grants the name beyond the connections held now."""
        if scope not in get_args(Scope):
            raise InvalidRequest(f"scope must be once, sandbox or always, not {scope!r}")
        current = self.get(approval_id)
        if current.status != "pending":
            raise Conflict(f"approval {approval_id} is already {current.status}")
        if scope != "once" and current.tool != EGRESS_TOOL:
            raise InvalidRequest(
                f"approval {approval_id} is for a command: it can only be decided once"
            )
        with self.db.tx("approvals") as db:
            changed = self._set(
                approval_id, "approved" if approve else "denied", by, scope if approve else None,
                db=db,
            )  # fmt: skip
            if not changed:
                raise Conflict(f"approval {approval_id} was decided meanwhile")
            if approve and scope != "once" and current.detail:
                owner = current.sandbox if scope == "sandbox" else current.detail["project"]
                egress_grants.grant(
                    db, scope, owner, current.detail["host"], approval_id, by, time.time()
                )
        self._wake(approval_id)
        return self.get(approval_id)

    def consume(self, approval_id: str) -> bool:
        """Mark an approved approval used; False when it was used already. An approval
        lets one call run once: returned state replayed for the same call asks anew."""
        cursor = self._db().execute(
            "UPDATE gateway_approvals SET used_at = ? WHERE id = ? AND status = 'approved'"
            " AND used_at IS NULL",
            (time.time(), approval_id),
        )
        return cursor.rowcount == 1

    def egress_grant(self, sandbox: str, project: str, host: str) -> egress_grants.Grant | None:
        """The standing approval of ``host`` for this sandbox or its project, if any."""
        return egress_grants.find(self._db(), sandbox, project, host)

    def egress_allowlist(self, project: str | None = None) -> tuple[egress_grants.Grant, ...]:
        return tuple(egress_grants.listing(self._db(), project))

    def egress_revoke(self, project: str, host: str) -> bool:
        return egress_grants.revoke(self._db(), project, host)

    def forget_sandbox(self, sandbox: str) -> tuple[int, int]:
        """``sandbox`` is gone: its pending approvals end (``expired``, by
        ``sandbox-destroyed``: nobody is left to run what they would allow) and its
        sandbox-scope egress grants go. (approvals ended, grants removed)"""
        pending = (
            self._db()
            .execute(
                "SELECT id FROM gateway_approvals WHERE status = 'pending' AND sandbox = ?",
                (sandbox,),
            )
            .fetchall()
        )
        ended = sum(self._set(approval_id, "expired", "sandbox-destroyed")
                    for (approval_id,) in pending)  # fmt: skip
        return ended, egress_grants.forget_sandbox(self._db(), sandbox)

    def expire_overdue(self) -> None:
        now = time.time()
        rows = (
            self._db()
            .execute(
                "SELECT id FROM gateway_approvals WHERE status = 'pending' AND deadline <= ?",
                (now,),
            )
            .fetchall()
        )
        for (approval_id,) in rows:
            self._set(approval_id, "expired", "timeout")

    def _set(
        self,
        approval_id: str,
        status: Status,
        by: str,
        scope: Scope | None = None,
        db: Connection | None = None,
    ) -> int:
        """Decide a pending approval; the rows changed (0: decided meanwhile). Inside the
        caller's transaction (``db``) the caller wakes the waiters once it has committed."""
        cursor = (db or self._db()).execute(
            "UPDATE gateway_approvals SET status = ?, decided_at = ?, decided_by = ?, scope = ?"
            " WHERE id = ? AND status = 'pending'",
            (status, time.time(), by, scope, approval_id),
        )
        if db is None:
            self._wake(approval_id)
        return cursor.rowcount

    def _wake(self, approval_id: str) -> None:
        event = self._events.get(approval_id)
        if event is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(event.set)

    async def wait(self, approval_id: str, timeout: float | None = None) -> Approval:
        """Wait until decided, past its deadline (then expired: a denial), or ``timeout``.
        Reads run off the event loop (PostgreSQL: a round trip, or a connect timeout while
        the server is away), and a read that finds the database away mid-wait is asked
        again at the next tick: a restart does not end a person's decision early."""
        self._loop = asyncio.get_running_loop()
        event = self._events.setdefault(approval_id, asyncio.Event())
        first = await asyncio.to_thread(self.get, approval_id)
        end = first.deadline if timeout is None else min(first.deadline, time.time() + timeout)
        try:
            while True:
                left = end - time.time()
                try:
                    approval: Approval | None = await asyncio.to_thread(self.get, approval_id)
                except StateUnavailable:
                    if left <= 0:
                        raise
                    approval = None
                if approval is not None and (approval.status != "pending" or left <= 0):
                    return approval
                # Woken by decide(); the short cap also notices decisions made by another
                # process sharing the database.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(left, 0.5))
                event.clear()
        finally:
            self._events.pop(approval_id, None)
