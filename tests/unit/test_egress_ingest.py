"""Egress decisions copied into the gateway's trail: once each, in order, across restarts."""

from __future__ import annotations

import time
from pathlib import Path

from agentbox.audit.log import AuditLog, read_records, verify
from agentbox.observability.egress_ingest import EgressIngest
from agentbox.observability.metrics import Metrics


def _wait_for(path: Path, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 10
    while True:
        records = [r for r in read_records(path, limit=None) if r["tool"] == "egress"]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.02)


def test_egress_records_reach_the_main_trail_once_each_across_restarts(tmp_path: Path) -> None:
    egress_path, main_path = tmp_path / "egress.jsonl", tmp_path / "main" / "audit.jsonl"
    with AuditLog(egress_path, fsync="batch") as egress, AuditLog(main_path) as main:

        def decide(host: str, allowed: bool) -> None:
            egress.append(
                decision="egress_allowed" if allowed else "egress_denied", actor="egress",
                sandbox="sb-1", tool="egress", error=None if allowed else "not on the allowlist",
                extra={"host": host, "port": 443, "reason": "r", "kind": "connect",
                       "address": None, "bytes_up": 0},
            )  # fmt: skip

        decide("a.test", True)
        decide("b.test", False)
        metrics = Metrics()
        ingest = EgressIngest(egress_path, main, metrics, poll_interval=0.01)
        ingest.start()
        first = _wait_for(main_path, 2)
        ingest.stop()
        decide("c.test", False)  # while no gateway follows
        again = EgressIngest(egress_path, main, metrics, poll_interval=0.01)
        again.start()
        copied = _wait_for(main_path, 3)
        again.stop()
    assert [r["host"] for r in first] == ["a.test", "b.test"]
    assert [(r["host"], r["egress_seq"], r["decision"]) for r in copied] == [
        ("a.test", 1, "egress_allowed"),
        ("b.test", 2, "egress_denied"),
        ("c.test", 3, "egress_denied"),
    ]
    assert copied[1]["error"] == "not on the allowlist" and copied[0]["sandbox"] == "sb-1"
    assert verify(main_path).ok and verify(egress_path).ok
    text = metrics.render().decode()
    assert 'agentbox_egress_decisions_total{decision="egress_denied",kind="connect"} 2.0' in text
    assert 'agentbox_egress_decisions_total{decision="egress_allowed",kind="connect"} 1.0' in text
