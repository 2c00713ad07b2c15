"""Pause / resume latency, beside SIGSTOP / SIGCONT of the same processes.

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
from agentbox.runtime.runtime import Runtime  # noqa: E402
from common import bench_home, percentile, write_doc_section  # noqa: E402


def timed_ms(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return (time.perf_counter() - start) * 1000


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
                pauses.append(timed_ms(lambda: runtime.pause(sb.id)))
                resumes.append(timed_ms(lambda: runtime.resume(sb.id)))
                pids = cgroup.pids()
                stops.append(timed_ms(lambda pids=pids: [os.kill(p, signal.SIGSTOP) for p in pids]))
                conts.append(timed_ms(lambda pids=pids: [os.kill(p, signal.SIGCONT) for p in pids]))
        finally:
            sb.kill()
    rows = [
        "| operation | p50 ms | p95 ms | p99 ms | baseline (signal every process) p50 ms |",
        "|---|---|---|---|---|",
        f"| pause (freeze, wait until frozen) | {percentile(pauses, 50):.2f} | {percentile(pauses, 95):.2f} | "
        f"{percentile(pauses, 99):.2f} | {statistics.median(stops):.2f} (SIGSTOP, no wait) |",
        f"| resume | {percentile(resumes, 50):.2f} | {percentile(resumes, 95):.2f} | "
        f"{percentile(resumes, 99):.2f} | {statistics.median(conts):.2f} (SIGCONT) |",
    ]
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "lifecycle", "Lifecycle: pause and resume", "bench_lifecycle.py",
            "--quick" if args.quick else "",
            f"{n} rounds on a sandbox running 20 busy processes; the baseline signals the "
            "same processes directly (it cannot tell when they have stopped, and any other "
            "process of the sandbox can SIGCONT them; the freezer cannot be undone from "
            "inside).",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
