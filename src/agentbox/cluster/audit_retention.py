"""Retention of the audit copies in PostgreSQL (``cluster.audit_retention_days``,
``agentbox audit prune --cluster``): every chain's records older than the retention are
deleted, and a checkpoint (the last deleted record's seq and hash) is written in the same
transaction, so ``agentbox audit verify --cluster`` starts there (cluster/audit_verify.py)
and still proves that nothing after it was altered or removed.

Each chain is verified up to the cut before anything is deleted: a tampered record is
reported, never pruned away with the rest. Only the copies are pruned; each process's
own JSONL file keeps its own rotation. Run as the database's owner (a timer or CronJob):
the replicas' and nodes' roles may neither delete audit copies nor write checkpoints
(src/agentbox/state/roles.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agentbox.audit.chain import rfc3339
from agentbox.cluster.audit_chain import chain_rows
from agentbox.cluster.audit_verify import checkpoint, walk
from agentbox.state.db import Database

_LOCK = "agentbox:audit-prune"


@dataclass
class Pruned:
    chain: str
    through_seq: int  # the chain's checkpoint after this run (0: nothing pruned ever)
    records: int  # deleted by this run
    problem: str | None = None  # why this chain was left alone

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prune(db: Database, older_than_s: float, now: datetime | None = None) -> list[Pruned]:
    """Delete every chain's records stamped before ``now - older_than_s``; one
    transaction per chain, under a lock (two prunes at once: one waits)."""
    cutoff = rfc3339((now or datetime.now(UTC)) - timedelta(seconds=older_than_s))
    return [_prune_chain(db, str(row["id"]), cutoff) for row in chain_rows(db)]


def _prune_chain(db: Database, chain: str, cutoff: str) -> Pruned:
    with db.tx(lock=_LOCK) as conn:
        start = checkpoint(db, chain)
        row = conn.execute(
            "SELECT MAX(seq) FROM audit_records WHERE chain = ? AND seq > ?"  # noqa: S608
            f" AND {db.json_text('line', 'ts')} < ?",
            (chain, start[0], cutoff),
        ).fetchone()
        cut = int(row[0]) if row and row[0] is not None else 0
        if cut <= start[0]:
            return Pruned(chain, start[0], 0)
        last, last_hash, _count, bad = walk(db, chain, start, until=cut)
        if bad is not None or last != cut:
            seq, why = bad if bad is not None else (last + 1, "missing from the copy")
            return Pruned(chain, start[0], 0, f"seq {seq}: {why}: not pruned, verify it")
        deleted = conn.execute(
            "DELETE FROM audit_records WHERE chain = ? AND seq <= ?", (chain, cut)
        ).rowcount
        conn.execute(
            "INSERT INTO audit_checkpoints (chain, seq, hash, pruned_at, records_pruned)"
            " VALUES (?, ?, ?, agentbox_now(), ?) ON CONFLICT (chain) DO UPDATE SET"
            " seq = excluded.seq, hash = excluded.hash, pruned_at = excluded.pruned_at,"
            " records_pruned = audit_checkpoints.records_pruned + excluded.records_pruned",
            (chain, cut, last_hash, deleted),
        )
        return Pruned(chain, cut, deleted)
