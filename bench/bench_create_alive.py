"""Create with N sandboxes alive against create with none, beside plain bwrap in the same run.

Run: .venv/bin/python bench/bench_create_alive.py [--alive N] [--samples K] [--write]  (root)

Each sample is one ``Sandbox.create(network="none")`` (small: 64 MiB memory and disk), timed,
then destroyed, so the number alive stays put. Three kinds of start are interleaved at each
level: agentbox as it is (bubblewrap started in the launcher's own mount namespace, which
shows it only this sandbox's mounts: ``SandboxHost.launch_views``), agentbox with that view
turned off (bubblewrap sees every host mount, as before), and plain bwrap ``true`` with
agentbox's argv shape (bench/baselines.py). The first and third are measured with 0 alive and
with N alive (N kept alive, idle); the rows give p50/p95 and the ratio N-alive / 0-alive.
With ``--write`` the table replaces the create-alive section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

from agentbox import Sandbox
from agentbox.runtime.host import SandboxHost
from baselines import PlainBwrap
from common import (
    NS_PER_MS,
    Stats,
    bench_home,
    fmt_ms,
    md_table,
    now_ns,
    progress,
    write_doc_section,
)

SIZE = "64MiB"
TARGET_RATIO = 1.3


def _host_mounts() -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for _ in f)


@contextlib.contextmanager
def _without_view() -> Iterator[None]:
    """bubblewrap started in the host's mount namespace (the launcher gets no --view)."""
    original = SandboxHost.launch_views
    SandboxHost.launch_views = lambda self, init: ()  # type: ignore[method-assign]
    try:
        yield
    finally:
        SandboxHost.launch_views = original  # type: ignore[method-assign]


def _sample(home: object, view: bool) -> int:
    with contextlib.nullcontext() if view else _without_view():
        t0 = now_ns()
        sb = Sandbox.create(memory=SIZE, disk=SIZE, network="none", home=home)  # type: ignore[arg-type]
        elapsed = now_ns() - t0
    sb.kill()
    return elapsed


def _round_robin(samples: int, kinds: dict[str, Callable[[], int]]) -> dict[str, Stats]:
    times: dict[str, list[int]] = {name: [] for name in kinds}
    for _ in range(samples):
        for name, fn in kinds.items():
            times[name].append(fn())
    return {name: Stats.of_ns(ns) for name, ns in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--alive", type=int, default=500, help="sandboxes kept alive (N)")
    parser.add_argument("--samples", type=int, default=30, help="creates per kind and level")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    n, k = args.alive, args.samples
    alive: list[Sandbox] = []
    with bench_home("create-alive") as home:
        plain = PlainBwrap(home / "baseline", home / "lib")
        kinds: dict[str, Callable[[], int]] = {
            "agentbox": lambda: _sample(home, True),
            "agentbox, no launcher view": lambda: _sample(home, False),
            "plain bwrap `true`": plain.run_true,
        }
        for fn in kinds.values():  # warm-up: template, launcher, seccomp filter, disk cache
            fn()
        try:
            mounts_idle = _host_mounts()
            progress(f"create-alive: {k} samples each with 0 alive")
            idle = _round_robin(k, kinds)
            progress(f"create-alive: creating {n} sandboxes")
            t0 = now_ns()
            for i in range(n):
                alive.append(Sandbox.create(memory=SIZE, disk=SIZE, network="none", home=home))
                if (i + 1) % 100 == 0:
                    progress(f"create-alive: {i + 1}/{n} alive")
            fill_s = (now_ns() - t0) / NS_PER_MS / 1000
            mounts_full = _host_mounts()
            progress(f"create-alive: {k} samples each with {n} alive")
            full = _round_robin(k, kinds)
        finally:
            progress(f"create-alive: destroying {len(alive)} sandboxes")
            for sb in alive:
                with contextlib.suppress(Exception):
                    sb.kill()
    rows = []
    for name in kinds:
        a, b = idle[name], full[name]
        rows.append([name, fmt_ms(a.p50), fmt_ms(a.p95), fmt_ms(b.p50), fmt_ms(b.p95),
                     f"{b.p50 / a.p50:.2f}x"])  # fmt: skip
    ours = full["agentbox"].p50 / idle["agentbox"].p50
    header = ["start", "p50 ms, 0 alive", "p95", f"p50 ms, {n} alive", "p95",
              f"p50 {n} alive / 0 alive"]  # fmt: skip
    lines = [
        *md_table(header, rows),
        "",
        f"{k} samples per kind and level, interleaved round-robin; creates are "
        f'`Sandbox.create(memory/disk {SIZE}, network="none")`, each destroyed after timing. '
        f"Host mount table: {mounts_idle} entries with 0 alive, {mounts_full} with {n} alive "
        f"(each sandbox keeps its disk and root mounted on the host). Filling to {n} took "
        f"{fill_s:.1f} s.",
        "",
        f"- target create with {n} alive <= {TARGET_RATIO}x create with none: {ours:.2f}x, "
        f"{'met' if ours <= TARGET_RATIO else '**NOT met**'}",
    ]
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_doc_section(
            "create-alive", "Create with many sandboxes alive", "bench_create_alive.py",
            f"--alive {n} --samples {k}",
            "The host was shared with other engineers' work during the run: compare the "
            "ratios within a row, not absolute milliseconds across runs.",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
