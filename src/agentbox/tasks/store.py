"""Batch tasks in SQLite (``$AGENTBOX_HOME/tasks.db``) or the shared PostgreSQL database:
the queue, each task's steps and its accounting, shared by every process using them.

A task is ``queued`` → ``running`` (leased by a worker, which renews the lease) →
``succeeded`` | ``failed`` | ``cancelled``. A step is appended in the same transaction
that updates the task's counters, so a crash leaves either both or neither: a task whose
lease ran out (its gateway died) is queued again and resumes after its last step.
"""

from __future__ import annotations

import builtins
import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentbox.errors import Conflict, NotFound
from agentbox.hints import Hint
from agentbox.state.db import Database
from agentbox.state.sqlite import database
from agentbox.state.tables import TASK_STEPS, TASKS

FINAL_STATES = ("succeeded", "failed", "cancelled")
# Failure categories: why a task ended without succeeding.
FAILURES = ("provider", "budget", "max_steps", "bad_model_output", "sandbox", "cancelled", "error")


@dataclass
class Task:
    id: str
    project: str
    template: str
    goal: str
    state: str
    max_steps: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    sandbox: str | None
    worker: str | None
    lease_until: float | None
    cancel_requested: int
    steps: int
    tool_calls: int
    tool_errors: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    attempts: int
    failure: str | None
    result: str | None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cancel_requested"] = bool(self.cancel_requested)
        data["duration_s"] = (
            None
            if self.started_at is None
            else round((self.finished_at or time.time()) - self.started_at, 3)
        )
        del data["lease_until"]
        return data


@dataclass(frozen=True)
class Step:
    n: int
    at: float
    action: dict[str, Any]
    result: dict[str, Any]
    tokens_in: int
    tokens_out: int
    cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TaskStore:
    """``where``: the SQLite file, or the shared database (already migrated)."""

    def __init__(self, where: Path | Database) -> None:
        self.db = database(where, (TASKS, TASK_STEPS))

    def close(self) -> None:
        self.db.close()

    # the queue ----------------------------------------------------------------------------
    def submit(self, goal: str, template: str, project: str, max_steps: int) -> Task:
        task_id = "task-" + secrets.token_hex(6)
        with self.db.tx() as db:
            db.execute(
                "INSERT INTO tasks (id, project, template, goal, state, max_steps, created_at)"
                " VALUES (?, ?, ?, ?, 'queued', ?, ?)",
                (task_id, project, template, goal, max_steps, time.time()),
            )
        return self.get(task_id)

    def claim(self, worker: str, lease: float) -> Task | None:
        """The oldest queued task, leased to ``worker`` (one transaction: never twice;
        on PostgreSQL, concurrent claimers skip the row another one holds)."""
        now = time.time()
        with self.db.tx() as db:
            row = db.execute(
                "SELECT id FROM tasks WHERE state='queued' ORDER BY created_at LIMIT 1"  # noqa: S608 - constant SQL
                + self.db.skip_locked
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE tasks SET state='running', worker=?, lease_until=?, attempts=attempts+1,"
                " started_at=COALESCE(started_at, ?) WHERE id=?",
                (worker, now + lease, now, row["id"]),
            )
        return self.get(row["id"])

    def renew(self, task_id: str, worker: str, lease: float) -> bool:
        """Extend the lease; False when the task is no longer this worker's."""
        with self.db.tx() as db:
            cursor = db.execute(
                "UPDATE tasks SET lease_until=? WHERE id=? AND worker=? AND state='running'",
                (time.time() + lease, task_id, worker),
            )
        return cursor.rowcount == 1

    def requeue_expired(self) -> list[str]:
        """Running tasks whose lease ran out (their worker died): queued again, to resume
        after their last completed step."""
        with self.db.tx() as db:
            rows = db.execute(
                "UPDATE tasks SET state='queued', worker=NULL, lease_until=NULL"
                " WHERE state='running' AND lease_until < ? RETURNING id",
                (time.time(),),
            ).fetchall()
        return [str(r["id"]) for r in rows]

    # progress -----------------------------------------------------------------------------
    def set_sandbox(self, task_id: str, sandbox: str) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE tasks SET sandbox=? WHERE id=?", (sandbox, task_id))

    def add_step(
        self,
        task_id: str,
        n: int,
        action: dict[str, Any],
        result: dict[str, Any],
        tokens: tuple[int, int],
        cost_usd: float,
    ) -> None:
        """Append step ``n`` and count it, atomically; a step is recorded once."""
        tool = "tool" in action
        failed = tool and bool(result.get("error"))
        with self.db.tx() as db:
            db.execute(
                "INSERT INTO task_steps VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (task_id, n, time.time(), json.dumps(action), json.dumps(result),
                 tokens[0], tokens[1], cost_usd),
            )  # fmt: skip
            db.execute(
                "UPDATE tasks SET steps=?, tool_calls=tool_calls+?, tool_errors=tool_errors+?,"
                " tokens_in=tokens_in+?, tokens_out=tokens_out+?, cost_usd=cost_usd+?"
                " WHERE id=?",
                (n, int(tool), int(failed), tokens[0], tokens[1], cost_usd, task_id),
            )

    def add_usage(self, task_id: str, tokens: tuple[int, int], cost_usd: float) -> None:
        """Tokens spent on a model turn that produced no step (it failed)."""
        with self.db.tx() as db:
            db.execute(
                "UPDATE tasks SET tokens_in=tokens_in+?, tokens_out=tokens_out+?,"
                " cost_usd=cost_usd+? WHERE id=?",
                (tokens[0], tokens[1], cost_usd, task_id),
            )

    def finish(
        self, task_id: str, state: str, failure: str | None = None, result: str | None = None
    ) -> None:
        with self.db.tx() as db:
            db.execute(
                "UPDATE tasks SET state=?, failure=?, result=?, finished_at=?, lease_until=NULL"
                " WHERE id=? AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                (state, failure, result, time.time(), task_id),
            )

    def request_cancel(self, task_id: str) -> Task:
        task = self.get(task_id)
        if task.state in FINAL_STATES:
            raise Conflict(f"task {task_id} is {task.state} already; nothing to cancel")
        with self.db.tx() as db:
            db.execute("UPDATE tasks SET cancel_requested=1 WHERE id=?", (task_id,))
            if task.state == "queued":  # nobody runs it: it ends now
                db.execute(
                    "UPDATE tasks SET state='cancelled', failure='cancelled', finished_at=?"
                    " WHERE id=? AND state='queued'",
                    (time.time(), task_id),
                )
        return self.get(task_id)

    # reading ------------------------------------------------------------------------------
    def get(self, task_id: str) -> Task:
        row = self.db.conn().execute("SELECT * FROM tasks WHERE id=?", (task_id,)).fetchone()
        if row is None:
            raise NotFound(
                f"task {task_id} does not exist",
                hint=Hint("task_list", {}, "{call} to list tasks"),
            )
        return Task(**dict(row))

    def list(self, state: str | None = None, limit: int = 100) -> builtins.list[Task]:
        query, args = "SELECT * FROM tasks", ()  # type: tuple[str, tuple[Any, ...]]
        if state:
            query, args = query + " WHERE state=?", (state,)
        rows = self.db.conn().execute(query + " ORDER BY created_at DESC LIMIT ?", (*args, limit))
        return [Task(**dict(r)) for r in rows]

    def steps(self, task_id: str) -> builtins.list[Step]:
        rows = (
            self.db.conn()
            .execute("SELECT * FROM task_steps WHERE task=? ORDER BY n", (task_id,))
            .fetchall()
        )
        return [
            Step(r["n"], r["at"], json.loads(r["action"]), json.loads(r["result"]),
                 r["tokens_in"], r["tokens_out"], r["cost_usd"])
            for r in rows
        ]  # fmt: skip
