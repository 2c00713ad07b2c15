"""The stores' contract, run on SQLite and on PostgreSQL (``state``, tests/pgkit.py): the
sandbox registry, the task queue and its leases, E2B's table; then what only PostgreSQL
has: migrations, and a server that restarts under a running store.

Tokens, approvals and the usage ledger have theirs in test_gateway_auth.py and
test_providers.py, on the same fixture."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from agentbox.config.host import Admission
from agentbox.config.settings import E2BSettings, parse_settings
from agentbox.config.specs import SandboxSpec
from agentbox.errors import (
    CapacityExceeded,
    Conflict,
    InvalidConfig,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    SchemaMismatch,
    StateUnavailable,
)
from agentbox.gateway.auth import TokenStore
from agentbox.gateway.e2b.access import Caller, E2BAccess
from agentbox.runtime.store import Store
from agentbox.state import open_shared
from agentbox.state.migrations import LATEST
from agentbox.state.postgres import PostgresDB, migrate
from agentbox.tasks.store import TaskStore
from pgkit import PgServer, StateKit
from s3kit import free_port

T = TypeVar("T")
AGENTBOX = str(Path(sys.executable).parent / "agentbox")
MiB = 2**20


def spec(project: str = "p", memory: int = 64 * MiB) -> SandboxSpec:
    return SandboxSpec(project=project, memory=memory)


# the sandbox registry ---------------------------------------------------------------------
def test_registry_records_and_lifecycle(state: StateKit) -> None:
    store = Store(state.where("state"))
    first = store.reserve("sb-a", "default", "d1", spec(), None, 8)
    second = store.reserve("sb-b", "debian", "d2", spec(), time.time() - 1, 8)
    assert (first.slot, second.slot, first.state) == (0, 1, "creating")
    store.mark_running("sb-a", 4242, 99)
    got = store.get("sb-a")
    assert got is not None and (got.state, got.init_pid, got.init_start_time) == (
        "running", 4242, 99)  # fmt: skip
    assert got.spec == spec() and got.to_dict()["project"] == "p"
    assert store.running_in_slot(0) == "sb-a" and store.running_in_slot(1) is None
    by_slot = store.by_slot(1)
    assert by_slot is not None and by_slot.id == "sb-b"
    assert [r.id for r in store.list()] == ["sb-a", "sb-b"]
    assert [r.id for r in store.expired(time.time())] == ["sb-b"]
    store.set_expiry("sb-b", None)
    assert store.expired(time.time()) == []
    store.set_state("sb-b", "paused")
    assert store.count_by_state() == {"running": 1, "paused": 1}
    assert store.template_digests() == {"d1", "d2"}
    store.delete("sb-a")
    assert store.get("sb-a") is None
    assert store.reserve("sb-c", "default", "d1", spec(), None, 8).slot == 0  # reused
    with pytest.raises(Exception, match="maximum"):
        store.reserve("sb-d", "default", "d1", spec(), None, 2)


def test_registry_admission_limits(state: StateKit) -> None:
    store = Store(state.where("state"))
    store.reserve("sb-1", "t", "d", spec("a", 512 * MiB), time.time() + 60, 16)
    with pytest.raises(CapacityExceeded, match="max_sandboxes") as full:
        store.reserve("sb-2", "t", "d", spec(), None, 16, Admission(max_sandboxes=1))
    assert 1 <= full.value.details["retry_after"] <= 60
    with pytest.raises(CapacityExceeded, match="max_memory"):
        store.reserve("sb-2", "t", "d", spec("b", 600 * MiB), None, 16,
                      Admission(max_memory=1024 * MiB))  # fmt: skip
    with pytest.raises(QuotaExceeded, match="'a'"):
        store.reserve("sb-2", "t", "d", spec("a"), None, 16, Admission(max_per_project=1))
    store.reserve("sb-2", "t", "d", spec("b"), None, 16, Admission(max_per_project=1))
    assert store.count_by_state() == {"creating": 2}


def test_concurrent_creators_never_share_a_slot_or_overshoot(state: StateKit) -> None:
    stores = [Store(state.where("state")) for _ in range(4)]  # four processes' worth

    def create(n: int) -> int | None:
        try:
            record = stores[n % 4].reserve(f"sb-{n}", "t", "d", spec(), None, 64,
                                           Admission(max_sandboxes=10))  # fmt: skip
        except CapacityExceeded:
            return None
        return record.slot

    with ThreadPoolExecutor(8) as pool:
        slots = [s for s in pool.map(create, range(24)) if s is not None]
    assert sorted(slots) == list(range(10))  # ten admitted, each its own slot


# Records as earlier versions wrote them (json.dumps of SandboxSpec.model_dump() plus the
# warm pool's key; before that, the network as a mode string, or no network at all).
TODAY = {
    "template": "default", "isolation": "namespaces", "memory": 134217728, "pids": 512,
    "cpus": 2.0, "disk": 67108864, "lifetime": 86400.0, "idle_timeout": 900.0,
    "on_idle": "pause", "network": {"mode": "allowlist", "ask_timeout": 60.0,
    "allow": ["pypi.org"], "ports": [80, 443], "hosts": {"a.test": "127.0.0.1"}, "deny": [],
    "credentials": []}, "env": {"A": "1"}, "project": "team-x", "pool": "k1",
}  # fmt: skip
MODE_ONLY = {"memory": 134217728, "network": "open", "project": "p", "retired_key": 1}
NO_NETWORK = {"memory": 134217728}


@pytest.mark.parametrize("stored", [TODAY, MODE_ONLY, NO_NETWORK], ids=["today", "mode", "none"])
def test_records_written_by_earlier_versions_load(state: StateKit, stored: dict[str, Any]) -> None:
    store = Store(state.where("state"))
    with store.db.tx() as db:
        db.execute(
            "INSERT INTO sandboxes (id, slot, state, template, template_digest, init_pid,"
            " init_start_time, created_at, expires_at, spec)"
            " VALUES ('sb-old', 3, 'running', 'default', 'd', 7, 8, 1.0, NULL, ?)",
            (json.dumps(stored),),
        )
    record = store.get("sb-old")
    assert record is not None and record.state == "running" and record.slot == 3
    network = stored.get("network", "none")
    mode = network if isinstance(network, str) else network["mode"]
    assert record.spec.memory == 128 * MiB and record.spec.network.mode == mode
    assert record.network_mode == mode and record.isolation == "namespaces"
    assert record.to_dict()["memory"] == 128 * MiB
    if stored is TODAY:
        assert record.pool == "k1" and record.env == {"A": "1"}
        assert record.spec.network.hosts == {"a.test": "127.0.0.1"}
        assert record.spec.network.allow == ("pypi.org",) and record.spec.project == "team-x"
    assert [r.id for r in store.list()] == ["sb-old"]


def test_a_record_with_a_network_this_version_refuses_loads_without_egress(
    state: StateKit, caplog: pytest.LogCaptureFixture
) -> None:
    """Older versions stored allow=['bad..name']: the record still loads (idle timeouts,
    listings), its network reads as none (what the egress daemon gives it) and says why."""
    store = Store(state.where("state"))
    sid = f"sb-{secrets.token_hex(6)}"  # logged once per sandbox and process: a new one
    loose = {**TODAY, "network": {"mode": "allowlist", "allow": ["bad..name"]}}
    with store.db.tx() as db:
        db.execute(
            "INSERT INTO sandboxes (id, slot, state, template, template_digest, created_at,"
            " spec) VALUES (?, 4, 'running', 'default', 'd', 1.0, ?)",
            (sid, json.dumps(loose)),
        )
    record = store.get(sid)
    assert record is not None
    with caplog.at_level("WARNING"):
        assert record.spec.network.mode == "none" and record.spec.memory == 128 * MiB
    assert sid in caplog.text and "bad..name" in caplog.text
    assert record.network_mode == "allowlist"  # as stored; the daemon applies none
    with store.db.tx() as db:
        db.execute("UPDATE sandboxes SET spec=? WHERE id=?", (json.dumps({"memory": 1}), sid))
    broken = store.get(sid)
    assert broken is not None
    with pytest.raises(InvalidRequest, match="memory"):
        broken.spec  # noqa: B018 - any other field this version refuses is an error


def test_warm_pool_claims_are_exclusive(state: StateKit) -> None:
    store = Store(state.where("state"))
    for n in range(3):
        store.reserve(f"warm-{n}", "t", "d", spec(), None, 16, pool="k")
        store.mark_running(f"warm-{n}", 100 + n, 1, state="pooled")
    assert [r.id for r in store.pooled("k")] == ["warm-0", "warm-1", "warm-2"]
    assert store.take_pooled("warm-2") and not store.take_pooled("warm-2")
    claimers = [Store(state.where("state")) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda s: s.claim("k", "d", spec("q"), 60, 3600), claimers))
    claimed = sorted(r.id for r in got if r is not None)
    assert claimed == ["warm-0", "warm-1"]  # two warm ones, two claimers served
    record = store.get("warm-0")
    assert record is not None and record.state == "running" and record.spec.project == "q"
    assert record.pool is None  # claimed: no longer a pool's
    assert store.claim("k", "other-digest", spec(), 60, 3600) is None


def test_lifecycle_events_in_order(state: StateKit) -> None:
    store = Store(state.where("state"))
    writers = [Store(state.where("state")) for _ in range(3)]

    def write(n: int) -> int:
        return writers[n % 3].add_event(f"sb-{n % 2}", "created", "test", "me", {"n": n})

    with ThreadPoolExecutor(3) as pool:
        ids = list(pool.map(write, range(30)))
    assert sorted(ids) == list(range(1, 31)) and store.last_event_id() == 30
    events = store.events_after(10, limit=5)
    assert [e["id"] for e in events] == [11, 12, 13, 14, 15]
    assert all(e["sandbox"] == "sb-1" for e in store.events_after(0, sandbox="sb-1"))
    assert {e["details"]["n"] for e in store.events_after(0)} == set(range(30))


# the task queue ---------------------------------------------------------------------------
def test_task_queue_steps_and_finish(state: StateKit) -> None:
    tasks = TaskStore(state.where("tasks"))
    task = tasks.submit("fix the tests", "default", "p", 10)
    assert task.state == "queued" and tasks.claim("w1", 30) is not None
    assert tasks.claim("w2", 30) is None  # only one task
    assert tasks.renew(task.id, "w1", 30) and not tasks.renew(task.id, "w2", 30)
    tasks.set_sandbox(task.id, "sb-1")
    tasks.add_step(task.id, 1, {"tool": "terminal_run"}, {"error": "boom"}, (10, 5), 0.25)
    tasks.add_step(task.id, 2, {"say": "done"}, {}, (3, 4), 0.5)
    with pytest.raises(Exception):  # noqa: B017 - each driver's IntegrityError: never twice
        tasks.add_step(task.id, 2, {"say": "again"}, {}, (1, 1), 1.0)
    tasks.add_usage(task.id, (1, 1), 0.25)
    tasks.finish(task.id, "succeeded", result="ok")
    tasks.finish(task.id, "failed", failure="error")  # a final state stays
    done = tasks.get(task.id)
    assert (done.state, done.steps, done.tool_calls, done.tool_errors) == ("succeeded", 2, 1, 1)
    assert (done.tokens_in, done.tokens_out, done.cost_usd, done.sandbox) == (14, 10, 1.0, "sb-1")
    assert [s.n for s in tasks.steps(task.id)] == [1, 2]
    assert tasks.steps(task.id)[0].result == {"error": "boom"}
    with pytest.raises(Conflict):
        tasks.request_cancel(task.id)
    queued = tasks.submit("later", "default", "p", 5)
    assert tasks.request_cancel(queued.id).state == "cancelled"
    assert [t.id for t in tasks.list("cancelled")] == [queued.id]
    with pytest.raises(NotFound):
        tasks.get("task-nope")


def test_two_workers_never_take_the_same_task(state: StateKit) -> None:
    TaskStore(state.where("tasks")).close()
    submitted = {TaskStore(state.where("tasks")).submit(f"g{n}", "t", "p", 3).id
                 for n in range(20)}  # fmt: skip
    workers = [TaskStore(state.where("tasks")) for _ in range(4)]
    taken: dict[str, list[str]] = {f"w{n}": [] for n in range(4)}
    start = threading.Barrier(4)

    def work(n: int) -> None:
        start.wait()  # all four ask at once
        while (task := workers[n].claim(f"w{n}", 60)) is not None:
            taken[f"w{n}"].append(task.id)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))
    every = [t for ids in taken.values() for t in ids]
    assert sorted(every) == sorted(submitted)  # each task taken exactly once
    assert all(t.attempts == 1 for t in workers[0].list("running"))


def test_an_expired_lease_is_taken_again(state: StateKit) -> None:
    tasks = TaskStore(state.where("tasks"))
    task = tasks.submit("goal", "t", "p", 3)
    claimed = tasks.claim("dead-worker", 0.05)
    assert claimed is not None and claimed.id == task.id
    tasks.add_step(task.id, 1, {"say": "step one"}, {}, (1, 1), 0.0)
    assert tasks.claim("w2", 60) is None  # leased
    requeued = poll(lambda: tasks.requeue_expired() or None)
    assert requeued == [task.id]
    again = TaskStore(state.where("tasks")).claim("w2", 60)
    assert again is not None and (again.id, again.worker, again.attempts, again.steps) == (
        task.id, "w2", 2, 1)  # fmt: skip
    assert not tasks.renew(task.id, "dead-worker", 60)  # the old lease is gone


# E2B's table ------------------------------------------------------------------------------
def test_e2b_ownership_records(state: StateKit, tmp_path: Path) -> None:
    tokens = TokenStore(state.where("gateway"), "operator-token-0123456789abcdef", 60)
    access = E2BAccess(E2BSettings(), tokens, tmp_path, b"k" * 32)
    assert access.db is tokens.db or state.backend == "sqlite"
    access.record("sb-1", Caller("ci", None), "base", {"a": "1"})
    access.record("sb-1", Caller("ci", None), "python", {"b": "2"})  # an upsert
    access.record("sb-2", Caller("operator", None), "base", {})
    owned = access.owned("sb-1")
    assert owned is not None and (owned.alias, owned.metadata) == ("python", {"b": "2"})
    assert set(access.all_owned()) == {"sb-1", "sb-2"}
    access.forget("sb-1")
    assert access.owned("sb-1") is None and set(access.all_owned()) == {"sb-2"}


# PostgreSQL only: schema versions, a restarting server ------------------------------------
def test_migrate_is_idempotent_and_refuses_a_newer_schema(postgres: PgServer) -> None:
    url = postgres.new_database()
    with pytest.raises(SchemaMismatch, match="agentbox db migrate"):
        TokenStore(PostgresDB(url), "operator-token-0123456789abcdef", 60).list()
    assert migrate(url) == (0, list(range(1, LATEST + 1)))
    assert migrate(url) == (LATEST, [])
    with ThreadPoolExecutor(3) as pool:  # concurrent runs: one applies, the others wait
        assert list(pool.map(lambda _: migrate(url), range(3))) == [(LATEST, [])] * 3
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_version VALUES (%s, 'future', 0)", (LATEST + 1,))
    with pytest.raises(SchemaMismatch, match="upgrade agentbox"):
        migrate(url)
    with pytest.raises(SchemaMismatch, match="newer than this agentbox"):
        TaskStore(PostgresDB(url)).list()


def test_stores_outlive_a_postgresql_restart(postgres: PgServer) -> None:
    url = postgres.new_database()
    migrate(url)
    db = PostgresDB(url)
    tokens = TokenStore(db, "operator-token-0123456789abcdef", 60)
    tasks, registry = TaskStore(db), Store(db)
    token, _ = tokens.issue("sb-1")
    task = tasks.submit("goal", "t", "p", 3)
    registry.reserve("sb-1", "t", "d", spec(), None, 8)

    postgres.restart()  # every connection is cut
    # Each store's next call works, or fails with the typed, retryable error and then works.
    assert retry_once(lambda: tokens.authenticate(token)).sandbox_id == "sb-1"
    assert retry_once(lambda: tasks.claim("w", 30)).id == task.id  # type: ignore[union-attr]
    assert retry_once(lambda: registry.set_state("sb-1", "running")) is None
    assert retry_once(lambda: tokens.issue("sb-2"))[1].sandbox == "sb-2"

    postgres.stop()
    try:
        with pytest.raises(StateUnavailable) as down:
            tokens.authenticate(token)
        assert down.value.code == "state_unavailable" and down.value.http_status == 503
        assert down.value.details["retry_after"] > 0 and "127.0.0.1" in down.value.message
        with pytest.raises(StateUnavailable):
            tasks.submit("while down", "t", "p", 3)
    finally:
        postgres.start()
    assert retry_once(lambda: registry.get("sb-1")).state == "running"  # type: ignore[union-attr]
    assert [t.id for t in retry_once(lambda: tasks.list())] == [task.id]


def test_a_wait_for_a_decision_outlives_a_postgresql_outage(postgres: PgServer) -> None:
    """A person's decision arrives after the shared database was away for a while: the
    waiting call gets it (it used to raise the outage at the waiter, ending the wait)."""
    import asyncio

    from agentbox.policy.approvals import ApprovalStore

    url = postgres.new_database()
    migrate(url)
    dbs = PostgresDB(url), PostgresDB(url)
    waiting, deciding = ApprovalStore(dbs[0]), ApprovalStore(dbs[1])
    asked = waiting.request("sb-1", "terminal_run", "rm -rf x", "h", "agent", "r", 60)

    down = False

    async def scenario() -> str:
        nonlocal down
        waiter = asyncio.create_task(waiting.wait(asked.id))
        await asyncio.sleep(0.3)  # the wait is under way
        down = True
        await asyncio.to_thread(postgres.stop)
        await asyncio.sleep(1.5)  # at least two of the waiter's reads find it away
        await asyncio.to_thread(postgres.start)
        down = False
        await asyncio.to_thread(retry_once, lambda: deciding.decide(asked.id, True, "alice"))
        return (await asyncio.wait_for(waiter, 30)).status

    try:
        assert asyncio.run(scenario()) == "approved"
    finally:
        if down:
            postgres.start()
        for db in dbs:
            db.close()


def test_single_host_default_opens_no_shared_database() -> None:
    assert parse_settings("").gateway.state == "sqlite"
    assert open_shared("sqlite") is None
    legacy = parse_settings("gateway:\n  state: sqlite:///var/lib/agentbox/state.db\n")
    assert legacy.gateway.state == "sqlite"  # the home's files, wherever the URL pointed
    shared = open_shared("postgresql://agentbox@127.0.0.1:1/agentbox")
    assert isinstance(shared, PostgresDB)  # nothing connects until a store asks


def retry_once(call: Callable[[], T]) -> T:
    try:
        return call()
    except StateUnavailable:
        return call()


def poll(check: Callable[[], T | None], timeout: float = 10.0) -> T:
    deadline = time.monotonic() + timeout
    while (found := check()) is None:
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return found


def test_db_migrate_command(postgres: PgServer, tmp_path: Path, agentbox_home: Path) -> None:
    url = postgres.new_database()
    config = tmp_path / "gateway.yaml"
    config.write_text(f"gateway:\n  state: {url}\n")

    def agentbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENTBOX, "db", "migrate", *args], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip

    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home),
           "AGENTBOX_OPERATOR_TOKEN": "operator-token-0123456789abcdef"}  # fmt: skip
    config.write_text(f"gateway:\n  listen: 127.0.0.1:{free_port()}\n  state: {url}\n")
    serve = subprocess.run([AGENTBOX, "serve", "--config", str(config)], env=env, text=True,
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    assert serve.returncode == 1 and "error[schema_mismatch]" in serve.stderr  # not migrated
    assert "run `agentbox db migrate`" in serve.stderr
    first = agentbox("--config", str(config))
    applied = ", ".join(str(v) for v in range(1, LATEST + 1))
    assert first.returncode == 0 and f"applied {applied} (was 0)" in first.stdout, first.stderr
    again = agentbox("--url", url, "--json")
    assert json.loads(again.stdout) == {"state": "postgresql", "before": LATEST,
                                        "applied": [], "version": LATEST}  # fmt: skip
    assert "nothing to migrate" in agentbox().stdout  # no config: the embedded sqlite
    leaked = agentbox("--url", url.replace("postgres@", "postgres:hunter2@"))
    assert leaked.returncode == 1 and "error[invalid_config]" in leaked.stderr
    assert "hunter2" not in leaked.stderr and "PGPASSWORD" in leaked.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_version VALUES (%s, 'future', 0)", (LATEST + 1,))
    newer = agentbox("--url", url)
    assert newer.returncode == 1 and "error[schema_mismatch]" in newer.stderr
    assert "upgrade agentbox" in newer.stderr
    down = agentbox("--url", "postgresql://postgres@127.0.0.1:1/nothing")
    assert down.returncode == 1 and "error[state_unavailable]" in down.stderr


def test_a_state_password_never_sits_in_the_config_nor_in_its_errors() -> None:
    for url in ("postgresql://agentbox:hunter2@db:5432/a", "postgres://:hunter2@db/a"):
        with pytest.raises(InvalidConfig, match="PGPASSWORD") as err:
            parse_settings(f"gateway:\n  state: {url}\n", "g.yaml")
        assert "hunter2" not in err.value.message and "g.yaml:2" in err.value.message
    with pytest.raises(InvalidConfig, match="postgresql://USER@HOST"):
        parse_settings("gateway:\n  state: mysql://agentbox@db/a\n")
    # Any refused URL-valued setting masks its password the same way.
    with pytest.raises(InvalidConfig) as err:
        parse_settings("telemetry:\n  otlp_endpoint: ftp://u:hunter2@collector/\n")
    assert "hunter2" not in err.value.message and "u:***@" in err.value.message
