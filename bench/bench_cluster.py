"""Cluster mode vs single host, in the same run: a call through a gateway replica to a
node (another process, mutual TLS, the registry lookup in PostgreSQL) against the same
call on a single-host gateway.

    .venv/bin/python bench/bench_cluster.py [--rounds N] [--write]

* create -> first result: POST /v1/sandboxes, then the first terminal_run's answer;
* terminal_run: ``true`` in a running sandbox, through POST /v1/tools/terminal_run;
* creates/s: ``--parallel`` clients creating ``--creates`` sandboxes at once (3 nodes vs
  the single host).

Both sides are real processes (tests/cluster/clusterkit.py starts PostgreSQL with fsync
on, a CA, three ``agentbox node`` and one ``agentbox serve`` replica; the single host is
one ``agentbox serve`` on SQLite); sandboxes have network none and no warm pool on both.
Rounds alternate the two so both see the same host load. All the processes share this
host's cores: the three nodes do not add CPUs here, so creates/s measures the control
plane's overhead, not scale-out.
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "cluster"))
sys.path.insert(0, str(REPO / "bench"))

from clusterkit import AGENTBOX, free_port, running_cluster, wait_for  # noqa: E402

from common import percentile, write_doc_section  # noqa: E402
from pgkit import USER, PgServer  # noqa: E402

SINGLE = """
gateway:
  listen: 127.0.0.1:{port}
  auth:
    operator_token_env: AGENTBOX_TEST_OPERATOR_TOKEN
    rate_limit_per_minute: 1000000
sandbox:
  network: none
  warm_pool: 0
tools:
  - name: terminal.run
    cwd: /workspace
"""


class Side:
    def __init__(self, name: str, url: str, token: str) -> None:
        self.name = name
        self.http = httpx2.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        )

    def create(self) -> str:
        return str(self.http.post("/v1/sandboxes", json={}).raise_for_status().json()["id"])

    def run(self, sandbox: str, command: str = "true") -> None:
        body = {"arguments": {"sandbox_id": sandbox, "command": command}}
        answer = self.http.post("/v1/tools/terminal_run", json=body).raise_for_status().json()
        assert answer["exit_code"] == 0, answer

    def destroy(self, sandbox: str) -> None:
        self.http.delete(f"/v1/sandboxes/{sandbox}").raise_for_status()


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


def creates_per_s(side: Side, creates: int, parallel: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        made = list(pool.map(lambda _: side.create(), range(creates)))
    rate = creates / (time.perf_counter() - start)
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(side.destroy, made))
    return rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20, help="terminal_run calls per round")
    parser.add_argument("--creates", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    home = Path(os.environ.get("AGENTBOX_HOME", "/var/tmp/agentbox"))
    base = home / f"bench-cluster-{secrets.token_hex(4)}"
    base.mkdir(parents=True)
    base.chmod(0o711)  # the single host's sandboxes traverse to its home
    pg_base = Path(tempfile.mkdtemp(prefix="agentbox-bench-pg-", dir="/var/tmp"))
    entry = pwd.getpwnam(USER)
    os.chown(pg_base, entry.pw_uid, entry.pw_gid)
    server = PgServer(pg_base, durable=True)
    server.init()
    server.start()
    samples: dict[tuple[str, str], list[float]] = {}
    single_proc = None
    try:
        # The default heartbeat (2 s), not the tests' fast one: its load is part of the cost.
        with running_cluster(
            server.new_database(), base / "c", nodes=3, gateways=1, heartbeat=2.0
        ) as cluster:
            single_home = base / "single"
            single_home.mkdir()
            port = free_port()
            config = base / "single.yaml"
            config.write_text(SINGLE.format(port=port))
            env = {
                **os.environ,
                "AGENTBOX_HOME": str(single_home),
                "AGENTBOX_TEST_OPERATOR_TOKEN": cluster.token,
            }
            log = (base / "single.log").open("ab")
            single_proc = subprocess.Popen(
                [AGENTBOX, "serve", "--config", str(config)], env=env, stdout=log, stderr=log
            )
            url = f"http://127.0.0.1:{port}"
            wait_for("single-host gateway", lambda: httpx2.get(url + "/healthz").is_success)
            sides = [
                Side("single host", url, cluster.token),
                Side("cluster", cluster.gateway_urls["gw-1"], cluster.token),
            ]
            for side in sides:  # warm-up: every node's disk cache, the connections
                sandbox = side.create()
                side.run(sandbox)
                side.destroy(sandbox)
                creates_per_s(side, args.creates, args.parallel)
            for _ in range(args.rounds):
                for side in sides:
                    holder: list[str] = []

                    def first(side: Side = side, holder: list[str] = holder) -> None:
                        holder.append(side.create())
                        side.run(holder[0], "echo ready")

                    samples.setdefault((side.name, "first"), []).append(timed(first))
                    runs = samples.setdefault((side.name, "run"), [])
                    for _ in range(args.runs):
                        runs.append(timed(lambda s=side, h=holder: s.run(h[0])))
                    side.destroy(holder[0])
                    samples.setdefault((side.name, "creates"), []).append(
                        creates_per_s(side, args.creates, args.parallel)
                    )
            for side in sides:
                side.http.close()
    finally:
        if single_proc is not None:
            single_proc.terminate()
            single_proc.wait(30)
            from clusterkit import _clean_home

            _clean_home(base / "single")
        server.stop()
        shutil.rmtree(pg_base, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)

    def cell(name: str, what: str) -> str:
        values = samples[name, what]
        return f"{percentile(values, 50):.1f} / {percentile(values, 95):.1f}"

    rows = [
        "| measure | single host p50 / p95 | cluster (gateway -> node) p50 / p95 | "
        "ratio (p50) | target |",
        "|---|---|---|---|---|",
    ]
    for what, label, target in (
        ("first", "create -> first result (ms)", "<= 1.5x"),
        ("run", "terminal_run `true` (ms)", "<= 1.5x"),
    ):
        ratio = percentile(samples["cluster", what], 50) / percentile(
            samples["single host", what], 50
        )
        rows.append(f"| {label} | {cell('single host', what)} | {cell('cluster', what)} | "
                    f"{ratio:.2f}x | {target} |")  # fmt: skip
    lite, clus = samples["single host", "creates"], samples["cluster", "creates"]
    rows.append(
        f"| creates/s, {args.parallel} clients ({args.creates} creates) | "
        f"{percentile(lite, 50):.2f} | {percentile(clus, 50):.2f} (3 nodes) | "
        f"{percentile(clus, 50) / percentile(lite, 50):.2f}x | - |"
    )
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "cluster",
            "Cluster mode: through a gateway replica to a node vs single host",
            "bench_cluster.py",
            f"--rounds {args.rounds}",
            f"{args.rounds} interleaved rounds; per round and side one create -> first "
            f"result, {args.runs} terminal_run calls and {args.creates} creates by "
            f"{args.parallel} parallel clients (creates/s: p50 over rounds). Cluster: 3 "
            "`agentbox node` processes (heartbeat every 2 s, the default) and one "
            "`agentbox serve` replica, mutual TLS, "
            "PostgreSQL 15 on 127.0.0.1 with fsync on; single host: `agentbox serve` on "
            "SQLite. Network none, no warm pool on both sides. Every process shares this "
            "2-core host, itself shared with other engineers' work: the numbers are noisy, "
            "and the three nodes add no CPU here (creates/s shows the control plane's "
            "overhead, not scale-out).",
            table,
        )


if __name__ == "__main__":
    main()
