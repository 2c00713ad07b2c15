"""The E2B front door's cost: the E2B SDK and agentbox's own SDK through one gateway.

Run: .venv/bin/python bench/bench_e2b.py [--quick]   (as root; e2b is a dev dependency)
Both clients talk to the same `agentbox serve` process in the same run: rows are
`Sandbox.create()` then `commands.run('true')` (then kill, untimed), and
`commands.run('true')` alone on a running sandbox. Prints a markdown table.
Uses $AGENTBOX_HOME when set (else a throwaway home).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import e2b

import agentbox
from bench_gateway import gateway
from common import Stats, bench_home, fmt_ms, md_table


@contextlib.contextmanager
def home() -> Iterator[Path]:
    configured = os.environ.get("AGENTBOX_HOME")
    if configured:
        yield Path(configured)
        return
    with bench_home("e2b") as made:
        yield made


def sample(fn: Callable[[], Callable[[], None]], n: int) -> Stats:
    """``fn`` is timed; the cleanup it returns is not."""
    samples = []
    for _ in range(n):
        started = time.perf_counter_ns()
        cleanup = fn()
        samples.append(time.perf_counter_ns() - started)
        cleanup()
    return Stats.of_ns(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    creates, runs = (5, 50) if args.quick else (20, 300)
    with home() as where, gateway(where, "batch") as (url, token, _):
        os.environ.update(AGENTBOX_URL=url, AGENTBOX_TOKEN=token, E2B_API_URL=f"{url}/e2b",
                          E2B_SANDBOX_URL=f"{url}/e2b", E2B_API_KEY=token)  # fmt: skip

        def e2b_create_run() -> Callable[[], None]:
            sb = e2b.Sandbox.create()
            sb.commands.run("true")
            return sb.kill

        def own_create_run() -> Callable[[], None]:
            sb = agentbox.Sandbox.create()
            sb.commands.run("true")
            return sb.kill

        rows = [
            ("`Sandbox.create()` + `commands.run('true')`", sample(e2b_create_run, creates),
             sample(own_create_run, creates)),
        ]  # fmt: skip
        e2b_box, own_box = e2b.Sandbox.create(), agentbox.Sandbox.create()

        def e2b_run() -> Callable[[], None]:
            e2b_box.commands.run("true")
            return lambda: None

        def own_run() -> Callable[[], None]:
            own_box.commands.run("true")
            return lambda: None

        try:
            e2b_run(), own_run()  # warm
            rows.append(
                ("`commands.run('true')` on a running sandbox", sample(e2b_run, runs),
                 sample(own_run, runs))
            )  # fmt: skip
        finally:
            e2b_box.kill()
            own_box.kill()
    table = md_table(
        ["through one gateway", "n", "E2B SDK p50 ms", "p95", "agentbox SDK p50 ms", "p95"],
        [
            [what, str(a.n), fmt_ms(a.p50), fmt_ms(a.p95), fmt_ms(b.p50), fmt_ms(b.p95)]
            for what, a, b in rows
        ],
    )
    print("\n".join(table))


if __name__ == "__main__":
    main()
