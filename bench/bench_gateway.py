"""Gateway overhead: a `terminal_run` of `true` and a small `fs_read`, through a real
`agentbox serve` process, beside the same calls made in-process with the SDK.

Run: .venv/bin/python bench/bench_gateway.py [--quick] [--write]   (as root; needs wrk)
Prints a markdown table; rows: per-call latency p50/p95/p99 (1 client), throughput with
1/10/50 concurrent clients (wrk, a C load generator, so the client does not take the
gateway's CPU), and the cost of `audit.fsync: always` vs `batch`. With ``--write`` the
table replaces the gateway section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2

from agentbox import Sandbox
from common import remove_home, timed, write_doc_section

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: BENCH_OPERATOR_TOKEN, rate_limit_per_minute: 10000000}}
tools:
  - name: terminal.run
    allow: ["true", cat, bash]
audit:
  path: {home}/audit/audit.jsonl
  fsync: {fsync}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def gateway(home: Path, fsync: str) -> Iterator[tuple[str, str]]:
    port, token = free_port(), secrets.token_hex(24)
    config = home / f"gateway-{fsync}.yaml"
    config.write_text(CONFIG.format(port=port, home=home, fsync=fsync))
    env = {**os.environ, "AGENTBOX_HOME": str(home), "BENCH_OPERATOR_TOKEN": token}
    proc = subprocess.Popen([AGENTBOX, "serve", "--config", str(config)], env=env,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx2.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                time.sleep(0.05)
        yield url, token
    finally:
        proc.terminate()
        proc.wait(30)


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
function done(summary, latency, requests)
  io.stderr:write(string.format("RESULT %d %d %d %d %d %d\\n", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), summary.errors.status + summary.errors.connect
    + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


@dataclass
class Load:
    calls_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float


def wrk(url: str, token: str, tool: str, arguments: dict[str, object], clients: int,
        seconds: float) -> Load:  # fmt: skip
    """Load from wrk (C, one thread): the generator does not take the gateway's CPU."""
    body = json.dumps({"arguments": arguments})
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_SCRIPT.format(body=json.dumps(body), token=token))
        script.flush()
        out = subprocess.run(
            ["wrk", "-t1", f"-c{clients}", f"-d{seconds:.0f}s", "-s", script.name,
             f"{url}/v1/tools/{tool}"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    line = next(x for x in out.stderr.splitlines() if x.startswith("RESULT"))
    requests, duration_us, p50, p95, p99, errors = (int(v) for v in line.split()[1:])
    if errors:
        raise RuntimeError(f"wrk saw {errors} failed requests: {out.stdout}")
    return Load(requests / (duration_us / 1e6), p50 / 1000, p95 / 1000, p99 / 1000)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench_gateway needs wrk, the HTTP load generator: apt-get install -y wrk")
    n, seconds = (100, 3.0) if args.quick else (500, 5.0)
    home = Path(tempfile.mkdtemp(prefix="agentbox-bench-gw-", dir="/var/tmp"))
    home.chmod(0o711)
    rows: list[str] = []
    verdicts: list[str] = []
    local = Sandbox.create(memory="256MiB", disk="128MiB", home=home)
    try:
        local.files.write("/workspace/small.txt", "x" * 1024)
        inproc = timed(lambda: local.commands.run("true"), n)  # a string: bash, as the tool
        inproc_read = timed(lambda: local.files.read("/workspace/small.txt"), n)
    finally:
        local.kill()
    for fsync in ("always", "batch"):
        with gateway(home, fsync) as (url, token):
            headers = {"Authorization": f"Bearer {token}"}
            with httpx2.Client(base_url=url, headers=headers, timeout=60) as op:
                sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"})
                sid = sid.json()["id"]
                op.put(f"/v1/sandboxes/{sid}/files",
                       json={"path": "small.txt", "content": "x" * 1024})  # fmt: skip
                calls = {
                    "terminal_run `true`": ("terminal_run", {"command": "true", "sandbox_id": sid}),
                    "fs_read 1 KiB": ("fs_read", {"path": "small.txt", "sandbox_id": sid}),
                }
                for label, (tool, arguments) in calls.items():
                    wrk(url, token, tool, arguments, 1, 1)  # warm-up
                    loads = {c: wrk(url, token, tool, arguments, c, seconds) for c in (1, 10, 50)}
                    one = loads[1]
                    base = statistics.median(inproc if tool == "terminal_run" else inproc_read)
                    rows.append(
                        f"| {label}, fsync={fsync} | {one.p50_ms:.2f} | {one.p95_ms:.2f} | "
                        f"{one.p99_ms:.2f} | {base:.2f} | +{one.p50_ms - base:.2f} | "
                        + " / ".join(f"{loads[c].calls_per_s:.0f}" for c in (1, 10, 50))
                        + " |"
                    )
                    if fsync == "batch":
                        best = max(load.calls_per_s for load in loads.values())
                        if tool == "terminal_run":
                            verdicts += [
                                f"- target `terminal_run` p50 <= 5 ms: {one.p50_ms:.2f} ms, "
                                f"{'met' if one.p50_ms <= 5 else '**NOT met**'}",
                                f"- target >= 300 `terminal_run` calls/s: {best:.0f}/s, "
                                f"{'met' if best >= 300 else '**NOT met**'}",
                            ]
                        else:
                            verdicts.append(
                                f"- target >= 2,000 small `fs_read`/s: {best:.0f}/s, "
                                f"{'met' if best >= 2000 else '**NOT met**'}"
                            )
                op.delete(f"/v1/sandboxes/{sid}")
    remove_home(home)
    lines = [
        "| call (REST, wrk) | p50 ms (1 client) | p95 ms | p99 ms | in-process SDK p50 ms | "
        "gateway overhead p50 ms | calls/s with 1 / 10 / 50 clients |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{seconds:.0f} s per load point with wrk (one C thread, keep-alive, on the same 2 "
        f"cores); in-process medians over {n} calls. `fsync=always` fsyncs the record and "
        "the head before each call returns; concurrent calls share them (group commit).",
        "",
        *verdicts,
    ]
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_doc_section(
            "gateway", "Gateway: per-call overhead and throughput", "bench_gateway.py",
            "--quick" if args.quick else "",
            "A real `agentbox serve` process, REST calls over loopback with keep-alive, beside "
            "the same calls made with the SDK in-process.",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
