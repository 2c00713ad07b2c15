"""Warm pools: a matching create claims a ready sandbox (with the request's own
environment, lifetime and project), pooled ones are unreachable until claimed, count
against admission, and the keeper tops the pool up and replaces stale ones."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentbox
from agentbox.config.host import Admission
from agentbox.errors import CapacityExceeded, SandboxNotRunning
from agentbox.runtime import template_tiers
from agentbox.runtime.runtime import Runtime, pool_key
from agentbox.runtime.spec_input import spec_from
from agentbox.runtime.warmpool import Pool, PoolKeeper
from gateway_harness import running_gateway

BASE = {"memory": "64MiB", "disk": "32MiB", "network": "none", "idle_timeout": 0}


@pytest.fixture
def runtime(agentbox_home: Path, host_ready: None) -> Iterator[Runtime]:
    rt = Runtime(agentbox_home)
    before = {r.id for r in rt.store.list()}
    yield rt
    for record in rt.store.list():
        if record.id not in before:
            rt.destroy(record.id)


def test_a_matching_create_claims_a_warm_sandbox(runtime: Runtime) -> None:
    spec = spec_from(BASE)
    warm = runtime.fill_pool(spec)
    assert runtime.get(warm.id).state == "pooled"
    with pytest.raises(SandboxNotRunning):
        runtime.commands(warm.id)  # unreachable until claimed
    start = time.perf_counter()
    claimed = runtime.create({**BASE, "env": {"WHO": "claimer"}, "lifetime": 600,
                              "project": "team-x"})  # fmt: skip
    assert time.perf_counter() - start < 1.0
    assert claimed.id == warm.id and claimed.state == "running"
    assert claimed.spec.project == "team-x" and claimed.pool is None
    assert claimed.from_pool and runtime.get(claimed.id).to_dict()["from_pool"]
    assert claimed.expires_at is not None and abs(claimed.expires_at - time.time() - 600) < 5
    r = runtime.commands(claimed.id).run("echo $WHO; hostname")
    assert r.stdout == f"claimer\n{claimed.id}\n"
    types = [(e["type"], e["reason"]) for e in runtime.store.events_after(0, sandbox=warm.id)]
    assert types == [("pooled", "pool"), ("created", "operator")]
    # no warm one left: the next create is a cold one
    cold = runtime.create(BASE)
    assert cold.id != warm.id and not cold.from_pool


def test_only_the_fixed_settings_must_match(runtime: Runtime) -> None:
    spec = spec_from(BASE)
    warm = runtime.fill_pool(spec)
    assert pool_key(spec_from({**BASE, "env": {"A": "1"}, "lifetime": 60})) == pool_key(spec)
    assert runtime.create({**BASE, "memory": "96MiB"}).id != warm.id  # a different size
    assert runtime.get(warm.id).state == "pooled"


def test_pooled_sandboxes_count_against_admission(runtime: Runtime) -> None:
    runtime.fill_pool(spec_from(BASE))
    live = sum(r.state in ("creating", "running", "paused", "pooled") for r in runtime.store.list())
    runtime.admission = Admission(max_sandboxes=live)
    try:
        with pytest.raises(CapacityExceeded):
            runtime.create({**BASE, "memory": "96MiB"})
        runtime.create(BASE)  # but a claim takes no new room
    finally:
        runtime.admission = Admission()


def test_a_claimed_sandbox_is_never_recycled(runtime: Runtime) -> None:
    warm = runtime.fill_pool(spec_from(BASE))
    claimed = runtime.create(BASE)
    assert claimed.id == warm.id
    assert runtime.recycle(warm.id) is False  # the keeper lost the race: nothing happens
    assert runtime.commands(warm.id).run("true").exit_code == 0


def test_the_keeper_fills_and_refills(runtime: Runtime) -> None:
    spec = spec_from(BASE)
    keeper = PoolKeeper(runtime, [Pool(spec, 2)])
    while keeper.refill_once(keeper.pools[0]):
        pass
    pooled = runtime.store.pooled(pool_key(spec))
    assert [r.state for r in pooled] == ["pooled", "pooled"]
    runtime.create(BASE)
    assert len(runtime.store.pooled(pool_key(spec))) == 1
    assert keeper.refill_once(keeper.pools[0]) is True
    assert len(runtime.store.pooled(pool_key(spec))) == 2
    assert keeper.refill_once(keeper.pools[0]) is False  # full


def test_the_keeper_thread_runs_until_stopped(runtime: Runtime) -> None:
    spec = spec_from(BASE)
    keeper = PoolKeeper(runtime, [Pool(spec, 1)], interval=0.2)

    def ready(besides: str | None = None) -> list[str]:
        # Members still being made are listed too: only a finished one counts.
        return [r.id for r in runtime.store.pooled(pool_key(spec))
                if r.state == "pooled" and r.id != besides]  # fmt: skip

    keeper.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ready():
            time.sleep(0.1)
        assert ready(), "the keeper did not fill its pool"
        first = runtime.create(BASE)
        keeper.wake()
        while time.monotonic() < deadline and not ready(besides=first.id):
            time.sleep(0.1)
        assert ready(besides=first.id), "the keeper did not refill its pool"
    finally:
        keeper.stop()


def test_a_claim_in_another_process_wakes_the_keeper(runtime: Runtime, agentbox_home: Path) -> None:
    """An SDK script on the gateway's home claims a warm sandbox: the keeper hears of it
    on its socket and refills at once, not at its interval (an hour here)."""
    spec = spec_from(BASE)
    keeper = PoolKeeper(runtime, [Pool(spec, 1)], interval=3600)

    def ready() -> list[str]:
        return [r.id for r in runtime.store.pooled(pool_key(spec)) if r.state == "pooled"]

    while keeper.refill_once(keeper.pools[0]):
        pass
    (warm,) = ready()
    keeper.start()  # full: it sleeps until woken
    try:
        assert keeper.listener.listening
        script = (
            "import sys; from pathlib import Path; from agentbox.runtime.runtime import Runtime;"
            f" print(Runtime(Path(sys.argv[1])).create({BASE!r}).id)"
        )
        env = {**os.environ, "PYTHONPATH": str(Path(agentbox.__file__).parents[1])}
        out = subprocess.run([sys.executable, "-c", script, str(agentbox_home)], env=env,
                             capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
        assert out.stdout.strip() == warm  # the other process claimed the warm one
        deadline = time.monotonic() + 120
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready() and ready() != [warm], "the keeper was not woken by the claim"
    finally:
        keeper.stop()
    assert not Path(keeper.listener.path).exists()  # its socket goes with it


def test_a_gateway_keeps_its_pool_and_serves_creates_from_it(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, runtime: Runtime
) -> None:
    sandbox = (
        "sandbox:\n  limits: {memory: 64MiB, disk: 32MiB, idle_timeout: 0}\n"
        "  network: {mode: none}\n  warm_pool: 2\n"
    )
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwp"), extra_yaml=sandbox) as gw:
        key = pool_key(spec_from({**BASE, "lifetime": "24h"}))

        def pooled() -> list[str]:
            return [r.id for r in runtime.store.pooled(key) if r.state == "pooled"]

        deadline = time.monotonic() + 60
        while len(pooled()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pooled()) == 2, "the gateway did not fill its pool"
        warm = set(pooled())
        with gw.operator() as op:
            r = op.post("/v1/sandboxes", json={"env": {"X": "1"}})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            assert sid in warm and r.json()["state"] == "running"
            r = op.post(f"/v1/sandboxes/{sid}/commands", json={"command": "echo $X"})
            assert r.json()["stdout"] == "1\n"
            while (len(pooled()) < 2 or sid in pooled()) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(pooled()) == 2 and sid not in pooled()  # refilled
            op.delete(f"/v1/sandboxes/{sid}")
    for sandbox_id in pooled():  # the runtime fixture removes them too; be explicit
        runtime.recycle(sandbox_id)


def test_a_pool_keeps_its_template_tier(runtime: Runtime, agentbox_home: Path) -> None:
    """A template on gvisor: its pool fills gvisor sandboxes, which its creates claim."""
    template_tiers.set_default_tier(agentbox_home, "default", "gvisor")
    try:
        keeper = PoolKeeper(runtime, [Pool(spec_from(BASE), 1)])
        assert keeper.refill_once(keeper.pools[0])
        (warm,) = [r for r in runtime.store.list() if r.state == "pooled"]
        assert warm.isolation == "gvisor"
        assert keeper.refill_once(keeper.pools[0]) is False  # the pool counts it as its own
        claimed = runtime.create(BASE)
        assert claimed.id == warm.id and claimed.from_pool and claimed.isolation == "gvisor"
        assert runtime.commands(claimed.id).run("uname -r").stdout.startswith("4.4.0")
    finally:
        template_tiers.set_default_tier(agentbox_home, "default", None)
