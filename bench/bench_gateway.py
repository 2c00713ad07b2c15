"""Gateway overhead: a `terminal_run` of `true` and a small `fs_read`, through a real
`agentbox serve` process, beside the same calls made in-process with the SDK.

Run: .venv/bin/python bench/bench_gateway.py [--quick] [--write]   (as root)
Prints a markdown table; rows: per-call latency p50/p95/p99 (1 client), throughput with
1/10/50 concurrent clients, and the cost of `audit.fsync: always` vs `batch`. With
``--write`` the table replaces the gateway section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2

from agentbox import Sandbox

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


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1e6)
    return out


def throughput(
    make_call: Callable[[], Callable[[], object]], clients: int, seconds: float
) -> float:
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def worker(i: int) -> None:
        call = make_call()
        while time.monotonic() < stop:
            call()
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    n, seconds = (100, 2.0) if args.quick else (500, 5.0)
    home = Path(tempfile.mkdtemp(prefix="agentbox-bench-gw-", dir="/var/tmp"))
    home.chmod(0o711)
    rows: list[str] = []
    local = Sandbox.create(memory="256MiB", disk="128MiB", home=home)
    try:
        local.files.write("/workspace/small.txt", "x" * 1024)
        inproc = timed(lambda: local.commands.run(["true"]), n)
        inproc_read = timed(lambda: local.files.read("/workspace/small.txt"), n)
    finally:
        local.kill()
    verdicts: list[str] = []
    for fsync in ("always", "batch"):
        with gateway(home, fsync) as (url, token):
            headers = {"Authorization": f"Bearer {token}"}
            with httpx2.Client(base_url=url, headers=headers, timeout=60) as op:
                sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"}).json()[
                    "id"
                ]
                op.put(
                    f"/v1/sandboxes/{sid}/files", json={"path": "small.txt", "content": "x" * 1024}
                )

                def client_call(
                    tool: str,
                    arguments: dict[str, object],
                    url: str = url,
                    headers: dict[str, str] = headers,
                    sid: str = sid,
                ) -> Callable[[], object]:
                    client = httpx2.Client(base_url=url, headers=headers, timeout=60)
                    body = {"arguments": {**arguments, "sandbox_id": sid}}
                    return lambda: client.post(f"/v1/tools/{tool}", json=body).raise_for_status()

                run_true = client_call("terminal_run", {"command": "true"})
                read_small = client_call("fs_read", {"path": "small.txt"})
                for _ in range(20):
                    run_true()
                gw_run = timed(run_true, n)
                gw_read = timed(read_small, n)
                tput = {c: throughput(lambda: client_call("terminal_run", {"command": "true"}), c, seconds)
                        for c in (1, 10, 50)}  # fmt: skip
                read_tput = throughput(
                    lambda: client_call("fs_read", {"path": "small.txt"}), 10, seconds
                )
                op.delete(f"/v1/sandboxes/{sid}")
        if fsync == "batch":
            best = max(tput.values())
            verdicts += [
                f"- target `terminal_run` p50 <= 5 ms: {pct(gw_run, 0.5):.2f} ms, "
                f"{'met' if pct(gw_run, 0.5) <= 5 else '**NOT met**'}",
                f"- target >= 300 `terminal_run` calls/s: {best:.0f}/s, "
                f"{'met' if best >= 300 else '**NOT met**'}",
                f"- target >= 2,000 small `fs_read`/s: {read_tput:.0f}/s, "
                f"{'met' if read_tput >= 2000 else '**NOT met**'}",
            ]
        rows.append(
            f"| terminal_run `true`, fsync={fsync} | {pct(gw_run, 0.5):.2f} | {pct(gw_run, 0.95):.2f} "
            f"| {pct(gw_run, 0.99):.2f} | {pct(inproc, 0.5):.2f} | "
            f"+{pct(gw_run, 0.5) - pct(inproc, 0.5):.2f} | "
            + " / ".join(f"{tput[c]:.0f}" for c in (1, 10, 50))
            + " |"
        )
        rows.append(
            f"| fs_read 1 KiB, fsync={fsync} | {pct(gw_read, 0.5):.2f} | {pct(gw_read, 0.95):.2f} | "
            f"{pct(gw_read, 0.99):.2f} | {pct(inproc_read, 0.5):.2f} | "
            f"+{pct(gw_read, 0.5) - pct(inproc_read, 0.5):.2f} | {read_tput:.0f} (10 clients) |"
        )
    shutil.rmtree(home, ignore_errors=True)
    lines = [
        "| call (REST, 1 client) | p50 ms | p95 ms | p99 ms | in-process SDK p50 ms | "
        "gateway overhead p50 ms | calls/s with 1 / 10 / 50 clients |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"{n} timed calls per row, {seconds:.0f} s per throughput point; in-process median "
        f"{statistics.median(inproc):.2f} ms. The load generator shares the 2 cores with the "
        "gateway.",
        "",
        *verdicts,
    ]
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_section(table, "--quick" if args.quick else "")


def write_section(table: str, flags: str) -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
    begin, end = "<!-- gateway:begin -->", "<!-- gateway:end -->"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = (
        f"{begin}\n## Gateway: per-call overhead and throughput\n\n"
        f"Generated by `.venv/bin/python bench/bench_gateway.py {flags + ' ' if flags else ''}--write` at {stamp}: a "
        "real `agentbox serve` process, REST calls over loopback with keep-alive, beside the "
        "same calls made with the SDK in-process.\n\n"
        f"{table}\n{end}"
    )
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if begin in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)


if __name__ == "__main__":
    main()
