"""1,000 nodes' connections to PostgreSQL: through PgBouncer in transaction mode
(``gateway.state: postgresql://…?pooler=transaction``, docs/cluster.md "Connections").

A real PostgreSQL with a small ``max_connections`` and a real PgBouncer in front: many
clients, each with its own connections as a node's threads hold them, run the cluster's
statements (heartbeats, reconcile reads, registry rows, the sweep's locked transaction)
past psycopg's prepare threshold, on a few server connections. Then a real node and a
real replica run through the pooler: a sandbox created, a command run with a session
token, destroyed; the connections each process holds are counted for docs/scale.md.
"""

from __future__ import annotations

import secrets
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterkit import running_cluster

from agentbox.cluster.registry import Registry
from agentbox.errors import StateUnavailable
from agentbox.state.db import state_url_error
from agentbox.state.postgres import PostgresDB, migrate, split_pooler
from pgbouncerkit import connections_of, running_pgbouncer
from pgkit import PgServer, running_postgres

MAX_CONNECTIONS = 25  # PostgreSQL's own limit here (3 of them reserved for superusers)
CLIENTS = 120  # each a node thread's connection: several times what the server takes
POOL = 4  # server connections PgBouncer opens per database
ROUNDS = 8  # past psycopg's prepare threshold (5 runs of one statement on a connection)


@pytest.fixture(scope="module")
def small_postgres() -> Iterator[PgServer]:
    with running_postgres(max_connections=MAX_CONNECTIONS) as server:
        yield server


def server_backends(server: PgServer, database: str) -> int:
    import psycopg

    with psycopg.connect(server.url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
            " AND backend_type = 'client backend'",
            (database,),
        ).fetchone()
        assert row is not None
        return int(row[0])


def run_clients(url: str, clients: int) -> tuple[list[BaseException], int]:
    """``clients`` threads, each holding its connection open while all connect (as a
    cluster's nodes do), then sending a node's statements ``ROUNDS`` times."""
    errors: list[BaseException] = []
    connected = threading.Barrier(clients, timeout=120)
    written = [0]
    lock = threading.Lock()

    def node(i: int) -> None:
        db = PostgresDB(url)
        registry = Registry(db)
        try:
            try:
                # Connected now, not at the first statement: a client that finished and hung
                # up before the last one connected would let the server take them all.
                db.conn().held()
            finally:
                connected.wait()  # every client connected (or failed) at once
            for k in range(ROUNDS):
                registry.on_node(f"n-{i}")
                registry.heartbeat(f"n-{i}", f"https://127.0.0.{i % 250 + 1}:9", {}, {"k": k})
                registry.claim(f"sb-{i}-{k}", f"n-{i}")
                if k % 4 == 0:
                    registry.sweep(3600.0)  # a transaction with an advisory lock
                with lock:
                    written[0] += 1
        except BaseException as e:
            errors.append(e)
        finally:
            db.close()

    threads = [threading.Thread(target=node, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors, written[0]


def test_more_clients_than_postgresql_takes_share_a_few_connections(
    small_postgres: PgServer,
) -> None:
    database = "t_" + secrets.token_hex(4)
    small_postgres.sql(f"CREATE DATABASE {database}")
    migrate(small_postgres.url(database))

    # Without the pooler the server refuses the clients past its limit.
    errors, _ = run_clients(small_postgres.url(database), MAX_CONNECTIONS + 5)
    assert errors and all(isinstance(e, StateUnavailable) for e in errors), errors[:3]
    assert any("too many clients" in str(e) for e in errors), errors[:3]

    with running_pgbouncer(small_postgres.port, pool_size=POOL) as bouncer:
        errors, written = run_clients(bouncer.url(database), CLIENTS)
        assert not errors, f"{len(errors)} clients failed, first: {errors[0]!r}\n{bouncer.log()}"
        assert written == CLIENTS * ROUNDS
        assert server_backends(small_postgres, database) <= POOL
    rows = PostgresDB(small_postgres.url(database))
    try:
        count = rows.conn().execute("SELECT count(*) FROM cluster_sandboxes").fetchone()[0]
        nodes = rows.conn().execute("SELECT count(*) FROM nodes").fetchone()[0]
    finally:
        rows.close()
    assert (count, nodes) == (CLIENTS * ROUNDS, CLIENTS)


def test_a_node_and_a_replica_through_the_pooler(
    small_postgres: PgServer, agentbox_home: Path, host_ready: None
) -> None:
    database = "t_" + secrets.token_hex(4)
    small_postgres.sql(f"CREATE DATABASE {database}")
    agentbox_home.chmod(0o711)  # node homes live under it, sandboxes traverse to them
    base = agentbox_home / f"pooled-{secrets.token_hex(4)}"
    with running_pgbouncer(small_postgres.port, pool_size=POOL) as bouncer:
        try:
            with running_cluster(bouncer.url(database), base, nodes=1, gateways=1) as cluster:
                with cluster.client("gw-1") as c:
                    made = c.post("/v1/sandboxes", json={"template": "default"})
                    assert made.status_code == 201, made.text
                    sandbox = made.json()["id"]
                    token = c.post("/v1/tokens", json={"sandbox": sandbox})
                    session = token.raise_for_status().json()["token"]
                    for i in range(ROUNDS):  # the token checked on the replica and the node
                        r = c.post(
                            "/v1/tools/terminal_run",
                            json={"arguments": {"sandbox_id": sandbox, "command": f"echo {i}"}},
                            headers={"Authorization": f"Bearer {session}"},
                        )
                        assert r.status_code == 200, r.text
                        assert r.json()["stdout"] == f"{i}\n"
                    node = cluster.nodes["node-1"].popen
                    gateway = cluster.gateways["gw-1"].popen
                    assert node is not None and gateway is not None
                    held = {
                        "node": connections_of(node.pid, bouncer.port),
                        "replica": connections_of(gateway.pid, bouncer.port),
                        "server": server_backends(small_postgres, database),
                    }
                    print(f"\n[cluster] connections through the pooler: {held}")
                    assert held["node"] >= 1 and held["replica"] >= 1
                    assert held["server"] <= POOL
                    assert c.delete(f"/v1/sandboxes/{sandbox}").status_code in (200, 204)
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def test_the_pooler_key_is_checked_and_never_reaches_libpq() -> None:
    url = "postgresql://agentbox@db:6432/agentbox?sslmode=require&pooler=transaction"
    assert state_url_error(url) is None
    assert split_pooler(url) == (
        "postgresql://agentbox@db:6432/agentbox?sslmode=require",
        "transaction",
    )
    assert split_pooler("postgresql://agentbox@db/agentbox")[1] is None
    problem = state_url_error("postgresql://agentbox@db/agentbox?pooler=session")
    assert problem is not None and "pooler= takes one value, transaction" in problem
