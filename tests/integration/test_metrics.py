"""``/metrics`` scraped from a real gateway and parsed with Prometheus' own parser: the
names follow Prometheus' rules and the numbers follow what happened."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway_harness import RunningGateway, running_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwm"), "20s") as running:
        yield running


def scrape(gw: RunningGateway) -> dict[str, object]:
    with gw.operator() as op:
        r = op.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(families: dict[str, object], name: str, suffix: str = "", **labels: str) -> float:
    """The sample ``name + suffix`` (``_total``, ``_count``, ... or none for a gauge)."""
    family = families[name]
    for sample in family.samples:  # type: ignore[attr-defined]
        if sample.name != name + suffix:
            continue
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    raise AssertionError(f"no sample of {name} with {labels}")


def test_names_types_and_labels_follow_prometheus_rules(gw: RunningGateway) -> None:
    families = scrape(gw)
    assert families, "nothing exposed"
    for name, family in families.items():
        assert name.startswith("agentbox_"), name
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), name
        kind = family.type  # type: ignore[attr-defined]
        if kind == "counter":
            assert not name.endswith("_total")  # the parser strips it; samples carry it
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)  # type: ignore[attr-defined]
        if "seconds" in name or "bytes" in name or "usd" in name:
            assert kind in ("counter", "histogram", "gauge")
        for sample in family.samples:  # type: ignore[attr-defined]
            for label_value in sample.labels.values():
                assert not label_value.startswith("sb-"), f"{name}: a sandbox id as a label"
    expected = {
        "agentbox_tool_calls": "counter",
        "agentbox_tool_call_duration_seconds": "histogram",
        "agentbox_sandboxes": "gauge",
        "agentbox_approvals_pending": "gauge",
        "agentbox_sandbox_create_duration_seconds": "histogram",
        "agentbox_egress_decisions": "counter",
        "agentbox_egress_approvals": "counter",
        "agentbox_lifecycle_events": "counter",
        "agentbox_provider_requests": "counter",
        "agentbox_model_tokens": "counter",
        "agentbox_model_cost_usd": "counter",
        "agentbox_budget_used_ratio": "gauge",
    }
    for name, kind in expected.items():
        assert name in families, f"{name} missing"
        assert families[name].type == kind, name  # type: ignore[attr-defined]


def test_the_numbers_follow_what_happened(gw: RunningGateway) -> None:
    before = scrape(gw)
    running_before = value(before, "agentbox_sandboxes", state="running")
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "64MiB", "disk": "32MiB",
                                             "network": "none", "idle_timeout": 0}).json()["id"]  # fmt: skip
        try:
            r = op.post(f"/v1/sandboxes/{sid}/commands", json={"command": "echo hi"})
            assert r.status_code == 200
            usage = op.get(f"/v1/sandboxes/{sid}").json()["usage"]  # what it uses right now
            assert usage["memory_bytes"] > 0 and usage["cpu_seconds"] >= 0
            after = scrape(gw)
            assert value(after, "agentbox_sandboxes", state="running") == running_before + 1
            created = value(
                after, "agentbox_sandbox_create_duration_seconds", "_count", source="cold"
            )
            assert created >= 1
            calls = value(
                after, "agentbox_tool_calls", "_total", tool="terminal_run", decision="allowed"
            )
            assert calls >= 1

            # a command waiting for a person shows as a pending approval
            def wait_for_approval() -> None:
                with gw.operator() as own:  # its own connection: this call blocks
                    own.post(f"/v1/sandboxes/{sid}/commands", json={"command": "rm -rf /tmp/x"})

            waiter = threading.Thread(target=wait_for_approval, daemon=True)
            waiter.start()
            for _ in range(100):  # bounded: 10 s
                if value(scrape(gw), "agentbox_approvals_pending") >= 1:
                    break
                time.sleep(0.1)
            assert value(scrape(gw), "agentbox_approvals_pending") >= 1
            pending = op.get("/v1/approvals", params={"status": "pending"}).json()
            for approval in pending:
                op.post(f"/v1/approvals/{approval['id']}/deny")
            waiter.join(30)
            assert value(scrape(gw), "agentbox_approvals_pending") == 0
        finally:
            op.delete(f"/v1/sandboxes/{sid}")
