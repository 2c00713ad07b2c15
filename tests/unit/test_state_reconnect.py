"""After PostgreSQL restarts, an idle connection is replaced before its next statement
(its socket says the server hung up), and when one breaks in use anyway, that thread's
failed call tells the process: every other thread's connection is replaced before its
next statement (a node's 64 request threads must not each fail a write of their own)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentbox.errors import StateUnavailable
from agentbox.state import postgres as pg
from agentbox.state.postgres import IDLE_MAX, PostgresDB, migrate
from pgkit import PgServer

WRITE = "INSERT INTO nodes (id, address, registered_at, heartbeat_at) VALUES (?, 'a', 0, 0)"


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        call()
        return "ok"
    except StateUnavailable as e:
        return e


def test_a_write_after_a_restart_finds_a_live_connection(postgres: PgServer) -> None:
    """Writes are not retried (they may have run), so the connection they get must be
    live: a task's step lost to a restart failed the task (tests/cluster)."""
    import psycopg

    url = postgres.new_database()
    migrate(url)
    db = PostgresDB(url)
    db.conn().execute("SELECT 1")  # an idle connection from before the restart
    postgres.restart()
    db.conn().execute(WRITE, ("n1",))
    db.conn().execute("SELECT 1")
    # The server ends an idle session: waited for (the timeout argument), as the session
    # was idle long before the next statement; a write racing the termination fails
    # typed, by design (test_one_broken_connection_refreshes_every_threads).
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    db.conn().execute(WRITE, ("n2",))
    assert [r[0] for r in db.conn().execute("SELECT id FROM nodes ORDER BY id")] == ["n1", "n2"]
    db.close()


def test_one_broken_connection_refreshes_every_threads(
    postgres: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The restart's goodbye not on the sockets yet (as when it races the next statement):
    # the statement itself finds out.
    monkeypatch.setattr(pg, "_hung_up", lambda raw: raw.closed or raw.broken)
    url = postgres.new_database()
    migrate(url)
    db = PostgresDB(url)
    gate, go = threading.Event(), threading.Event()
    outcomes: dict[str, Any] = {}

    def other_thread() -> None:  # holds a connection from before the restart
        db.conn().execute("SELECT 1")
        gate.set()
        go.wait(60)
        outcomes["other"] = _outcome(lambda: db.conn().execute(WRITE, ("n2",)))

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert gate.wait(60)
    db.conn().execute("SELECT 1")
    postgres.restart()
    with pytest.raises(StateUnavailable):  # the first write to find out fails, typed
        db.conn().execute(WRITE, ("n1",))
    go.set()
    thread.join(60)
    assert outcomes["other"] == "ok"  # reconnected before its statement
    db.close()


def test_connections_follow_concurrent_statements_not_threads(postgres: PgServer) -> None:
    """A node's request threads each touch the database; the process keeps at most
    IDLE_MAX connections after, not one per thread (129 for 50 agents on three nodes,
    over PostgreSQL's default max_connections of 100)."""
    import psycopg

    url = postgres.new_database()
    migrate(url)
    db = PostgresDB(url)
    threads = 40
    barrier = threading.Barrier(threads)

    def use(_: int) -> int:
        barrier.wait(60)  # every call on its own thread, all alive at once
        with db.tx() as conn:  # a transaction holds its connection to the end
            conn.execute(WRITE, (f"t{threading.get_ident()}",))
        return int(db.conn().execute("SELECT 1").fetchone()[0])

    with ThreadPoolExecutor(threads) as pool:
        assert sum(pool.map(use, range(threads))) == threads
        with psycopg.connect(url, autocommit=True) as probe:
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
        assert row is not None and row[0] <= IDLE_MAX  # the threads are still alive
    db.close()
