"""The cluster's shared tables (PostgreSQL, migration 2): ``nodes`` (heartbeats, capacity,
labels) and ``cluster_sandboxes`` (which node runs each sandbox, and whether it is lost).

Times come from the database's clock (``agentbox_now()``, migration 2), never a
process's: a node and a gateway on two
hosts whose clocks disagree still agree on how long a node has been silent.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from agentbox.state.db import Database

_SWEEP_LOCK = "agentbox:cluster-sweep"
# A heartbeat's reconcile read (bench/sim_cluster.py pipelines it as sent here).
ON_NODE_SQL = "SELECT id, state, agentbox_now() - created_at FROM cluster_sandboxes WHERE node = ?"


@dataclass(frozen=True)
class Node:
    id: str
    address: str
    labels: dict[str, str]
    capacity: dict[str, Any]
    state: str  # ready | unreachable
    heartbeat_age: float  # seconds since its last heartbeat, by the database's clock

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["heartbeat_age_s"] = round(data.pop("heartbeat_age"), 3)
        return data


@dataclass(frozen=True)
class Placement:
    """Where a sandbox runs: its node, that node's address, and the row's state."""

    sandbox: str
    node: str
    state: str  # running | lost
    updated_at: float
    address: str | None


class Registry:
    def __init__(self, db: Database) -> None:
        self.db = db

    # nodes --------------------------------------------------------------------------
    def heartbeat(
        self, node: str, address: str, labels: dict[str, str], capacity: dict[str, Any]
    ) -> None:
        """The node's row, ready, stamped now (created on its first heartbeat)."""
        self.db.conn().execute(
            "INSERT INTO nodes (id, address, labels, capacity, state, registered_at,"
            " heartbeat_at) VALUES (?, ?, ?, ?, 'ready', agentbox_now(), agentbox_now())"
            " ON CONFLICT (id) DO UPDATE SET address = excluded.address,"
            " labels = excluded.labels, capacity = excluded.capacity, state = 'ready',"
            " heartbeat_at = excluded.heartbeat_at",
            (node, address, json.dumps(labels), json.dumps(capacity)),
        )

    def nodes(self) -> list[Node]:
        rows = self.db.conn().execute(
            "SELECT id, address, labels, capacity, state, agentbox_now() - heartbeat_at AS age"
            " FROM nodes ORDER BY id"
        )
        return [
            Node(r[0], r[1], json.loads(r[2]), json.loads(r[3]), r[4], float(r[5])) for r in rows
        ]

    def sweep(self, lost_after: float) -> list[str]:
        """Mark nodes silent for ``lost_after`` seconds unreachable and their sandboxes
        lost, in one transaction (every gateway sweeps; the lock makes it once)."""
        with self.db.tx(lock=_SWEEP_LOCK) as conn:
            rows = conn.execute(
                "UPDATE nodes SET state = 'unreachable' WHERE state = 'ready'"
                " AND heartbeat_at < agentbox_now() - ? RETURNING id",
                (lost_after,),
            ).fetchall()
            lost = [str(r[0]) for r in rows]
            for node in lost:
                conn.execute(
                    "UPDATE cluster_sandboxes SET state = 'lost', updated_at = agentbox_now()"
                    " WHERE node = ? AND state = 'running'",
                    (node,),
                )
        return lost

    # sandboxes ------------------------------------------------------------------------
    def claim(self, sandbox: str, node: str) -> None:
        self.db.conn().execute(
            "INSERT INTO cluster_sandboxes (id, node, state, created_at, updated_at)"
            " VALUES (?, ?, 'running', agentbox_now(), agentbox_now()) ON CONFLICT (id) DO NOTHING",
            (sandbox, node),
        )

    def drop(self, sandbox: str, node: str) -> None:
        """The row of a sandbox its node destroyed; a lost one's stays (its callers keep
        hearing ``sandbox_lost``, whatever the node did with it since)."""
        self.db.conn().execute(
            "DELETE FROM cluster_sandboxes WHERE id = ? AND node = ? AND state = 'running'",
            (sandbox, node),
        )

    def lookup(self, sandbox: str) -> Placement | None:
        row = (
            self.db.conn()
            .execute(
                "SELECT s.id, s.node, s.state, s.updated_at, n.address FROM cluster_sandboxes s"
                " LEFT JOIN nodes n ON n.id = s.node WHERE s.id = ?",
                (sandbox,),
            )
            .fetchone()
        )
        return None if row is None else Placement(row[0], row[1], row[2], float(row[3]), row[4])

    def on_node(self, node: str) -> dict[str, tuple[str, float]]:
        """The node's rows: sandbox id -> (state, seconds since created)."""
        rows = self.db.conn().execute(ON_NODE_SQL, (node,))
        return {str(r[0]): (str(r[1]), float(r[2])) for r in rows}

    def sandboxes(self) -> list[Placement]:
        rows = self.db.conn().execute(
            "SELECT s.id, s.node, s.state, s.updated_at, n.address FROM cluster_sandboxes s"
            " LEFT JOIN nodes n ON n.id = s.node ORDER BY s.created_at"
        )
        return [Placement(r[0], r[1], r[2], float(r[3]), r[4]) for r in rows]
