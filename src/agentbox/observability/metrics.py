"""Prometheus metrics of one gateway (a registry per app: no module-level state).

Named by Prometheus' rules: prefix ``agentbox_``, base units (seconds, bytes, USD),
counters end in ``_total`` (the client adds it), labels of bounded cardinality only (tool
names, decisions, states, providers, models, projects; never sandbox ids or hosts).
Egress decisions come from the egress ingest (what the home's egress daemon decided);
sandboxes by state and pending approvals are read at scrape time. ``GET /metrics`` serves
the text exposition format to the operator token (Prometheus: ``authorization`` with
``credentials_file``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector


class Usage(Protocol):
    """Tokens as a provider counted them (``models.providers.types.Usage``; described
    here because the model endpoint records into these metrics, not the reverse)."""

    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def cache_read_tokens(self) -> int: ...

    @property
    def cache_write_tokens(self) -> int: ...


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
        self.egress_approvals = Counter(
            "agentbox_egress_approvals",
            "Egress mode ask: connections held, approvals requested (or rejoined after an "
            "egress daemon restart), and their outcomes (approved, denied, expired).",
            ["outcome"],
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
        self._tool_counters: dict[tuple[str, str], Counter] = {}  # see tool_call
        self._tool_timers: dict[str, Histogram] = {}

        self.create_seconds = Histogram(
            "agentbox_sandbox_create_duration_seconds",
            "Time to a usable sandbox, by how it was made (cold, pool, fork, restore).",
            ["source"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
        )
        self.provider_requests = Counter(
            "agentbox_provider_requests",
            "Requests to model providers, by provider, model and outcome (ok or a failure "
            "category: rate_limited, server_error, timeout, connection, auth, bad_request, "
            "malformed).",
            ["provider", "model", "outcome"],
            registry=self.registry,
        )
        self.provider_seconds = Histogram(
            "agentbox_provider_request_duration_seconds",
            "Duration of successful model requests (whole response), by provider.",
            ["provider"],
            registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.tokens = Counter(
            "agentbox_model_tokens",
            "Model tokens, by provider, model, project and direction: input (not from the "
            "prompt cache), cache_read, cache_write (input the provider's prompt cache served "
            "or stored, priced apart) or output; together, every token.",
            ["provider", "model", "project", "direction"],
            registry=self.registry,
        )
        self.cost = Counter(
            "agentbox_model_cost_usd",
            "Model cost from the configured price table, in US dollars.",
            ["provider", "model", "project"],
            registry=self.registry,
        )
        self.budget_used = Gauge(
            "agentbox_budget_used_ratio",
            "Share of a project's daily budget used (1 = spent), by kind (tokens or usd).",
            ["project", "kind"],
            registry=self.registry,
        )
        self.budget_alerts = Counter(
            "agentbox_budget_alerts",
            "Budget thresholds crossed, by project, kind and threshold.",
            ["project", "kind", "threshold"],
            registry=self.registry,
        )
        self._state = _StateCollector()
        self.registry.register(self._state)

    def observe_state(
        self,
        sandboxes_by_state: Callable[[], dict[str, int]],
        pending_approvals: Callable[[], int],
    ) -> None:
        """Where the scrape-time gauges read from (the store and the approvals)."""
        self._state.sandboxes_by_state = sandboxes_by_state
        self._state.pending_approvals = pending_approvals

    def observe_desktops(self, desktops: Callable[[], tuple[int, int]]) -> None:
        """Where the desktop gauges read from: (desktops running, their bytes)."""
        self._state.desktops = desktops

    def sandbox_created(self, source: str, seconds: float) -> None:
        self.create_seconds.labels(source).observe(seconds)

    def provider_request(self, provider: str, model: str, outcome: str, seconds: float) -> None:
        self.provider_requests.labels(provider, model, outcome).inc()
        if outcome == "ok":
            self.provider_seconds.labels(provider).observe(seconds)

    def usage(self, provider: str, model: str, project: str, usage: Usage, usd: float) -> None:
        cached = usage.cache_read_tokens + usage.cache_write_tokens
        self.tokens.labels(provider, model, project, "input").inc(
            max(0, usage.input_tokens - cached)
        )
        if usage.cache_read_tokens:
            self.tokens.labels(provider, model, project, "cache_read").inc(usage.cache_read_tokens)
        if usage.cache_write_tokens:
            self.tokens.labels(provider, model, project, "cache_write").inc(
                usage.cache_write_tokens
            )
        self.tokens.labels(provider, model, project, "output").inc(usage.output_tokens)
        self.cost.labels(provider, model, project).inc(usd)

    def budget(self, project: str, kind: str, ratio: float) -> None:
        self.budget_used.labels(project, kind).set(ratio)

    def budget_alert(self, project: str, kind: str, threshold: float) -> None:
        self.budget_alerts.labels(project, kind, f"{threshold:g}").inc()

    def lifecycle_event(self, event: str, reason: str) -> None:
        self.lifecycle.labels(event, reason).inc()

    def egress_decision(self, decision: str, kind: str, up: int, down: int) -> None:
        self.egress.labels(decision, kind or "unknown").inc()
        if up:
            self.egress_bytes.labels("up").inc(up)
        if down:
            self.egress_bytes.labels("down").inc(down)

    def egress_approval(self, outcome: str) -> None:
        self.egress_approvals.labels(outcome).inc()

    def tool_call(self, tool: str, decision: str, duration_ms: float | None) -> None:
        # Counted on every tool call: the labelled children are looked up once (``labels``
        # validates and locks each time: 8 % of a small fs_read's gateway work). The
        # callers bound the label values (known tools, a few decisions), so this stays small.
        counter = self._tool_counters.get((tool, decision))
        if counter is None:
            counter = self._tool_counters[(tool, decision)] = self.tool_calls.labels(tool, decision)
        counter.inc()
        if decision == "allowed" and duration_ms is not None:
            timer = self._tool_timers.get(tool)
            if timer is None:
                timer = self._tool_timers[tool] = self.tool_seconds.labels(tool)
            timer.observe(duration_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges read when scraped: cheap queries, always current, nothing to keep in sync."""

    STATES = ("creating", "pooled", "running", "paused", "stopped", "destroying", "error")

    def __init__(self) -> None:
        self.sandboxes_by_state: Callable[[], dict[str, int]] | None = None
        self.pending_approvals: Callable[[], int] | None = None
        self.desktops: Callable[[], tuple[int, int]] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.sandboxes_by_state is not None:
            family = GaugeMetricFamily(
                "agentbox_sandboxes", "Sandboxes of this home, by state.", labels=["state"]
            )
            counts = self.sandboxes_by_state()
            for state in sorted({*self.STATES, *counts}):
                family.add_metric([state], counts.get(state, 0))
            yield family
        if self.pending_approvals is not None:
            yield GaugeMetricFamily(
                "agentbox_approvals_pending",
                "Tool calls waiting for a person's decision.",
                value=self.pending_approvals(),
            )
        if self.desktops is not None:
            running, used = self.desktops()
            yield GaugeMetricFamily(
                "agentbox_desktops_running",
                "Desktops running on this host (capped by sandbox.desktop.max_running).",
                value=running,
            )
            yield GaugeMetricFamily(
                "agentbox_desktop_memory_bytes",
                "Memory of the running desktops together (PSS of their processes).",
                value=used,
            )
