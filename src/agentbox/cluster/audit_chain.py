"""Cluster mode's audit chains: every gateway replica and every node keeps its own hash
chain (its local JSONL file, exactly as on one host) and copies it into PostgreSQL
(``audit_records``, migration 3), with a witness row in ``audit_chains``: the last seq and
hash shipped, when (the database's clock), and whether the writer closed it cleanly.
``agentbox audit verify --cluster`` (cluster/audit_verify.py) checks every chain there
from any host. docs/cluster.md, "Audit", argues why the copies live in PostgreSQL.

A chain's id is ``node:<cluster.node.id>`` or ``replica:<host>-<port>``: a process
restarted with the same home resumes its chain. Only records already fsynced with their
head are shipped, so a crash never leaves the copy ahead of the file the process resumes
from; a home replaced under a chain id the database already holds is refused at start.
"""

from __future__ import annotations

import logging
import socket
import threading

from agentbox.audit.log import GENESIS, AuditLog, Record, canonical_json
from agentbox.errors import AgentboxError, Conflict
from agentbox.state.db import Connection, Database

log = logging.getLogger(__name__)
_BATCH = 500  # rows per INSERT: one round trip, a bounded statement


def replica_chain_id(listen: str) -> str:
    """A replica's chain: its host name and port (two replicas on one host differ)."""
    port = listen.rpartition(":")[2]
    return f"replica:{socket.gethostname()}-{port}"


class ChainShipper:
    """Copies ``audit``'s chain into the database every ``interval`` seconds (and once
    more at stop, which marks the chain closed)."""

    def __init__(
        self, db: Database, audit: AuditLog, chain_id: str, kind: str, interval: float
    ) -> None:
        self.db = db
        self.audit = audit
        self.chain = chain_id
        self.kind = kind
        self.interval = interval
        self.shipped = 0
        self._head = GENESIS
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        """The chain's row (reopened: not closed), and where its copy stops."""
        conn = self.db.conn()
        row = conn.execute(
            "SELECT head_seq, head_hash FROM audit_chains WHERE id = ?", (self.chain,)
        ).fetchone()
        if row is not None:
            self.shipped, self._head = int(row[0]), str(row[1])
            if self.shipped:
                mine = self.audit.records_after(self.shipped - 1)[:1]
                if not mine or mine[0]["seq"] != self.shipped or mine[0]["hash"] != self._head:
                    raise Conflict(
                        f"the cluster's copy of audit chain {self.chain} reaches seq "
                        f"{self.shipped}, which this process's audit log "
                        f"({self.audit.path}) does not hold: its home was replaced. Restore "
                        "that home's audit directory, or run this process under another "
                        "host name or port (a new chain)",
                        chain=self.chain,
                    )
        conn.execute(
            "INSERT INTO audit_chains (id, kind, host, path, started_at, updated_at, head_seq,"
            " head_hash, closed_at) VALUES (?, ?, ?, ?, agentbox_now(), agentbox_now(), ?, ?,"
            " NULL) ON CONFLICT (id) DO UPDATE SET host = excluded.host, path = excluded.path,"
            " updated_at = excluded.updated_at, closed_at = NULL",
            (self.chain, self.kind, socket.gethostname(), str(self.audit.path), 0, GENESIS),
        )

    def ship(self, closing: bool = False) -> int:
        """Copy the durable records not shipped yet; returns how many."""
        with self._lock:
            durable = self.audit.durable_seq
            records = []
            if durable > self.shipped:  # most ticks: nothing new, no file read
                records = [r for r in self.audit.records_after(self.shipped) if r["seq"] <= durable]
            shipped, head = self.shipped, self._head
            if records:
                shipped, head = records[-1]["seq"], records[-1]["hash"]
            with self.db.tx() as conn:
                for start in range(0, len(records), _BATCH):
                    self._insert(conn, records[start : start + _BATCH])
                conn.execute(
                    "UPDATE audit_chains SET head_seq = ?, head_hash = ?, updated_at ="
                    " agentbox_now(), closed_at = CASE WHEN ? THEN agentbox_now() END"
                    " WHERE id = ?",
                    (shipped, head, closing, self.chain),
                )
            # Only once committed: a transaction cut by a database restart ships them again.
            self.shipped, self._head = shipped, head
            return len(records)

    def _insert(self, conn: Connection, batch: list[Record]) -> None:
        values = ", ".join("(?, ?, ?)" for _ in batch)
        params: list[object] = []
        for record in batch:
            params += [self.chain, record["seq"], canonical_json(record).decode()]
        conn.execute(
            f"INSERT INTO audit_records (chain, seq, line) VALUES {values}"  # noqa: S608 - placeholders only
            " ON CONFLICT (chain, seq) DO NOTHING",
            params,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.ship()
            except AgentboxError as e:  # state_unavailable: the next tick reconnects
                log.warning("shipping audit chain %s failed: %s", self.chain, e)
            except Exception:  # a bug must not stop the copy
                log.exception("shipping audit chain %s failed", self.chain)

    def start(self) -> None:
        self.register()
        self.ship()
        self._thread = threading.Thread(target=self._run, name="agentbox-audit-ship", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ship the rest and mark the chain closed (call before the audit log closes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.ship(closing=True)
        except AgentboxError as e:
            log.warning("closing audit chain %s: %s", self.chain, e)


def chain_rows(db: Database) -> list[dict[str, object]]:
    """Every chain's witness row, with its age by the database's clock."""
    rows = db.conn().execute(
        "SELECT id, kind, host, path, head_seq, head_hash, closed_at,"
        " agentbox_now() - updated_at FROM audit_chains ORDER BY id"
    )
    keys = ("id", "kind", "host", "path", "head_seq", "head_hash", "closed_at", "age_s")
    return [{k: r[i] for i, k in enumerate(keys)} for r in rows]
