"""Prometheus metrics of one gateway (a registry per app: no module-level state).

So far: egress decisions (fed by the egress ingest, so they count what the egress daemon
decided for this home) and tool calls with their latency. ``GET /metrics`` serves them in
the text exposition format, to the operator token (Prometheus: ``authorization`` with
``credentials_file``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.egress = Counter(
            "agentbox_egress_decisions",
            "Egress decisions of the home's proxy, by outcome and kind of connection.",
            ["decision", "kind"],
            registry=self.registry,
        )
        self.egress_bytes = Counter(
            "agentbox_egress_bytes",
            "Bytes relayed by the egress proxy for allowed connections, by direction.",
            ["direction"],
            registry=self.registry,
        )
        self.tool_calls = Counter(
            "agentbox_tool_calls",
            "Tool calls through the gateway, by tool and decision.",
            ["tool", "decision"],
            registry=self.registry,
        )
        self.lifecycle = Counter(
            "agentbox_lifecycle_events",
            "Sandbox lifecycle events, by type and reason.",
            ["event", "reason"],
            registry=self.registry,
        )
        self.tool_seconds = Histogram(
            "agentbox_tool_call_duration_seconds",
            "Duration of allowed tool calls, in seconds.",
            ["tool"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30, 120),
        )

    def lifecycle_event(self, event: str, reason: str) -> None:
        self.lifecycle.labels(event, reason).inc()

    def egress_decision(self, decision: str, kind: str, up: int, down: int) -> None:
        self.egress.labels(decision, kind or "unknown").inc()
        if up:
            self.egress_bytes.labels("up").inc(up)
        if down:
            self.egress_bytes.labels("down").inc(down)

    def tool_call(self, tool: str, decision: str, duration_ms: float | None) -> None:
        self.tool_calls.labels(tool, decision).inc()
        if decision == "allowed" and duration_ms is not None:
            self.tool_seconds.labels(tool).observe(duration_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
