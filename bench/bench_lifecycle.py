"""Pause / resume latency (beside SIGSTOP / SIGCONT of the same processes), and a
warm-pool claim (beside a cold create of the same spec).

    .venv/bin/python bench/bench_lifecycle.py [--quick] [--write]   (as root)

The sandbox runs 20 busy processes. agentbox's pause freezes its whole cgroup tree and
waits until the kernel reports it frozen; the baseline signals every process of the tree
(what a naive implementation would do, without knowing when they have stopped).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from agentbox import Sandbox  # noqa: E402
from agentbox.runtime.recovery import recover  # noqa: E402
from agentbox.runtime.runtime import Runtime  # noqa: E402
from agentbox.runtime.spec_input import spec_from  # noqa: E402
from common import bench_home, percentile, timed, write_doc_section  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    n = 20 if args.quick else 100
    with bench_home("life") as home:
        runtime = Runtime(home)
        sb = Sandbox.create(memory="256MiB", disk="64MiB", network="none", home=home)
        try:
            sb.commands.start("for i in $(seq 20); do (while :; do :; done) & done; wait")
            cgroup = runtime.layout.sandbox(sb.id)
            time.sleep(0.5)
            pauses, resumes, stops, conts = [], [], [], []
            for _ in range(n):
                pauses.append(timed(lambda: runtime.pause(sb.id), 1)[0])
                resumes.append(timed(lambda: runtime.resume(sb.id), 1)[0])
                pids = cgroup.pids()
                stops.append(
                    timed(lambda pids=pids: [os.kill(p, signal.SIGSTOP) for p in pids], 1)[0]
                )
                conts.append(
                    timed(lambda pids=pids: [os.kill(p, signal.SIGCONT) for p in pids], 1)[0]
                )
        finally:
            sb.kill()
        claims, colds = warm_pool(runtime, n // 2)
        live = 50 if args.quick else 200
        recovery_ms, baseline_ms = recovery(runtime, live)
    rows = [
        "| operation | p50 ms | p95 ms | p99 ms | baseline (signal every process) p50 ms |",
        "|---|---|---|---|---|",
        f"| pause (freeze, wait until frozen) | {percentile(pauses, 50):.2f} | {percentile(pauses, 95):.2f} | "
        f"{percentile(pauses, 99):.2f} | {statistics.median(stops):.2f} (SIGSTOP, no wait) |",
        f"| resume | {percentile(resumes, 50):.2f} | {percentile(resumes, 95):.2f} | "
        f"{percentile(resumes, 99):.2f} | {statistics.median(conts):.2f} (SIGCONT) |",
        "",
        "| create | p50 ms | p95 ms | p99 ms | cold create p50 ms (same spec, empty pool) |",
        "|---|---|---|---|---|",
        f"| claim from the warm pool | {percentile(claims, 50):.2f} | {percentile(claims, 95):.2f} | "
        f"{percentile(claims, 99):.2f} | {percentile(colds, 50):.1f} |",
    ]
    rows += [
        "",
        "| recovery pass (gateway start) | ms | baseline: list the records and check each init, ms |",
        "|---|---|---|",
        f"| {live} live sandboxes, nothing to clean | {recovery_ms:.1f} | {baseline_ms:.1f} |",
    ]
    verdict = percentile(claims, 50) <= 2.0
    rows.append(f"\n- target warm-pool claim p50 <= 2 ms: {percentile(claims, 50):.2f} ms, "
                f"{'met' if verdict else '**NOT met**'}")  # fmt: skip
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "lifecycle", "Lifecycle: pause and resume", "bench_lifecycle.py",
            "--quick" if args.quick else "",
            f"{n} rounds on a sandbox running 20 busy processes; the baseline signals the "
            "same processes directly (it cannot tell when they have stopped, and any other "
            "process of the sandbox can SIGCONT them; the freezer cannot be undone from "
            "inside). Claims: `Runtime.create` of a spec a pooled sandbox matches (one SQLite "
            "transaction: state, spec with the request's env/lifetime/project, an event).",
            table,
        )  # fmt: skip


def recovery(runtime: Runtime, live: int) -> tuple[float, float]:
    """One recovery pass with ``live`` running sandboxes (what a restarted gateway pays),
    beside the least any pass does: read the records and check each init."""
    made = [runtime.create({"memory": "64MiB", "disk": "32MiB", "network": "none",
                            "idle_timeout": 0}) for _ in range(live)]  # fmt: skip
    try:
        start = time.perf_counter()
        result = recover(runtime)
        took = (time.perf_counter() - start) * 1000
        assert len(result.adopted) >= live and not result.removed, result.to_dict()
        start = time.perf_counter()
        assert all(runtime.alive(r) for r in runtime.store.list() if r.state == "running")
        baseline = (time.perf_counter() - start) * 1000
    finally:
        for record in made:
            runtime.destroy(record.id)
    return took, baseline


def warm_pool(runtime: Runtime, n: int) -> tuple[list[float], list[float]]:
    """``Runtime.create`` claiming a pooled sandbox, then with the pool empty."""
    base = {"memory": "64MiB", "disk": "32MiB", "network": "none", "idle_timeout": 0}
    spec = spec_from(base)
    for _ in range(n):
        runtime.fill_pool(spec)
    claims, colds, made = [], [], []
    for i in range(n):
        start = time.perf_counter()
        made.append(runtime.create({**base, "env": {"N": str(i)}}))
        claims.append((time.perf_counter() - start) * 1000)
    for _ in range(n):
        start = time.perf_counter()
        made.append(runtime.create(base))
        colds.append((time.perf_counter() - start) * 1000)
    for record in made:
        runtime.destroy(record.id)
    return claims, colds


if __name__ == "__main__":
    main()
