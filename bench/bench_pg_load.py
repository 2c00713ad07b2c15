"""The load each thing a gateway does puts on PostgreSQL, counted by PostgreSQL itself.

    .venv/bin/python bench/bench_pg_load.py [--sessions N] [--calls N] [--write]

A real PostgreSQL (tests/pgkit.py: its own cluster on a loopback port, fsync on) with
``pg_stat_statements`` loaded, and a real gateway (tests/gateway_harness.py) whose
``gateway.state`` is that database, creating real sandboxes. Each phase (create, issue a
session token, tool calls with it, destroy) runs for every session, between a reset of
``pg_stat_statements`` and a read of it: statements (BEGIN, COMMIT and advisory locks
included: ``track_utility``), rows and server time per operation, and the statements
behind them. The gateway runs no batch-task worker meanwhile (nothing else of it talks to
the database); what an idle gateway with its default worker asks is measured apart.

With cluster mode's code present (``agentbox.cluster.registry``), the same count for what a
cluster adds per operation: a node's heartbeat, the node list a placement reads, the
lookup that routes a request to its node, a gateway's sweep for silent nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import psycopg  # noqa: E402

from agentbox.state.postgres import migrate  # noqa: E402
from gateway_harness import RunningGateway, running_gateway  # noqa: E402
from pgkit import USER, PgServer  # noqa: E402

IDLE_SECONDS = 5.0
# Every statement this process sends (the gateway runs in it): a count independent of the
# server's, which in PostgreSQL 15 misses some BEGIN/COMMIT sent by the extended protocol.
ROUND_TRIPS = [0]
_execute = psycopg.Connection.execute


def _counting(self: Any, *args: Any, **kwargs: Any) -> Any:
    ROUND_TRIPS[0] += 1
    return _execute(self, *args, **kwargs)


SANDBOX = {"memory": "256MiB", "disk": "128MiB", "network": "none"}


@dataclass
class Count:
    """What pg_stat_statements saw in one phase (idle load already subtracted)."""

    statements: float
    round_trips: float  # psycopg executes in this process: BEGIN and COMMIT always counted
    rows: float
    server_ms: float
    top: list[tuple[float, str]] = field(default_factory=list)  # (calls, query), most first


class Stats:
    """pg_stat_statements of one database, read from another connection (the postgres
    database: its own statements are not counted)."""

    def __init__(self, server: PgServer, database: str) -> None:
        self.conn = psycopg.connect(server.url(), autocommit=True)
        (self.dbid,) = self.conn.execute(
            "SELECT oid FROM pg_database WHERE datname = %s", (database,)
        ).fetchone() or (None,)

    def reset(self) -> None:
        self.conn.execute("SELECT pg_stat_statements_reset()")

    def read(self) -> Count:
        rows = self.conn.execute(
            "SELECT calls, rows, total_exec_time, query FROM pg_stat_statements"
            " WHERE dbid = %s ORDER BY calls DESC",
            (self.dbid,),
        ).fetchall()
        return Count(
            statements=sum(r[0] for r in rows),
            round_trips=0,
            rows=sum(r[1] for r in rows),
            server_ms=sum(r[2] for r in rows),
            top=[(float(r[0]), " ".join(str(r[3]).split())) for r in rows],
        )

    def measure(self, run: Callable[[], None]) -> tuple[Count, float]:
        """What the database ran while ``run`` ran, and its seconds."""
        self.reset()
        start, trips = time.monotonic(), ROUND_TRIPS[0]
        run()
        seconds, trips = time.monotonic() - start, ROUND_TRIPS[0] - trips
        count = self.read()
        count.round_trips = trips
        return count, seconds


def start_server(base: Path) -> PgServer:
    server = PgServer(base, durable=True)
    server.init()
    with (server.data / "postgresql.conf").open("a") as conf:
        conf.write(
            "shared_preload_libraries = 'pg_stat_statements'\n"
            "pg_stat_statements.track = all\n"
            "pg_stat_statements.track_utility = on\n"
            "pg_stat_statements.max = 10000\n"
        )
    server.start()
    return server


@contextlib.contextmanager
def gateway(url: str, workers: int) -> Iterator[RunningGateway]:
    """A real gateway on this database with ``workers`` batch-task workers."""
    home = Path(os.environ.get("AGENTBOX_HOME", "/var/lib/agentbox"))
    tmp = Path(tempfile.mkdtemp(prefix="agentbox-bench-pgload-", dir="/var/tmp"))
    try:
        with running_gateway(
            home, tmp, state=url, extra_yaml=f"tasks:\n  workers: {workers}\n"
        ) as gw:
            yield gw
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def idle_load(url: str, stats: Stats, workers: int) -> Count:
    """Statements per second of a gateway nobody calls (its task workers poll the queue)."""
    with gateway(url, workers):
        stats.measure(lambda: None)  # past the start's own statements
        count, seconds = stats.measure(lambda: time.sleep(IDLE_SECONDS))
    top = [(calls / seconds, query) for calls, query in count.top]
    return Count(
        count.statements / seconds,
        count.round_trips / seconds,
        count.rows / seconds,
        count.server_ms / seconds,
        top,
    )


def gateway_ops(url: str, stats: Stats, sessions: int, calls: int) -> dict[str, Count]:
    """Each operation of an agent session, on a gateway without task workers: nothing else
    talks to PostgreSQL while a phase runs, so every statement counted is the phase's."""
    out: dict[str, Count] = {}
    with gateway(url, 0) as gw, gw.operator() as op:
        ids: list[str] = []
        tokens: list[str] = []
        warm = op.post("/v1/sandboxes", json=SANDBOX).json()["id"]  # first-use costs
        op.delete(f"/v1/sandboxes/{warm}").raise_for_status()

        def create() -> None:
            for _ in range(sessions):
                r = op.post("/v1/sandboxes", json=SANDBOX)
                r.raise_for_status()
                ids.append(r.json()["id"])

        def issue() -> None:
            for sid in ids:
                r = op.post("/v1/tokens", json={"sandbox": sid})
                r.raise_for_status()
                tokens.append(r.json()["token"])

        def call() -> None:
            for sid, token in zip(ids, tokens, strict=True):
                with gw.client(token) as agent:
                    for _ in range(calls):
                        r = agent.post(
                            "/v1/tools/terminal_run",
                            json={"arguments": {"sandbox_id": sid, "command": "true"}},
                        )
                        r.raise_for_status()

        def destroy() -> None:
            for sid in ids:
                op.delete(f"/v1/sandboxes/{sid}").raise_for_status()

        phases = {
            "create a sandbox": (create, sessions),
            "issue a session token": (issue, sessions),
            "tool call (terminal_run) with a session token": (call, sessions * calls),
        }
        try:
            for name, (run, n) in phases.items():
                count, _ = stats.measure(run)
                out[name] = per_op(count, n)
        finally:  # the sandboxes go whatever happened
            count, _ = stats.measure(destroy)
        out["destroy a sandbox"] = per_op(count, len(ids))
    return out


def per_op(count: Count, n: int) -> Count:
    top = [(calls / n, query) for calls, query in count.top]
    return Count(
        count.statements / n, count.round_trips / n, count.rows / n, count.server_ms / n, top
    )


def cluster_phases(url: str, stats: Stats, rounds: int, nodes: int) -> dict[str, Count] | None:
    """Cluster mode's registry operations, if this tree has them, with ``nodes`` nodes."""
    try:
        from agentbox.cluster.registry import Registry
    except ImportError:
        return None
    from agentbox.state.postgres import PostgresDB

    db = PostgresDB(url)
    registry = Registry(db)
    capacity: dict[str, Any] = {"memory_free_bytes": 1 << 34, "cpus": 8, "load1": 0.5,
                                "sandboxes": 10, "templates": ["default"]}  # fmt: skip
    for i in range(nodes):
        registry.heartbeat(f"node-{i}", f"https://10.0.{i // 250}.{i % 250}:8849", {}, capacity)
    for i in range(rounds):
        registry.claim(f"sb-{i}", f"node-{i % nodes}")
    ops: dict[str, Callable[[int], object]] = {
        "node heartbeat (its row upserted)": lambda i: registry.heartbeat(
            f"node-{i % nodes}", f"https://10.0.0.{i % 250}:8849", {}, capacity
        ),
        "node reconcile (its sandboxes' rows read)": lambda i: registry.on_node(
            f"node-{i % nodes}"
        ),
        f"placement: read all {nodes} nodes": lambda i: registry.nodes(),
        "route a request: look up the sandbox's node": lambda i: registry.lookup(f"sb-{i}"),
        "gateway sweep for silent nodes (none lost)": lambda i: registry.sweep(3600.0),
    }
    out = {}
    for name, op in ops.items():
        op(0)  # this thread's connection, prepared once

        def run(op: Callable[[int], object] = op) -> None:
            for i in range(rounds):
                op(i)

        count, _ = stats.measure(run)
        out[name] = per_op(count, rounds)
    db.close()
    return out


def table(rows: dict[str, Count]) -> str:
    lines = [
        "| operation | statements (server) | round trips (client) | rows | server time (ms) "
        "| statements behind it (calls per op) |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in rows.items():
        behind = "; ".join(f"{calls:.1f}x `{query[:70]}`" for calls, query in c.top[:4])
        lines.append(
            f"| {name} | {c.statements:.1f} | {c.round_trips:.1f} | {c.rows:.1f} "
            f"| {c.server_ms:.3f} | {behind} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=20, help="sandboxes created")
    parser.add_argument("--calls", type=int, default=10, help="tool calls per sandbox")
    parser.add_argument("--rounds", type=int, default=200, help="cluster registry ops each")
    parser.add_argument("--nodes", type=int, default=1000, help="nodes in the cluster table")
    parser.add_argument("--write", action="store_true", help="update docs/scale.md")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="agentbox-bench-pg-", dir="/var/tmp"))
    entry = pwd.getpwnam(USER)
    os.chown(base, entry.pw_uid, entry.pw_gid)
    psycopg.Connection.execute = _counting  # type: ignore[method-assign]
    server = start_server(base)
    try:
        url = server.new_database()
        migrate(url)
        name = url.rsplit("/", 1)[1]
        # In the postgres database, where the counts are read: the stats are server-wide.
        server.sql("CREATE EXTENSION pg_stat_statements")
        stats = Stats(server, name)
        gateway = gateway_ops(url, stats, args.sessions, args.calls)
        idle = idle_load(url, stats, workers=1)
        quiet = idle_load(url, stats, workers=0)
        cluster = cluster_phases(url, stats, args.rounds, args.nodes)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    text = table(gateway)
    idle_line = (
        f"An idle gateway with one batch-task worker (the default): {idle.round_trips:.1f} "
        f"round trips/s, {idle.statements:.1f} statements/s as the server counts them ({'; '.join(f'{c:.1f}/s `{q[:70]}`' for c, q in idle.top[:4])}), "
        f"over {IDLE_SECONDS:.0f} s; without workers, {quiet.round_trips:.1f} round trips/s."
    )
    cluster_text = table(cluster) if cluster is not None else None
    print(text, "", idle_line, "", cluster_text or "(no cluster mode in this tree)", sep="\n")
    if args.write:
        write_scale_section(args, text, idle_line, cluster_text)


def write_scale_section(
    args: argparse.Namespace, gateway: str, idle: str, cluster: str | None
) -> None:
    doc = REPO / "docs" / "scale.md"
    begin, end = "<!-- pg-load:begin -->", "<!-- pg-load:end -->"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = (
        f".venv/bin/python bench/bench_pg_load.py --sessions {args.sessions} "
        f"--calls {args.calls} --rounds {args.rounds} --nodes {args.nodes} --write"
    )
    parts = [
        begin,
        f"Generated by `{command}` at {stamp}, counted by PostgreSQL 15's pg_stat_statements "
        "(server) and by psycopg in the bench's process (client), on a server of its own on "
        "127.0.0.1; "
        "the host is shared with other engineers' work, so server times are noisy (the "
        "counts are not).",
        "",
        "Per operation of a gateway with `gateway.state: postgresql://…` (single host: the "
        "sandbox registry itself is still the home's SQLite):",
        "",
        gateway,
        "",
        idle,
    ]
    if cluster is not None:
        parts += [
            "",
            f"Cluster mode's registry (`agentbox.cluster.registry`), {args.nodes} node rows:",
            "",
            cluster,
        ]
    parts.append(end)
    section = "\n".join(parts)
    text = doc.read_text()
    text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    doc.write_text(text)


if __name__ == "__main__":
    main()
