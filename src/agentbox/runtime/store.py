"""The sandbox registry: SQLite under ``$AGENTBOX_HOME/state.db`` on one host, or the
shared PostgreSQL database (see :mod:`agentbox.state`).

Several processes share it (the daemon, CLI invocations, in-process SDK users); every
write is one short transaction, and those that read before they write (admission, the
free slot, warm-pool claims) hold the registry's lock.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox.config.host import Admission
from agentbox.errors import CapacityExceeded, QuotaExceeded
from agentbox.hints import Hint
from agentbox.runtime.record import SandboxRecord, SandboxState, stored
from agentbox.state.db import Connection, Database
from agentbox.state.sqlite import database
from agentbox.state.tables import EVENTS, SANDBOXES

if TYPE_CHECKING:
    from agentbox.config.specs import SandboxSpec
    from agentbox.runtime.spec_cache import StoredSpec

__all__ = ["SandboxRecord", "SandboxState", "Store"]

MAX_EVENTS = 100_000  # the oldest go first; the audit trail keeps the history


_LOCK = "sandboxes"  # reads that decide a write (slots, admission, claims) hold it
_LIVE = "state IN ('creating', 'running', 'paused', 'pooled')"


def _admit(
    db: Connection, dialect: type[Database], admission: Admission, spec: SandboxSpec | StoredSpec
) -> None:
    count, memory, soonest = db.execute(
        f"SELECT COUNT(*), COALESCE(SUM({dialect.json_int('spec', 'memory')}), 0),"  # noqa: S608 - constant SQL
        f" MIN(expires_at) FROM sandboxes WHERE {_LIVE}"
    ).fetchone()
    # When a place may free up: the next expiry, within reason.
    retry = 30.0 if soonest is None else min(max(soonest - time.time(), 1.0), 300.0)
    if admission.max_sandboxes is not None and count >= admission.max_sandboxes:
        raise CapacityExceeded(
            f"this host runs {count} sandboxes, its limit (sandbox.admission.max_sandboxes); "
            "retry later or destroy some",
            retry_after=retry,
        )
    wanted = spec.memory
    if admission.max_memory is not None and memory + wanted > admission.max_memory:
        raise CapacityExceeded(
            f"live sandboxes have {memory / 2**30:.1f} GiB of memory limits; "
            f"{wanted / 2**30:.2f} GiB more would pass the host's "
            f"{admission.max_memory / 2**30:.1f} GiB (sandbox.admission.max_memory); "
            "retry later, destroy some, or ask for less memory",
            retry_after=retry,
        )
    project = spec.project
    if admission.max_per_project is not None:
        (in_project,) = db.execute(
            f"SELECT COUNT(*) FROM sandboxes WHERE {_LIVE}"  # noqa: S608 - constant SQL
            f" AND COALESCE({dialect.json_text('spec', 'project')}, 'default') = ?",
            (project,),
        ).fetchone()
        if in_project >= admission.max_per_project:
            raise QuotaExceeded(
                f"project {project!r} has {in_project} sandboxes, its quota "
                "(sandbox.admission.max_per_project); destroy one or retry later",
                retry_after=retry,
                project=project,
            )


class Store:
    """``where``: the SQLite file, or the shared database (already migrated)."""

    def __init__(self, where: Path | Database) -> None:
        self.db = database(where, (SANDBOXES, EVENTS))
        self._pool = self.db.json_text("spec", "pool")

    def close(self) -> None:
        self.db.close()

    _record = staticmethod(SandboxRecord.from_row)

    def reserve(
        self,
        sandbox_id: str,
        template: str,
        digest: str,
        spec: SandboxSpec | StoredSpec,
        expires_at: float | None,
        max_slots: int,
        admission: Admission | None = None,
        pool: str | None = None,
        slot: int | None = None,
    ) -> SandboxRecord:
        """Insert a ``creating`` record holding the lowest free slot (the slot picks the uid),
        if ``admission`` lets it in: checked in the same transaction, so concurrent creators
        in any process cannot overshoot. ``pool``: a warm sandbox's pool key. ``slot``:
        this one or none (a memory snapshot's processes keep their uid)."""
        with self.db.tx(_LOCK) as db:
            if admission is not None:
                _admit(db, type(self.db), admission, spec)
            used = {r[0] for r in db.execute("SELECT slot FROM sandboxes")}
            if slot is not None and slot in used:
                from agentbox.errors import Conflict

                holder = db.execute("SELECT id FROM sandboxes WHERE slot=?", (slot,)).fetchone()
                raise Conflict(
                    f"this needs the host uid of slot {slot}, which sandbox {holder[0]} "
                    "holds; destroy that sandbox (or restore on another host) and retry"
                )
            if slot is None:
                slot = next((s for s in range(max_slots) if s not in used), None)
            if slot is None:
                from agentbox.errors import LimitExceeded

                raise LimitExceeded(
                    f"this host already runs {len(used)} sandboxes, its maximum; destroy "
                    "some and retry",
                    hint=Hint("sandbox_list", {}, "{call} to see them"),
                )
            now, text = time.time(), stored(spec, pool)
            db.execute(
                "INSERT INTO sandboxes (id, slot, state, template, template_digest, created_at,"
                " expires_at, spec) VALUES (?, ?, 'creating', ?, ?, ?, ?, ?)",
                (sandbox_id, slot, template, digest, now, expires_at, text),
            )
        return SandboxRecord(
            sandbox_id, slot, "creating", template, digest, None, None, now, expires_at, text
        )

    def mark_running(
        self,
        sandbox_id: str,
        init_pid: int,
        init_start_time: int,
        state: SandboxState = "running",
    ) -> None:
        with self.db.tx() as db:
            db.execute(
                "UPDATE sandboxes SET state=?, init_pid=?, init_start_time=? WHERE id=?",
                (state, init_pid, init_start_time, sandbox_id),
            )

    def claim(
        self,
        pool_key: str,
        template_digest: str,
        spec: SandboxSpec | StoredSpec,
        lifetime: float,
        max_age: float,
        admission: Admission | None = None,
    ) -> SandboxRecord | None:
        """Turn the oldest ``pooled`` sandbox of ``pool_key`` into a running one with
        ``spec`` (one transaction: two claimers never get the same), or None. It expires
        at ``lifetime`` from now, but never after its init's own end (created + max_age)."""
        probe = (
            self.db.conn()
            .execute(
                "SELECT 1 FROM sandboxes WHERE state='pooled' AND template_digest=?"  # noqa: S608 - constant SQL
                f" AND {self._pool}=? LIMIT 1",
                (template_digest, pool_key),
            )
            .fetchone()
        )
        if probe is None:  # no warm one: no write lock taken (every create asks)
            return None
        with self.db.tx(_LOCK) as db:
            row = db.execute(
                "SELECT * FROM sandboxes WHERE state='pooled' AND template_digest=?"  # noqa: S608 - constant SQL
                f" AND {self._pool}=? ORDER BY created_at LIMIT 1",
                (template_digest, pool_key),
            ).fetchone()
            if row is None:
                return None
            if admission is not None and admission.max_per_project is not None:
                limit = Admission(max_per_project=admission.max_per_project)
                _admit(db, type(self.db), limit, spec)
            expires = min(time.time() + lifetime, float(row["created_at"]) + max_age)
            text = stored(spec, from_pool=True)
            db.execute(
                "UPDATE sandboxes SET state='running', spec=?, expires_at=? WHERE id=?",
                (text, expires, row["id"]),
            )
        return dataclasses.replace(
            self._record(row), state="running", stored=text, expires_at=expires
        )

    def take_pooled(self, sandbox_id: str) -> bool:
        """Mark a still-pooled sandbox ``destroying`` (False: claimed meanwhile)."""
        with self.db.tx() as db:
            cursor = db.execute(
                "UPDATE sandboxes SET state='destroying' WHERE id=? AND state='pooled'",
                (sandbox_id,),
            )
        return cursor.rowcount == 1

    def pooled(self, pool_key: str) -> builtins.list[SandboxRecord]:
        rows = (
            self.db.conn()
            .execute(
                "SELECT * FROM sandboxes WHERE state IN ('pooled', 'creating')"  # noqa: S608 - constant SQL
                f" AND {self._pool}=? ORDER BY created_at",
                (pool_key,),
            )
            .fetchall()
        )
        return [self._record(r) for r in rows]

    def set_state(self, sandbox_id: str, state: SandboxState) -> None:
        with self.db.tx() as db:
            db.execute("UPDATE sandboxes SET state=? WHERE id=?", (state, sandbox_id))

    def get(self, sandbox_id: str) -> SandboxRecord | None:
        row = self.db.conn().execute("SELECT * FROM sandboxes WHERE id=?", (sandbox_id,)).fetchone()
        return self._record(row) if row else None

    def by_slot(self, slot: int) -> SandboxRecord | None:
        row = self.db.conn().execute("SELECT * FROM sandboxes WHERE slot=?", (slot,)).fetchone()
        return self._record(row) if row else None

    def running_in_slot(self, slot: int) -> str | None:
        """The id of the running sandbox holding ``slot`` (no spec decoding: per connection)."""
        row = (
            self.db.conn()
            .execute("SELECT id FROM sandboxes WHERE slot=? AND state='running'", (slot,))
            .fetchone()
        )
        return str(row[0]) if row else None

    # lifecycle events -------------------------------------------------------------------
    def add_event(
        self, sandbox: str, type_: str, reason: str, actor: str, details: dict[str, Any]
    ) -> int:
        # Under the lock, ids commit in order: a reader past id N never misses a later N-1.
        with self.db.tx("events") as db:
            (event_id,) = db.execute(
                "INSERT INTO events (at, sandbox, type, reason, actor, details)"
                " VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (time.time(), sandbox, type_, reason, actor, json.dumps(details)),
            ).fetchone()
            if event_id % 1000 == 0:
                db.execute("DELETE FROM events WHERE id <= ?", (event_id - MAX_EVENTS,))
        return int(event_id)

    def events_after(
        self, after: int, limit: int = 1000, sandbox: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        query = "SELECT * FROM events WHERE id > ?"
        args: tuple[Any, ...] = (after,)
        if sandbox is not None:
            query += " AND sandbox = ?"
            args += (sandbox,)
        rows = self.db.conn().execute(query + " ORDER BY id LIMIT ?", (*args, limit)).fetchall()
        return [{**dict(r), "details": json.loads(r["details"])} for r in rows]

    def count_by_state(self) -> dict[str, int]:
        rows = self.db.conn().execute("SELECT state, COUNT(*) FROM sandboxes GROUP BY state")
        return {str(state): int(n) for state, n in rows}

    def last_event_id(self) -> int:
        row = self.db.conn().execute("SELECT MAX(id) FROM events").fetchone()
        return int(row[0] or 0)

    def template_digests(self) -> set[str]:
        """The template digests of every record, whatever its state: each one's tree is
        in use (overlaid, or needed to start, fork or finish removing it)."""
        rows = self.db.conn().execute("SELECT DISTINCT template_digest FROM sandboxes")
        return {str(r[0]) for r in rows}

    def list(self) -> list[SandboxRecord]:
        rows = self.db.conn().execute("SELECT * FROM sandboxes ORDER BY created_at").fetchall()
        return [self._record(r) for r in rows]

    def expired(self, now: float) -> builtins.list[SandboxRecord]:
        rows = (
            self.db.conn()
            .execute(
                "SELECT * FROM sandboxes WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
            )
            .fetchall()
        )
        return [self._record(r) for r in rows]

    def set_expiry(self, sandbox_id: str, expires_at: float | None) -> None:
        """A new end of life (the lifecycle sweep destroys the sandbox then)."""
        with self.db.tx() as db:
            db.execute("UPDATE sandboxes SET expires_at=? WHERE id=?", (expires_at, sandbox_id))

    def delete(self, sandbox_id: str) -> None:
        with self.db.tx() as db:
            db.execute("DELETE FROM sandboxes WHERE id=?", (sandbox_id,))
