"""``agentbox audit verify --cluster``: every audit chain of a cluster, checked from the
copies in PostgreSQL (cluster/audit_chain.py ships them), gaps reported per chain:

* a record altered, reordered or inserted, or missing in the middle (the chain's own
  checks, audit/chain.py ``check_line``: hashes, seqs, ``prev`` links);
* a truncated tail: the copy ends before the seq its witness row says was shipped;
* a chain that stopped: never closed, and not advanced for longer than the cluster's
  ``lost_after_seconds`` (its process died or lost the database; what it wrote after its
  last copy is only in its home);
* records whose chain has no witness row (the row was removed).

A chain pruned by ``agentbox audit prune --cluster`` (cluster/audit_retention.py) is
checked from its checkpoint: the first record kept must follow the checkpoint's seq and
link to its hash, and what lies before is reported as pruned (``pruned_through``), not
as missing.

Each chain's witness is read before its records, so a writer shipping meanwhile can
only add records past it, never cause a false alarm.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agentbox.audit.chain import GENESIS, check_line
from agentbox.cluster.audit_chain import chain_rows
from agentbox.state.db import Database

_PAGE = 5000


@dataclass
class ChainReport:
    chain: str
    kind: str
    host: str
    records: int = 0
    head_seq: int = 0
    closed: bool = False
    age_s: float = 0.0
    first_bad: int | None = None
    pruned_through: int = 0  # records up to this seq were pruned by retention
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "age_s": round(self.age_s, 3)}


def checkpoint(db: Database, chain: str) -> tuple[int, str]:
    """Where ``chain``'s copy starts: (last pruned seq, its hash), or (0, GENESIS)."""
    row = (
        db.conn()
        .execute("SELECT seq, hash FROM audit_checkpoints WHERE chain = ?", (chain,))
        .fetchone()
    )
    return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))


def walk(
    db: Database, chain: str, after: tuple[int, str], until: int | None = None
) -> tuple[int, str, int, tuple[int, str] | None]:
    """Check ``chain``'s copy from ``after`` (seq, hash) up to ``until``: (the last seq
    and hash that checked, records checked, (seq, problem) of the first bad one)."""
    expected, prev = after[0] + 1, after[1]
    count = 0
    while until is None or expected <= until:
        limit = _PAGE if until is None else min(_PAGE, until - expected + 1)
        page = (
            db.conn()
            .execute(
                "SELECT seq, line FROM audit_records WHERE chain = ? AND seq >= ?"
                " ORDER BY seq LIMIT ?",
                (chain, expected, limit),
            )
            .fetchall()
        )
        for seq, line in page:
            problem, record = check_line(str(line).encode(), expected, prev)
            if problem:
                bad = int(record["seq"]) if record else int(seq)
                return expected - 1, prev, count, (bad, problem)
            assert record is not None
            expected, prev = expected + 1, record["hash"]
            count += 1
        if len(page) < limit:
            break
    return expected - 1, prev, count, None


def _check_chain(db: Database, row: dict[str, Any], stopped_after: float) -> ChainReport:
    report = ChainReport(
        chain=str(row["id"]),
        kind=str(row["kind"]),
        host=str(row["host"]),
        head_seq=int(row["head_seq"]),
        closed=row["closed_at"] is not None,
        age_s=float(row["age_s"]),
    )
    start = checkpoint(db, report.chain)
    report.pruned_through = start[0]
    last, prev, report.records, bad = walk(db, report.chain, start)
    if bad is not None:
        report.first_bad = bad[0]
        report.problems.append(f"seq {bad[0]}: {bad[1]}")
        return report
    if last < report.head_seq:
        report.first_bad = last + 1
        report.problems.append(
            f"truncated: the copy ends at seq {last} but the chain's witness says seq "
            f"{report.head_seq} was shipped: records {last + 1}..{report.head_seq} were removed"
        )
    elif last == report.head_seq and report.head_seq and prev != row["head_hash"]:
        report.first_bad = last
        report.problems.append(
            f"seq {last} differs from the chain witness's hash: rewritten from here"
        )
    if not report.closed and report.age_s > stopped_after:
        report.problems.append(
            f"stopped: not closed and not advanced for {report.age_s:.0f} s (at seq "
            f"{report.head_seq}): its process died or lost the database; records it wrote "
            f"after that are only in its home on {report.host}. Restart it with the same "
            "home to ship them"
        )
    return report


def verify_cluster(db: Database, stopped_after: float) -> list[ChainReport]:
    """One report per chain (those with records but no witness row included)."""
    rows = chain_rows(db)
    reports = [_check_chain(db, row, stopped_after) for row in rows]
    known = {str(r["id"]) for r in rows}
    orphans = db.conn().execute("SELECT chain, COUNT(*) FROM audit_records GROUP BY chain")
    for chain, count in orphans:
        if chain not in known:
            report = ChainReport(chain=str(chain), kind="?", host="?", records=int(count))
            report.problems.append(
                "records without a chain row in audit_chains: its witness was removed"
            )
            reports.append(report)
    return reports
