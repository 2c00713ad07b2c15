"""Admission control: over a limit a create is refused with a clear error and a retry
hint, checked atomically (concurrent creators cannot overshoot), and through the gateway
as 503 / 429 with Retry-After."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentbox.config.host import Admission
from agentbox.errors import CapacityExceeded, LimitExceeded, QuotaExceeded
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, running_gateway

SMALL = {"memory": "64MiB", "disk": "32MiB", "network": "none", "idle_timeout": 0}


@pytest.fixture
def admitting(agentbox_home: Path, host_ready: None) -> Iterator[Runtime]:
    runtime = Runtime(agentbox_home)
    before = {r.id for r in runtime.store.list()}
    yield runtime
    for record in runtime.store.list():
        if record.id not in before:
            runtime.destroy(record.id)


def live(runtime: Runtime) -> int:
    return sum(r.state in ("creating", "running", "paused") for r in runtime.store.list())


def test_host_limit_on_sandboxes(admitting: Runtime) -> None:
    admitting.admission = Admission(max_sandboxes=live(admitting) + 2)
    admitting.create(SMALL)
    admitting.create(SMALL)
    with pytest.raises(CapacityExceeded) as caught:
        admitting.create(SMALL)
    assert "max_sandboxes" in caught.value.message
    assert 1 <= caught.value.details["retry_after"] <= 300
    assert caught.value.http_status == 503


def test_concurrent_creates_never_overshoot(admitting: Runtime) -> None:
    admitting.admission = Admission(max_sandboxes=live(admitting) + 3)

    def create(_: int) -> str:
        try:
            return admitting.create(SMALL).id
        except CapacityExceeded:
            return "refused"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(create, range(8)))
    assert results.count("refused") == 5
    assert len({r for r in results if r != "refused"}) == 3


def test_committed_memory_limit(admitting: Runtime) -> None:
    committed = sum(
        r.spec.memory for r in admitting.store.list()
        if r.state in ("creating", "running", "paused")
    )  # fmt: skip
    admitting.admission = Admission(max_memory=committed + 200 * 2**20)
    admitting.create({**SMALL, "memory": "128MiB"})
    with pytest.raises(CapacityExceeded, match="ask for less memory"):
        admitting.create({**SMALL, "memory": "128MiB"})
    admitting.create({**SMALL, "memory": "64MiB"})  # what still fits is admitted


def test_project_quota(admitting: Runtime) -> None:
    admitting.admission = Admission(max_per_project=1)
    admitting.create({**SMALL, "project": "team-a"})
    with pytest.raises(QuotaExceeded) as caught:
        admitting.create({**SMALL, "project": "team-a"})
    assert caught.value.http_status == 429 and caught.value.details["project"] == "team-a"
    admitting.create({**SMALL, "project": "team-b"})  # another project has its own quota


def test_a_refusal_leaves_nothing(admitting: Runtime) -> None:
    admitting.admission = Admission(max_sandboxes=live(admitting))
    before = admitting.store.list()
    with pytest.raises(LimitExceeded):
        admitting.create(SMALL)
    assert [r.id for r in admitting.store.list()] == [r.id for r in before]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwa")) as running:
        yield running


def test_gateway_answers_503_and_429_with_retry_after(gw: RunningGateway) -> None:
    runtime = gw.app.state.parts.gateway.runtime
    body = {**SMALL, "project": "p1"}
    made: list[str] = []
    with gw.operator() as op:
        try:
            runtime.admission = Admission(max_per_project=1)
            r = op.post("/v1/sandboxes", json=body)
            assert r.status_code == 201, r.text
            made.append(r.json()["id"])
            r = op.post("/v1/sandboxes", json=body)
            assert r.status_code == 429 and r.json()["error"]["code"] == "quota_exceeded"
            assert int(r.headers["Retry-After"]) >= 1
            runtime.admission = Admission(max_sandboxes=live(runtime))
            r = op.post("/v1/sandboxes", json={**body, "project": "p2"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "capacity_exceeded"
            assert int(r.headers["Retry-After"]) >= 1
        finally:
            runtime.admission = Admission()
            for sid in made:
                op.delete(f"/v1/sandboxes/{sid}")
