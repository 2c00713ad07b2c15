"""Egress decisions into the gateway's audit trail.

The egress daemon writes its decisions to its own hash-chained log
(``audit/egress.jsonl``; it outlives gateway restarts and may run with no gateway at all).
While a gateway runs, this follower copies each of those records into the gateway's
trail, so one trail (and its remote sink, its query API and live tail) shows tool calls
and egress together, and counts them in the gateway's metrics. ``egress_seq`` names the
source record; the position is kept in ``audit/egress.ingested``, so a restart resumes
where it stopped (a crash between the append and the position write may copy a record
twice: dedupe on ``egress_seq``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from agentbox.audit.log import AuditLog, Record, follow
from agentbox.observability.lifecycle_events import Position
from agentbox.observability.metrics import Metrics

log = logging.getLogger(__name__)
_CARRIED = ("host", "port", "address", "reason", "kind", "bytes_up")
# Mode ask's steps (agentbox.egressd.ask) and what they carry besides.
_ASK_STEPS = {
    "egress_held": "held",
    "egress_approval_requested": "requested",
    "egress_approval_rejoined": "rejoined",  # an open question a restarted daemon found
    "egress_approval_decided": "",  # the record's outcome: approved, denied or expired
}
_ASK_CARRIED = ("approval", "outcome", "scope", "by")


def position_path(egress_log: Path) -> Path:
    return egress_log.with_name("egress.ingested")


class EgressIngest:
    def __init__(
        self,
        egress_log: Path,
        audit: AuditLog,
        metrics: Metrics | None = None,
        poll_interval: float = 0.25,
    ) -> None:
        self.egress_log = egress_log
        self.audit = audit
        self.metrics = metrics
        self.poll_interval = poll_interval
        self.position = Position(position_path(egress_log))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="egress-ingest", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        since = self.position.load()
        try:
            for record in follow(
                self.egress_log,
                since_seq=since,
                poll_interval=self.poll_interval,
                stop=self._stop,
            ):
                self._copy(record)
                self.position.save(record["seq"])
        except Exception:  # a broken follower must not take the gateway down
            log.exception("egress audit ingest stopped")

    def _copy(self, record: Record) -> None:
        if self.metrics is not None:
            self._count(self.metrics, record)
        extra = {k: record[k] for k in (*_CARRIED, *_ASK_CARRIED) if k in record}
        extra["egress_seq"], extra["egress_ts"] = record["seq"], record.get("ts")
        self.audit.append(
            decision=record["decision"],
            actor=record.get("actor") or "egress",
            sandbox=record.get("sandbox"),
            tool=record.get("tool") or "egress",
            duration_ms=record.get("duration_ms"),
            bytes_out=record.get("bytes_out"),
            error=record.get("error"),
            extra=extra,
        )

    @staticmethod
    def _count(metrics: Metrics, record: Record) -> None:
        step = _ASK_STEPS.get(record["decision"])
        if step is not None:
            metrics.egress_approval(step or str(record.get("outcome") or "unknown"))
            return
        metrics.egress_decision(
            record["decision"],
            str(record.get("kind") or ""),
            int(record.get("bytes_up") or 0),
            int(record.get("bytes_out") or 0),
        )
