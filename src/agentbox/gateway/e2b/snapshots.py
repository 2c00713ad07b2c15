"""E2B's snapshots: ``create_snapshot`` / ``list_snapshots`` / ``delete_snapshot`` and
``Sandbox.create(SNAPSHOT_ID)``, on agentbox's snapshots (``runtime/snapshots.py``).

A snapshot is agentbox's: the writable layer and /workspace of a sandbox, secret-scanned
before it is stored (a finding refuses it, as on ``/v1``), content-addressed, restored
into a new sandbox of the same template. What E2B adds is kept in ``e2b_snapshots``
(gateway.db): the project that owns it (the sandbox's) and its names. A project key sees,
restores and deletes only its project's snapshots; the same content snapshotted by two
projects is one stored object with two owners, deleted from the store with the last one.
Every step is an audit record (``snapshot_created``, ``snapshot_deleted``,
``sandbox_created`` with ``snapshot``), as over ``/v1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentbox.errors import SandboxNotFound, SnapshotNotFound
from agentbox.gateway.e2b.access import Caller
from agentbox.gateway.e2b.models import Loose
from agentbox.gateway.service import Gateway
from agentbox.runtime.snapshots import Snapshots
from agentbox.runtime.store import SandboxRecord
from agentbox.state.db import Database
from agentbox.state.sqlite import SqliteDB
from agentbox.state.tables import E2B_SNAPSHOTS

MAX_PAGE = 1000


class NewSnapshot(Loose):
    name: str | None = Field(default=None, max_length=256)


def is_snapshot(template_id: str) -> bool:
    return template_id.startswith("snap-")


class E2BSnapshots:
    """Its table lives beside the E2B sandboxes': ``HOME/gateway.db``, or the shared
    database (``shared``)."""

    def __init__(self, gateway: Gateway, shared: Database | None = None) -> None:
        self.gateway = gateway
        home = gateway.runtime.home
        self.db: Database = shared or SqliteDB(home / "gateway.db", (E2B_SNAPSHOTS,))

    def _store(self) -> Snapshots:
        store = self.gateway.runtime.snapshots(self.gateway.settings.gateway.store)
        store.scan_budget = self.gateway.settings.snapshots.scan_budget
        return store

    def _rows(self, caller: Caller, snapshot_id: str | None = None) -> list[dict[str, Any]]:
        query, args = "SELECT id, project, sandbox, names, created_at FROM e2b_snapshots", []
        where = []
        if caller.project is not None:
            where.append("project = ?")
            args.append(caller.project)
        if snapshot_id is not None:
            where.append("id = ?")
            args.append(snapshot_id)
        if where:
            query += " WHERE " + " AND ".join(where)
        rows = self.db.conn().execute(query + " ORDER BY created_at", args).fetchall()
        return [
            {"id": r[0], "project": r[1], "sandbox": r[2], "names": json.loads(r[3]),
             "created_at": r[4]}
            for r in rows
        ]  # fmt: skip

    # routes (called by the control plane with the caller it authenticated) --------------
    async def create(self, caller: Caller, record: SandboxRecord, body: NewSnapshot) -> Response:
        principal = caller.principal(record.id)
        info = await asyncio.to_thread(self._store().create, record.id)
        project = record.spec.project
        names = [body.name] if body.name else []
        with self.db.tx("e2b_snapshots") as db:
            row = db.execute(
                "SELECT names FROM e2b_snapshots WHERE id = ? AND project = ?", (info.id, project)
            ).fetchone()
            if row is not None:  # the same content again: one snapshot, every name
                names = list(dict.fromkeys([*json.loads(row[0]), *names]))
            db.execute(
                "INSERT INTO e2b_snapshots (id, project, sandbox, names, created_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (id, project) DO UPDATE SET"
                " sandbox = excluded.sandbox, names = excluded.names,"
                " created_at = excluded.created_at",
                (info.id, project, record.id, json.dumps(names), time.time()),
            )
        await self.gateway.audit_event(
            principal, "snapshot_created", sandbox=record.id, snapshot=info.id,
            redacted=len(info.redacted), api="e2b", **info.scan_audit(),
        )  # fmt: skip
        await self._retention(caller)
        return JSONResponse({"snapshotID": info.id, "names": names}, status_code=201)

    async def _retention(self, caller: Caller) -> None:
        retention = self.gateway.settings.snapshots
        if retention.max_count is None and retention.max_age is None:
            return
        gone = await asyncio.to_thread(
            self._store().apply_retention, retention.max_count, retention.max_age
        )
        for snapshot_id in gone:
            self.db.conn().execute("DELETE FROM e2b_snapshots WHERE id = ?", (snapshot_id,))
            await self.gateway.audit_event(
                caller.principal(), "snapshot_deleted", snapshot=snapshot_id, reason="retention",
                api="e2b",
            )  # fmt: skip

    async def list(self, caller: Caller, request: Request) -> Response:
        query = request.query_params
        rows = await asyncio.to_thread(self._rows, caller)
        by_id: dict[str, dict[str, Any]] = {}
        for row in rows:  # one entry per snapshot, whichever owners the caller sees
            entry = by_id.setdefault(row["id"], {**row, "names": []})
            entry["names"] = list(dict.fromkeys([*entry["names"], *row["names"]]))
        entries = sorted(by_id.values(), key=lambda r: r["created_at"], reverse=True)
        if query.get("sandboxID"):
            entries = [e for e in entries if e["sandbox"] == query["sandboxID"]]
        if query.get("name"):
            entries = [e for e in entries if query["name"] in e["names"]]
        limit = min(int(query.get("limit", "100") or 100), MAX_PAGE)
        start = 0
        if query.get("nextToken"):
            ids = [e["id"] for e in entries]
            start = ids.index(query["nextToken"]) if query["nextToken"] in ids else len(ids)
        page = entries[start : start + limit]
        headers = {}
        if start + limit < len(entries):
            headers["x-next-token"] = entries[start + limit]["id"]
        rows_out = [{"snapshotID": e["id"], "names": e["names"]} for e in page]
        return JSONResponse(rows_out, headers=headers)

    async def delete(self, caller: Caller, snapshot_id: str) -> Response:
        """``DELETE /templates/ID`` with a snapshot id (E2B deletes snapshots so)."""
        mine = await asyncio.to_thread(self._rows, caller, snapshot_id)
        if not mine:
            raise SnapshotNotFound(f"snapshot {snapshot_id} not found")
        with self.db.tx("e2b_snapshots") as db:
            for row in mine:
                db.execute(
                    "DELETE FROM e2b_snapshots WHERE id = ? AND project = ?",
                    (snapshot_id, row["project"]),
                )
            left = db.execute(
                "SELECT COUNT(*) FROM e2b_snapshots WHERE id = ?", (snapshot_id,)
            ).fetchone()[0]
        if not left:  # nobody else owns the same content
            # gone from the store already (retention, /v1): the record went too
            with contextlib.suppress(SnapshotNotFound):
                await asyncio.to_thread(self._store().delete, snapshot_id)
        await self.gateway.audit_event(
            caller.principal(), "snapshot_deleted", snapshot=snapshot_id, reason="operator",
            api="e2b",
        )  # fmt: skip
        return Response(status_code=204)

    async def restore(
        self, caller: Caller, snapshot_id: str, spec: dict[str, Any]
    ) -> SandboxRecord:
        """A new sandbox from a snapshot the caller may see (else: no such template)."""
        mine = await asyncio.to_thread(self._rows, caller, snapshot_id)
        if not mine:
            raise SandboxNotFound(f"template {snapshot_id} not found")
        principal = caller.principal()
        started = time.monotonic()
        record = await asyncio.to_thread(
            self._store().restore, snapshot_id, actor=principal.actor, spec=spec
        )
        self.gateway.metrics.sandbox_created("restore", time.monotonic() - started)
        await self.gateway.audit_event(
            principal, "sandbox_created", sandbox=record.id, template=record.template,
            snapshot=snapshot_id, api="e2b",
        )  # fmt: skip
        self.gateway.lifecycle_changed()
        return record
