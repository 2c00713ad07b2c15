"""Two real gateways whose ``gateway.state`` is one PostgreSQL database (tests/pgkit.py):
a session token issued by one works on the other and dies on both when revoked, and an
approval one of them waits for is decided through the other.

They share the home too (its sandbox registry), as single-host replicas would until the
node role exists; what PostgreSQL holds is checked in the database itself."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from agentbox.state.postgres import migrate
from gateway_harness import RunningGateway, running_gateway
from pgkit import PgServer


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None,
    postgres: PgServer,
) -> Iterator[tuple[RunningGateway, RunningGateway, str]]:  # fmt: skip
    url = postgres.new_database()
    migrate(url)
    with (
        running_gateway(agentbox_home, tmp_path_factory.mktemp("a"), state=url) as a,
        running_gateway(agentbox_home, tmp_path_factory.mktemp("b"), state=url) as b,
    ):
        yield a, b, url


def test_tokens_and_approvals_are_shared_by_replicas(
    replicas: tuple[RunningGateway, RunningGateway, str],
) -> None:
    a, b, url = replicas
    with a.operator() as op:
        created = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"})
        assert created.status_code == 201, created.text
        sandbox = created.json()["id"]
        issued = op.post("/v1/tokens", json={"sandbox": sandbox}).json()
    try:
        token, token_id = issued["token"], issued["id"]
        with b.client(token) as c:  # issued by A, honoured by B
            r = c.post(f"/v1/sandboxes/{sandbox}/commands", json={"command": "echo hi"})
            assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text

        # A waits for a person; the operator answers through B.
        answered = threading.Event()

        def approve_through_b() -> None:
            with b.operator() as op:
                while not answered.wait(0.05):
                    pending = op.get("/v1/approvals", params={"status": "pending"}).json()
                    mine = [p for p in pending if p["sandbox"] == sandbox]
                    if mine:
                        assert op.post(f"/v1/approvals/{mine[0]['id']}/approve").status_code < 300
                        return

        helper = threading.Thread(target=approve_through_b)
        helper.start()
        try:
            with a.client(token) as c:
                r = c.post(f"/v1/sandboxes/{sandbox}/commands",
                           json={"command": "mkdir -p /tmp/x && rm -rf /tmp/x"})  # fmt: skip
        finally:
            answered.set()
            helper.join(10)
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text

        with psycopg.connect(url) as conn:  # the rows are in PostgreSQL, not the home
            row = conn.execute("SELECT sandbox FROM gateway_tokens WHERE id = %s", (token_id,))
            assert row.fetchone() == (sandbox,)
            decided = conn.execute(
                "SELECT status FROM gateway_approvals WHERE sandbox = %s", (sandbox,)
            ).fetchall()
            assert decided == [("approved",)]
        home_db = a.home / "gateway.db"
        if home_db.exists():
            with sqlite3.connect(home_db) as local:
                found = local.execute(
                    "SELECT COUNT(*) FROM gateway_tokens WHERE id = ?", (token_id,)
                ).fetchone()
            local.close()
            assert found == (0,)

        with b.operator() as op:  # revoked on B: refused on A
            assert op.delete(f"/v1/tokens/{token_id}").status_code < 300
        with a.client(token) as c:
            r = c.post(f"/v1/sandboxes/{sandbox}/commands", json={"command": "true"})
            assert r.status_code == 401 and "revoked" in r.json()["error"]["message"], r.text
    finally:
        with a.operator() as op:
            op.delete(f"/v1/sandboxes/{sandbox}")


def test_readiness_follows_the_state_database(
    replicas: tuple[RunningGateway, RunningGateway, str], postgres: PgServer
) -> None:
    a, _, _ = replicas
    with a.client() as c:
        assert c.get("/readyz").status_code == 200
        postgres.stop()
        try:
            r = c.get("/readyz")
            assert r.status_code == 503, r.text
            [failing] = [f for f in r.json()["failing"] if f["name"] == "state database"]
            assert "unreachable" in failing["detail"] and "PostgreSQL" in failing["fix"]
        finally:
            postgres.start()
        r = c.get("/readyz")  # the first call after the restart reconnects
        assert r.status_code == 200, r.text
