"""The cluster's control plane at 1,000 nodes, by simulation (docs/scale.md).

    .venv/bin/python bench/sim_cluster.py [--nodes 1000] [--sandboxes 20000]
        [--gateways 1] [--calls 2000] [--kill 10] [--write LABEL] [--keep DIR]
    .venv/bin/python bench/sim_cluster.py --resume DIR --sandboxes 100000 [...]

``--keep DIR`` keeps PostgreSQL's data, the certificates and the results in DIR (an
interrupted run, Ctrl-C or SIGINT, stops cleanly and says so); ``--resume DIR`` starts
them again (new ports: the nodes' rows follow) and continues creating up to
``--sandboxes`` from the sandboxes still running there, then runs the later phases: a
long run split over several sittings on a shared host.

Real: PostgreSQL 15 (tests/pgkit.py, fsync on, ``pg_stat_statements`` loaded), the
cluster's gateway replicas (``agentbox serve`` with a ``cluster:`` section, each its own
process), the cluster CA and mutual TLS between replica and node, the registry's SQL
(``agentbox.cluster.registry``: heartbeat upsert, reconcile read, claim on create).

Simulated: the nodes. One process (``--serve-nodes``, started by this one) listens on one
loopback port per node, each with the node API's own TLS context (``pki.server_context``:
a client certificate signed by the cluster CA required), so a replica dials 1,000 distinct
addresses over 1,000 pools of real TLS connections, as it would in a cluster. A node
answers ``POST /v1/sandboxes`` by writing its registry row (what ``NodeRuntime`` does)
and a tool call with a canned result, both at once: it simulates the node, not the
sandbox. Every node heartbeats every ``heartbeat_seconds`` with the two statements a real
node's heartbeat sends (its reconcile read, its row's upsert), through a few threads.
Why one port per node rather than one port and SNI routing: the replica's connection pool,
its TLS handshakes and its per-address routing are part of what is measured, and they
only look real when each node is its own address.

A real node holds one connection per thread that touches the database; the simulated
ones share a few (``--db-threads``): 1,000 real nodes would need a pooler (docs/scale.md).

Phases: heartbeat load (idle, 1,000 nodes); creates at rising concurrency up to
``--sandboxes``; tool calls; heartbeat load again (with every registry row); placement
read time; then ``--kill`` nodes stop (listeners closed, heartbeats stopped) and the time
until their sandboxes answer ``sandbox_lost`` through a replica is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import httpx2  # noqa: E402

from agentbox.cluster import pki, placement  # noqa: E402
from agentbox.cluster.registry import ON_NODE_SQL, Registry  # noqa: E402
from agentbox.state.postgres import PostgresDB, migrate  # noqa: E402
from pgbouncerkit import connections_of  # noqa: E402

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
HZ = os.sysconf("SC_CLK_TCK")
DOC = REPO / "docs" / "scale.md"
CAPACITY = {"memory_free_bytes": 64 << 30, "cpus": 32, "load1": 0.5, "templates": ["default"]}


# --------------------------------------------------------------------------------------
# The simulated nodes (their own process)
# --------------------------------------------------------------------------------------
class SimNodes:
    def __init__(self, url: str, pki_dir: Path, count: int, interval: float, threads: int):
        self.registry = Registry(PostgresDB(url))
        self.context = pki.server_context(
            pki_dir / "ca.pem", pki_dir / "sim-nodes.pem", pki_dir / "sim-nodes.key"
        )
        self.names = [f"sim-{i:04d}" for i in range(count)]
        self.interval = interval
        self.threads = threads
        self.servers: dict[str, asyncio.Server] = {}
        self.addresses: dict[str, str] = {}
        self.dead: set[str] = set()
        self.sandboxes: dict[str, int] = dict.fromkeys(self.names, 0)
        self.beats = 0
        self.late = 0  # beats that started more than one interval late
        self.served = {"create": 0, "call": 0, "other": 0}
        self.connections = 0  # mutual-TLS connections the replicas opened to the nodes
        self.stop = threading.Event()

    async def handle(self, node: str, reader: asyncio.StreamReader, writer: Any) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    key, _, value = line.partition(":")
                    if key.strip().lower() == "content-length":
                        length = int(value)
                if length:
                    await reader.readexactly(length)
                status, body = await self.route(node, method, target.split("?")[0])
                data = json.dumps(body).encode()
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def route(self, node: str, method: str, path: str) -> tuple[int, Any]:
        if method == "POST" and path == "/v1/sandboxes":
            self.sandboxes[node] += 1
            sandbox = f"sb-{node}-{self.sandboxes[node]}-{secrets.token_hex(3)}"
            # The row before the answer, as NodeRuntime._register does.
            await asyncio.to_thread(self.registry.claim, sandbox, node)
            self.served["create"] += 1
            return 201, {"id": sandbox, "state": "running", "template": "default"}
        if method == "POST" and path.startswith("/v1/tools/"):
            self.served["call"] += 1
            return 200, {"exit_code": 0, "stdout": "ok\n", "stderr": "", "duration_ms": 1}
        self.served["other"] += 1
        if path == "/healthz":
            return 200, {"status": "ok"}
        return 404, {"error": {"code": "not_found", "message": path}}

    def beat_loop(self, names: list[str]) -> None:
        """The heartbeats of ``names``, each every ``interval``, staggered evenly.

        The beats due at once go to PostgreSQL in one pipeline, each beat's two statements
        followed by its own sync (its own implicit transaction and commit, as a real
        node's autocommit statements): the server executes and commits exactly what 1,000
        real nodes would send, while this process spares a round trip and a thread wake-up
        per statement (profiled: waiting on those round trips was most of its time, and the
        threads fell behind under load)."""
        step = self.interval / len(names)
        start = time.monotonic()
        k = 0
        while not self.stop.is_set():
            due = start + k * step
            delay = due - time.monotonic()
            if delay > 0 and self.stop.wait(delay):
                return
            # Every beat due by now, at most a tenth of the thread's nodes per batch.
            n = max(1, min(len(names) // 10, int((time.monotonic() - due) / step) + 1))
            if delay < -self.interval:
                self.late += n
            batch = [names[(k + i) % len(names)] for i in range(n)]
            k += n
            batch = [node for node in batch if node not in self.dead]
            try:
                conn = self.registry.db.conn()
                reads = []
                with conn.raw.pipeline() as pipe:
                    for node in batch:
                        reads.append(conn.execute(ON_NODE_SQL, (node,)))  # reconcile read
                        capacity = dict(CAPACITY, sandboxes=self.sandboxes[node])
                        self.registry.heartbeat(
                            node, self.addresses[node], {"zone": "z1"}, capacity
                        )
                        pipe.sync()
                for cursor in reads:  # decoded as a node does
                    _ = {str(r[0]): (str(r[1]), float(r[2])) for r in cursor.fetchall()}
                self.beats += len(batch)
            except Exception as e:  # keep beating: a lost node would skew everything
                print(f"heartbeats of {batch[:3]}... failed: {e}", file=sys.stderr, flush=True)

    def kill(self, nodes: list[str]) -> None:
        for node in nodes:
            self.dead.add(node)
            self.servers[node].close()

    async def run(self, ready: Path) -> None:
        loop = asyncio.get_running_loop()
        counts = self.registry.db.conn().execute(
            "SELECT node, COUNT(*) FROM cluster_sandboxes GROUP BY node"
        )
        self.sandboxes.update({str(n): int(k) for n, k in counts})  # a resumed run's
        for node in self.names:
            server = await asyncio.start_server(
                lambda r, w, n=node: self.handle(n, r, w), "127.0.0.1", 0, ssl=self.context
            )
            port = server.sockets[0].getsockname()[1]
            self.servers[node] = server
            self.addresses[node] = f"https://127.0.0.1:{port}"
        for i in range(self.threads):
            names = self.names[i :: self.threads]
            threading.Thread(target=self.beat_loop, args=(names,), daemon=True).start()
        ready.write_text(json.dumps(self.addresses))
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := (await reader.readline()).decode().strip():
            command, *args = line.split()
            if command == "kill":
                self.kill(args)
            answer = {
                "beats": self.beats,
                "late": self.late,
                "served": self.served,
                "connections": self.connections,
                "killed": sorted(self.dead),
            }
            print(json.dumps(answer), flush=True)
        self.stop.set()


def serve_nodes(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--pki", type=Path)
    p.add_argument("--nodes", type=int)
    p.add_argument("--interval", type=float)
    p.add_argument("--db-threads", type=int)
    p.add_argument("--ready", type=Path)
    a = p.parse_args(argv)
    sim = SimNodes(a.url, a.pki, a.nodes, a.interval, a.db_threads)
    asyncio.run(sim.run(a.ready))


# --------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------
def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / HZ


def pg_pids(data: Path) -> list[int]:
    """The postmaster and its children (backends, walwriter, ...)."""
    master = int((data / "postmaster.pid").read_text().split()[0])
    pids = [master]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == master:
                pids.append(int(entry.name))
    return pids


class Meter:
    """CPU of PostgreSQL, the replicas and the simulated nodes, and pg_stat_statements,
    over one phase."""

    def __init__(self, stats: Any, data: Path, gateways: list[int], nodes: int) -> None:
        self.stats, self.data, self.gateways, self.nodes = stats, data, gateways, nodes

    def cpu(self) -> dict[str, float]:
        return {
            "postgres": cpu_seconds(pg_pids(self.data)),
            "gateways": cpu_seconds(self.gateways),
            "sim": cpu_seconds([self.nodes]),
            "driver": cpu_seconds([os.getpid()]),  # the load generator (this process)
        }

    def start(self) -> tuple[float, dict[str, float]]:
        self.stats.reset()
        return time.monotonic(), self.cpu()

    def stop(self, started: tuple[float, dict[str, float]]) -> dict[str, Any]:
        t0, cpu0 = started
        seconds = time.monotonic() - t0
        cpu = {k: v - cpu0[k] for k, v in self.cpu().items()}
        count = self.stats.read()
        return {"seconds": seconds, "cpu": cpu, "count": count}


# What nodes and sweeps send whatever the load: left out of a create's or a call's own count.
_BACKGROUND = (
    "INSERT INTO nodes",
    "SELECT id, state, agentbox_now() - created_at",
    "UPDATE nodes SET state",
    "BEGIN",
    "COMMIT",
    "SELECT pg_advisory",
    "SELECT $1",
)


def own(count: Any) -> float:
    return sum(calls for calls, q in count.top if not q.startswith(_BACKGROUND))


def top(count: Any, per: float, n: int = 4) -> str:
    return "; ".join(f"{calls / per:.2f}x `{q[:60]}`" for calls, q in count.top[:n])


class Conn:
    """One keep-alive HTTP/1.1 connection to a replica, for the load driver.

    Not httpx: profiled, httpx spent ~5 ms of this process's CPU per create (its pool, its
    response model), as much as the replica under test, on a host whose two cores the
    driver shares with everything it measures. A replica's answer always carries a
    content-length (JSON bodies)."""

    def __init__(self, url: str, token: str) -> None:
        parts = url.removeprefix("http://").split(":")
        self.host, self.port = parts[0], int(parts[1])
        self.auth = f"Bearer {token}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: Any = None

    async def post(self, path: str, body: Any) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"authorization: {self.auth}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n".encode()
            + data
        )
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length, close = 0, False
        for line in head[1:]:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key == "content-length":
                length = int(value)
            elif key == "connection" and value.strip().lower() == "close":
                close = True
        answer = await self.reader.readexactly(length)
        if close:
            await self.close()
        return int(head[0].split(" ", 2)[1]), answer

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None


async def drive_creates(urls: list[str], token: str, n: int, concurrency: int) -> list[str]:
    ids: list[str] = []
    errors: list[str] = []
    todo = iter(range(n))

    async def worker(w: int) -> None:
        conn = Conn(urls[w % len(urls)], token)
        for _ in todo:
            status, answer = await conn.post("/v1/sandboxes", {"template": "default"})
            if status == 201:
                ids.append(json.loads(answer)["id"])
            else:
                errors.append(f"{status} {answer[:200]!r}")
        await conn.close()

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    if errors:
        print(f"  {len(errors)} creates failed, first: {errors[0]}", flush=True)
    return ids


async def drive_calls(urls: list[str], token: str, ids: list[str], concurrency: int) -> int:
    todo = iter(ids)
    failed = [0]

    async def worker(w: int) -> None:
        conn = Conn(urls[w % len(urls)], token)
        for sandbox in todo:
            body = {"arguments": {"sandbox_id": sandbox, "command": "true"}}
            status, _ = await conn.post("/v1/tools/terminal_run", body)
            if status != 200:
                failed[0] += 1
        await conn.close()

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return failed[0]


def gateway_config(base: Path, name: str, port: int, url: str, hb: float, lost: float) -> Path:
    path = base / f"{name}.yaml"
    path.write_text(
        f"gateway:\n  listen: 127.0.0.1:{port}\n  state: {url}\n"
        "  auth:\n    operator_token_env: AGENTBOX_SIM_TOKEN\n"
        "    rate_limit_per_minute: 100000000\n"
        f"cluster:\n  ca_file: {base}/pki/ca.pem\n  cert_file: {base}/pki/{name}.pem\n"
        f"  key_file: {base}/pki/{name}.key\n  heartbeat_seconds: {hb}\n"
        f"  lost_after_seconds: {lost}\n"
    )
    return path


def wait_for(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except (httpx2.HTTPError, OSError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-nodes":
        serve_nodes(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--sandboxes", type=int, default=20000)
    p.add_argument("--gateways", type=int, default=1)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--kill", type=int, default=10)
    p.add_argument("--heartbeat", type=float, default=2.0)
    p.add_argument("--lost-after", type=float, default=10.0)
    p.add_argument("--db-threads", type=int, default=4)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--write", metavar="LABEL", help="fill docs/scale.md's sim-LABEL block")
    p.add_argument("--code", default="", help="what code ran (default: git HEAD)")
    p.add_argument(
        "--keep", type=Path, metavar="DIR",
        help="run in DIR and keep it (PostgreSQL's data, certificates, results) for --resume",
    )  # fmt: skip
    p.add_argument(
        "--resume", type=Path, metavar="DIR",
        help="continue a --keep run (interrupted, or a smaller --sandboxes) up to --sandboxes",
    )  # fmt: skip
    a = p.parse_args()
    from bench_pg_load import Stats, start_server
    from pgkit import PgServer

    keep = a.resume or a.keep
    base = keep or Path(tempfile.mkdtemp(prefix="agentbox-sim-", dir="/var/tmp"))
    base.mkdir(exist_ok=True)
    base.chmod(0o711)  # the postgres user traverses to its data directory
    entry = pwd.getpwnam("postgres")
    pgdir = base / "pg"
    results: dict[str, Any] = {"args": vars(a)}
    if a.resume:
        server = PgServer(pgdir, durable=True)  # its data as the last run left it
        server.start()
        results = {**json.loads((base / "results.json").read_text()), "args": vars(a)}
    else:
        pgdir.mkdir()
        os.chown(pgdir, entry.pw_uid, entry.pw_gid)
        server = start_server(pgdir)
    procs: list[subprocess.Popen[bytes]] = []

    def save() -> None:  # after each step: an interrupted --keep run resumes from here
        if keep:
            (base / "results.json").write_text(json.dumps(results, default=str))

    try:
        url = server.url("sim")
        if not a.resume:
            server.sql("CREATE DATABASE sim")
            server.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            migrate(url)
            pki.init_ca(base / "pki")
            pki.issue(base / "pki", "sim-nodes", "node", ["127.0.0.1"])
        stats = Stats(server, "sim")
        if a.resume:
            # The nodes' rows are as old as the last run: a replica's first sweep would
            # declare every node lost before the simulated nodes beat again. They beat
            # within one interval of starting; until then, count them as just heard.
            conn = PostgresDB(url, check_schema=False)
            conn.conn().execute("UPDATE nodes SET heartbeat_at = agentbox_now() + 60")
            conn.close()
        token = secrets.token_urlsafe(24)
        env = {**os.environ, "AGENTBOX_SIM_TOKEN": token}
        urls = []
        for i in range(1, a.gateways + 1):
            name = f"gw-{i}"
            if not (base / "pki" / f"{name}.pem").exists():
                pki.issue(base / "pki", name, "gateway", [])
            from s3kit import free_port

            port = free_port()
            config = gateway_config(base, name, port, url, a.heartbeat, a.lost_after)
            home = base / name
            home.mkdir(exist_ok=True)
            log = (base / f"{name}.log").open("ab")
            procs.append(
                subprocess.Popen(
                    [AGENTBOX, "serve", "--config", str(config)],
                    env={**env, "AGENTBOX_HOME": str(home)},
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for u in urls:
            wait_for(u, lambda u=u: httpx2.get(u + "/healthz").status_code == 200)
        gateway_pids = [pr.pid for pr in procs]
        ready = base / "nodes.json"
        ready.unlink(missing_ok=True)  # a resumed run's is the last run's
        sim = subprocess.Popen(
            [sys.executable, __file__, "--serve-nodes", "--url", url, "--pki", str(base / "pki"),
             "--nodes", str(a.nodes), "--interval", str(a.heartbeat),
             "--db-threads", str(a.db_threads), "--ready", str(ready)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=(base / "sim.log").open("ab"),
        )  # fmt: skip
        procs.append(sim)

        def ask(line: str) -> dict[str, Any]:
            assert sim.stdin is not None and sim.stdout is not None
            sim.stdin.write(line.encode() + b"\n")
            sim.stdin.flush()
            return dict(json.loads(sim.stdout.readline()))

        wait_for("simulated nodes", ready.exists, timeout=300)
        registry = Registry(PostgresDB(url))
        addresses = json.loads(ready.read_text())
        wait_for(  # resumed: the rows must name this run's ports too
            "every node's first heartbeat",
            lambda: sum(n.state == "ready" and addresses[n.id] == n.address
                        for n in registry.nodes()) == a.nodes,
        )  # fmt: skip
        print(f"{a.nodes} nodes beating; gateways {urls}", flush=True)
        meter = Meter(stats, server.data, gateway_pids, sim.pid)

        def idle(label: str) -> None:
            before = ask("stats")
            started = meter.start()
            time.sleep(a.idle_seconds)  # pacing a load measurement, not waiting on an event
            m = meter.stop(started)
            after = ask("stats")
            s = m["seconds"]
            results[label] = {
                "seconds": s,
                "statements_s": m["count"].statements / s,
                "server_ms_s": m["count"].server_ms / s,
                "pg_cpu": m["cpu"]["postgres"] / s,
                "gw_cpu": m["cpu"]["gateways"] / s,
                "sim_cpu": m["cpu"]["sim"] / s,
                "beats_s": (after["beats"] - before["beats"]) / s,
                "late": after["late"] - before["late"],
                "top": top(m["count"], s),
                # Connections each process holds to PostgreSQL (docs/scale.md).
                "pg_conns_replicas": [connections_of(pid, server.port) for pid in gateway_pids],
                "pg_conns_sim": connections_of(sim.pid, server.port),
            }
            print(label, json.dumps(results[label]), flush=True)

        if "idle_empty" not in results:
            idle("idle_empty")
            save()

        # Creates at rising concurrency, up to --sandboxes.
        ids: list[str] = [
            str(r[0])
            for r in registry.db.conn().execute(
                "SELECT id FROM cluster_sandboxes WHERE state = 'running' ORDER BY created_at"
            )
        ]  # none unless resumed
        levels = [int(c) for c in a.concurrency.split(",")]
        # Each level, then the last one again, in steps of at most 5,000 creates: a row per
        # step shows whether the rate holds as the registry grows.
        share = max(200, min(5000, a.sandboxes // (2 * len(levels))))
        plan = [(c, share) for c in levels[:-1]] if not ids else []
        while (left := a.sandboxes - len(ids) - sum(n for _, n in plan)) > 0:
            plan.append((levels[-1], min(share, left)))
        results.setdefault("creates", [])
        for c, n in plan:
            before = ask("stats")
            started = meter.start()
            made = asyncio.run(drive_creates(urls, token, n, c))
            m = meter.stop(started)
            opened = ask("stats")["connections"] - before["connections"]
            ids += made
            s, k = m["seconds"], max(1, len(made))
            row = {
                "concurrency": c,
                "creates": len(made),
                "total": len(ids),
                "creates_s": len(made) / s,
                "statements_per_create": m["count"].statements / k,
                "own_statements_per_create": own(m["count"]) / k,
                "connections_per_create": opened / k,
                "rows_per_create": m["count"].rows / k,
                "server_ms_per_create": m["count"].server_ms / k,
                "pg_cpu_ms_per_create": 1000 * m["cpu"]["postgres"] / k,
                "gw_cpu_ms_per_create": 1000 * m["cpu"]["gateways"] / k,
                "sim_cpu_ms_per_create": 1000 * m["cpu"]["sim"] / k,
                "driver_cpu_ms_per_create": 1000 * m["cpu"]["driver"] / k,
                "pg_cpu": m["cpu"]["postgres"] / s,
                "gw_cpu": m["cpu"]["gateways"] / s,
                "top": top(m["count"], k, 6),
            }
            results["creates"].append(row)
            save()
            print("creates", json.dumps(row), flush=True)

        # Tool calls through the replica(s), spread over the sandboxes.
        sample = ids[:: max(1, len(ids) // a.calls)][: a.calls]
        started = meter.start()
        failed = asyncio.run(drive_calls(urls, token, sample, levels[-1]))
        m = meter.stop(started)
        s, k = m["seconds"], max(1, len(sample))
        results["calls"] = {
            "calls": len(sample),
            "failed": failed,
            "calls_s": len(sample) / s,
            "statements_per_call": m["count"].statements / k,
            "own_statements_per_call": own(m["count"]) / k,
            "pg_cpu_ms_per_call": 1000 * m["cpu"]["postgres"] / k,
            "gw_cpu_ms_per_call": 1000 * m["cpu"]["gateways"] / k,
            "gw_cpu": m["cpu"]["gateways"] / s,
            "top": top(m["count"], k),
        }
        print("calls", json.dumps(results["calls"]), flush=True)
        results["pg_conns_after_calls"] = {
            "replicas": [connections_of(pid, server.port) for pid in gateway_pids],
            "sim": connections_of(sim.pid, server.port),
        }

        idle("idle_full")

        # The placement read, as a replica makes it: the query, and the ranking in Python.
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            nodes = registry.nodes()
            t1 = time.perf_counter()
            placement.rank(nodes, template="default", isolation=None, labels={},
                           lost_after=a.lost_after, placed={})  # fmt: skip
            times.append((t1 - t0, time.perf_counter() - t1))
        read = sorted(t[0] for t in times)
        ranked = sorted(t[1] for t in times)
        results["placement"] = {
            "read_ms_p50": 1000 * statistics.median(read),
            "rank_ms_p50": 1000 * statistics.median(ranked),
        }
        print("placement", json.dumps(results["placement"]), flush=True)

        # A dead node: its listener closed, its heartbeats stopped.
        victims = sorted({sid.split("-")[1] + "-" + sid.split("-")[2] for sid in ids})[: a.kill]
        probe = {v: next(s for s in ids if s.startswith(f"sb-{v}-")) for v in victims}
        t0 = time.monotonic()
        ask("kill " + " ".join(victims))
        detected: dict[str, float] = {}
        with httpx2.Client(
            base_url=urls[0], headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as c:
            deadline = t0 + 6 * a.lost_after + 30
            while len(detected) < len(victims) and time.monotonic() < deadline:
                for v in victims:
                    if v in detected:
                        continue
                    body = {"arguments": {"sandbox_id": probe[v], "command": "true"}}
                    r = c.post("/v1/tools/terminal_run", json=body)
                    if r.status_code != 200 and "sandbox_lost" in r.text:
                        detected[v] = time.monotonic() - t0
                time.sleep(0.1)  # polling a condition, bounded by the deadline above
        results["dead"] = {
            "killed": len(victims),
            "detected": len(detected),
            "seconds_max": max(detected.values(), default=float("nan")),
            "seconds_min": min(detected.values(), default=float("nan")),
        }
        print("dead", json.dumps(results["dead"]), flush=True)
        results["sim"] = ask("stats")
    except KeyboardInterrupt:  # what ran so far is still worth writing down
        results["interrupted"] = True
        print("interrupted: writing the phases that ran", flush=True)
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.terminate()
                try:
                    pr.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pr.kill()
        server.stop()
        if keep:
            save()
            print(f"kept in {base}: continue with --resume {base}", flush=True)
        else:
            shutil.rmtree(base, ignore_errors=True)
    out = Path(tempfile.gettempdir()) / "agentbox-sim-cluster.json"  # the run's raw numbers
    out.write_text(json.dumps(results, indent=1, default=str))
    if a.write:
        code = (
            a.code
            or subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        write_doc(results, " ".join(["bench/sim_cluster.py", *sys.argv[1:]]), a.write, code)


def render(r: dict[str, Any], command: str, code: str) -> str:
    a = r["args"]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    total = r["creates"][-1]["total"] if r["creates"] else 0
    out = [
        f"Generated by `.venv/bin/python {command}` at {when}, code {code}: {a['nodes']} "
        f"simulated nodes, {total} sandboxes registered, {a['gateways']} replica(s), "
        f"`heartbeat_seconds: {a['heartbeat']}`, `lost_after_seconds: {a['lost_after']}`. "
        + ("Interrupted before its last phases. " if r.get("interrupted") else "")
        + "The 2-core host was shared with other engineers' work: CPU and rates are noisy, "
        "the statement counts are not. CPU is in milliseconds of one core.",
        "",
        "| concurrency | creates | registered after | creates/s | statements per create "
        "(all / its own) | rows read per create | PG CPU ms/create | replica CPU ms/create "
        "| sim-nodes CPU ms/create | driver CPU ms/create | PG cores busy | replica cores busy "
        "| new TLS connections per create |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in r["creates"]:
        out.append(
            f"| {c['concurrency']} | {c['creates']} | {c['total']} | {c['creates_s']:.0f} | "
            f"{c['statements_per_create']:.2f} / {c['own_statements_per_create']:.2f} | "
            f"{c['rows_per_create']:.0f} | {c['pg_cpu_ms_per_create']:.2f} | "
            f"{c['gw_cpu_ms_per_create']:.2f} | {c['sim_cpu_ms_per_create']:.2f} | "
            f"{c.get('driver_cpu_ms_per_create', float('nan')):.2f} | "
            f"{c['pg_cpu']:.2f} | {c['gw_cpu']:.2f} | "
            f"{c.get('connections_per_create', float('nan')):.2f} |"
        )
    if r["creates"]:
        out += ["", f"Statements behind a create (last level): {r['creates'][-1]['top']}."]
    if "calls" in r:
        c = r["calls"]
        out += [
            "",
            f"Tool calls (`terminal_run`, operator token, spread over the sandboxes): "
            f"{c['calls']} calls, {c['failed']} failed, {c['calls_s']:.0f} calls/s; "
            f"{c['statements_per_call']:.2f} statements per call ({c['own_statements_per_call']:.2f}"
            f" its own: {c['top']}), PG CPU {c['pg_cpu_ms_per_call']:.2f} ms and replica CPU "
            f"{c['gw_cpu_ms_per_call']:.2f} ms per call.",
        ]
    out += ["", "| heartbeat load | statements/s | heartbeats/s | PG server ms/s | PG cores "
            "busy | sim-nodes cores busy | late beats |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, name in (("idle_empty", "no sandboxes"), ("idle_full", f"{total} sandboxes")):
        if label in r:
            i = r[label]
            out.append(
                f"| {a['nodes']} nodes, {name} | {i['statements_s']:.0f} | {i['beats_s']:.0f} | "
                f"{i['server_ms_s']:.1f} | {i['pg_cpu']:.3f} | {i['sim_cpu']:.3f} | {i['late']} |"
            )
    if "pg_conns_after_calls" in r:
        pc = r["pg_conns_after_calls"]
        out += [
            "",
            f"Connections to PostgreSQL after the calls: each replica "
            f"{', '.join(map(str, pc['replicas']))} (one per thread that touched the "
            f"database: its request threads, the sweep, the audit shipper); the simulated "
            f"nodes together {pc['sim']} ({a['db_threads']} heartbeat threads and the threads "
            "that write the creates' rows).",
        ]
    if "placement" in r:
        pl = r["placement"]
        out += [
            "",
            f"Placement at {a['nodes']} nodes: reading every node row "
            f"{pl['read_ms_p50']:.1f} ms p50 (query and decoding, client side), ranking "
            f"{pl['rank_ms_p50']:.1f} ms p50.",
        ]
    if "dead" in r:
        d = r["dead"]
        out += [
            "",
            f"Dead nodes: {d['killed']} simulated nodes stopped at once (listeners closed, "
            f"heartbeats stopped); {d['detected']} detected: their sandboxes answered "
            f"`sandbox_lost` through a replica {d['seconds_min']:.1f}-{d['seconds_max']:.1f} s "
            "after the stop.",
        ]
    return "\n".join(out)


def write_doc(r: dict[str, Any], command: str, label: str, code: str) -> None:
    begin, end = f"<!-- sim-{label}:begin -->", f"<!-- sim-{label}:end -->"
    text = DOC.read_text()
    if begin not in text:
        raise SystemExit(f"{DOC} has no {begin} ... {end} block to fill")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(head + begin + "\n" + render(r, command, code) + "\n" + end + tail)


if __name__ == "__main__":
    main()
