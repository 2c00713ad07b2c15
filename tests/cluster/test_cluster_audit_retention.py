"""Retention of the audit copies in PostgreSQL (``agentbox audit prune --cluster``,
cluster/audit_retention.py): a real audit log shipped by the real ChainShipper into a
real PostgreSQL, pruned behind a checkpoint; ``agentbox audit verify --cluster`` still
verifies, reports the pruned part as pruned, and still catches tampering after the
checkpoint, a record removed right after it, and a forged checkpoint."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from clusterkit import AGENTBOX

from agentbox.audit.log import AuditLog
from agentbox.cluster.audit_chain import ChainShipper
from agentbox.cluster.audit_retention import prune
from agentbox.state.postgres import PostgresDB, migrate
from pgkit import PgServer

CHAIN = "node:retained"


@dataclass
class Shipped:
    db: PostgresDB
    config: Path
    cut: datetime  # every record before it is old, every one after it new
    old: int  # records before the cut


@pytest.fixture
def shipped(postgres: PgServer, tmp_path: Path) -> Iterator[Shipped]:
    url = postgres.new_database()
    migrate(url)
    db = PostgresDB(url)
    log = AuditLog(tmp_path / "audit" / "audit.jsonl")
    shipper = ChainShipper(db, log, CHAIN, "node", interval=3600)
    shipper.register()
    for i in range(25):
        log.append(decision="allow", actor="operator", tool="terminal_run", args={"i": i})
    cut = datetime.now(UTC)
    for i in range(15):
        log.append(decision="allow", actor="operator", tool="fs_read", args={"i": i})
    shipper.stop()  # ships all 40 and closes the chain
    log.close()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"gateway:\n  state: {url}\ncluster:\n  ca_file: /x/ca.pem\n  cert_file: /x/c.pem\n"
        "  key_file: /x/c.key\n  audit_retention_days: 30\n"
    )
    try:
        yield Shipped(db, config, cut, 25)
    finally:
        db.close()


def verify(config: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [AGENTBOX, "audit", "verify", "--cluster", "--config", str(config), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.stdout, done.stderr
    (chain,) = json.loads(done.stdout)["chains"]
    return done.returncode, chain


def test_pruned_copies_still_verify_from_their_checkpoint(shipped: Shipped) -> None:
    (result,) = prune(shipped.db, 0, now=shipped.cut)
    assert (result.chain, result.through_seq, result.records, result.problem) == (
        CHAIN, 25, 25, None,
    )  # fmt: skip
    left = shipped.db.conn().execute(
        "SELECT MIN(seq), COUNT(*) FROM audit_records WHERE chain = ?", (CHAIN,)
    )
    assert tuple(left.fetchone()) == (26, 15)
    code, chain = verify(shipped.config)
    assert code == 0 and chain["ok"], chain
    assert (chain["pruned_through"], chain["records"], chain["head_seq"]) == (25, 15, 40)
    # Again: nothing older is left, nothing is deleted; the checkpoint stays.
    (again,) = prune(shipped.db, 0, now=shipped.cut)
    assert (again.through_seq, again.records) == (25, 0)

    # Tampering after the checkpoint is still caught.
    shipped.db.conn().execute(
        "UPDATE audit_records SET line = replace(line, 'fs_read', 'fs_write')"
        " WHERE chain = ? AND seq = 30",
        (CHAIN,),
    )
    code, chain = verify(shipped.config)
    assert code == 1 and chain["first_bad"] == 30, chain


def test_a_record_removed_right_after_the_checkpoint_is_reported(shipped: Shipped) -> None:
    prune(shipped.db, 0, now=shipped.cut)
    shipped.db.conn().execute("DELETE FROM audit_records WHERE chain = ? AND seq = 26", (CHAIN,))
    code, chain = verify(shipped.config)
    # Named by the record found where seq 26 belonged, as for a gap anywhere in a chain.
    assert code == 1 and chain["first_bad"] == 27, chain


def test_a_forged_checkpoint_does_not_hide_removed_records(shipped: Shipped) -> None:
    """Deleting old records and writing a checkpoint by hand: the first record kept does
    not link to a made-up hash, and its seq must follow the checkpoint's."""
    conn = shipped.db.conn()
    conn.execute("DELETE FROM audit_records WHERE chain = ? AND seq <= 30", (CHAIN,))
    conn.execute(
        "INSERT INTO audit_checkpoints VALUES (?, 30, ?, 0, 30)", (CHAIN, secrets.token_hex(32))
    )
    code, chain = verify(shipped.config)
    assert code == 1 and chain["first_bad"] == 31, chain


def test_tampering_before_the_cut_is_not_pruned_away(shipped: Shipped) -> None:
    shipped.db.conn().execute(
        "UPDATE audit_records SET line = replace(line, 'allow', 'deny')"
        " WHERE chain = ? AND seq = 10",
        (CHAIN,),
    )
    (result,) = prune(shipped.db, 0, now=shipped.cut)
    assert result.records == 0 and result.problem and result.problem.startswith("seq 10:")
    count = shipped.db.conn().execute(
        "SELECT COUNT(*) FROM audit_records WHERE chain = ?", (CHAIN,)
    )
    assert count.fetchone()[0] == 40
    done = subprocess.run(
        [AGENTBOX, "audit", "prune", "--cluster", "--config", str(shipped.config),
         "--older-than-days", "0.000001", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # every record is old now, and seq 10 is bad
    assert json.loads(done.stdout)["chains"][0]["problem"].startswith("seq 10:")
