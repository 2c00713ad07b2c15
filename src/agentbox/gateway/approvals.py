"""Human approval of high-risk tool calls.

A call that matches an approval pattern creates a *pending* approval (persisted, so it
survives a gateway restart) and waits: plain HTTP callers block up to
``approval_timeout``; MCP clients of the 2026-07-28 revision get an input-required result
and retry. Only the operator decides (``agentbox approvals approve|deny`` or the REST
API); a session token never can. No answer before the deadline means *deny*.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from agentbox.errors import Conflict, NotFound
from agentbox.hints import Hint
from agentbox.state.db import Connection, Database
from agentbox.state.sqlite import database

Status = Literal["pending", "approved", "denied", "expired"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gateway_approvals (
    id TEXT PRIMARY KEY,
    sandbox TEXT NOT NULL,
    tool TEXT NOT NULL,
    summary TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    rule TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    deadline REAL NOT NULL,
    decided_at REAL,
    decided_by TEXT
);
"""


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

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


class ApprovalStore:
    """``where``: the SQLite file (``HOME/gateway.db``), or the shared database."""

    def __init__(self, where: Path | Database) -> None:
        self.db = database(where, _SCHEMA, synchronous="FULL")
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
        )
        self._db().execute(
            "INSERT INTO gateway_approvals VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            tuple(approval.__dict__.values()),
        )
        return approval

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
        approval = Approval(**dict(row))
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
        return [Approval(**dict(r)) for r in rows]

    def decide(self, approval_id: str, approve: bool, by: str) -> Approval:
        current = self.get(approval_id)
        if current.status != "pending":
            raise Conflict(f"approval {approval_id} is already {current.status}")
        self._set(approval_id, "approved" if approve else "denied", by)
        return self.get(approval_id)

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

    def _set(self, approval_id: str, status: Status, by: str) -> None:
        self._db().execute(
            "UPDATE gateway_approvals SET status = ?, decided_at = ?, decided_by = ?"
            " WHERE id = ? AND status = 'pending'",
            (status, time.time(), by, approval_id),
        )
        event = self._events.get(approval_id)
        if event is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(event.set)

    async def wait(self, approval_id: str, timeout: float | None = None) -> Approval:
        """Wait until decided, past its deadline (then expired: a denial), or ``timeout``."""
        self._loop = asyncio.get_running_loop()
        event = self._events.setdefault(approval_id, asyncio.Event())
        first = self.get(approval_id)
        end = first.deadline if timeout is None else min(first.deadline, time.time() + timeout)
        try:
            while True:
                approval = self.get(approval_id)
                left = end - time.time()
                if approval.status != "pending" or left <= 0:
                    return approval
                # Woken by decide(); the short cap also notices decisions made by another
                # process (or gateway replica) sharing the database.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(left, 0.5))
                event.clear()
        finally:
            self._events.pop(approval_id, None)
