"""Row 4: sustained commands/s across many sandboxes from a thread pool.

``workers`` threads each take the next sandbox round-robin and run ``true`` through the SDK
until the window ends. Completions inside the measured window count (the first second is
warm-up). The baseline runs ``subprocess.run(["true"])`` on the same pool for as long.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from agentbox import Sandbox
from baselines import bare_true
from common import BenchResult, Row, Stats, bench_home, cpu_count, md_table, now_ns, progress, ratio

TARGET_PER_S = 200.0
SIZE = "64MiB"
WARMUP_S = 1.0
SWEEP_WORKERS = (1, 2, 8)
SWEEP_S = 2.0


def _pool(
    workers: int, seconds: float, task: Callable[[int], None]
) -> tuple[list[int], list[int], float]:
    """Run ``task(i)`` from ``workers`` threads; (latencies ns, task indices, window s)."""
    counter = itertools.count()
    start = now_ns() + int(WARMUP_S * 1e9)
    end = start + int(seconds * 1e9)
    lock = threading.Lock()
    latencies: list[int] = []
    indices: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        mine: list[tuple[int, int]] = []
        try:
            while True:
                t0 = now_ns()
                if t0 >= end:
                    break
                i = next(counter)
                task(i)
                t1 = now_ns()
                if start <= t1 <= end:
                    mine.append((t1 - t0, i))
        except BaseException as e:
            errors.append(e)
        with lock:
            latencies.extend(lat for lat, _ in mine)
            indices.extend(i for _, i in mine)

    threads = [threading.Thread(target=worker, name=f"bench-{k}") for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} workers failed, first: {errors[0]!r}") from errors[0]
    return latencies, indices, (end - start) / 1e9


def run(quick: bool) -> BenchResult:
    n_sandboxes = 50
    seconds = 2.0 if quick else 5.0
    workers = max(4, 2 * cpu_count())
    sandboxes: list[Sandbox] = []
    with bench_home("throughput") as home:
        progress(f"4 throughput: creating {n_sandboxes} sandboxes")
        try:
            for _ in range(n_sandboxes):
                sandboxes.append(Sandbox.create(memory=SIZE, disk=SIZE, home=home, network="none"))

            def sdk_task(i: int) -> None:
                result = sandboxes[i % n_sandboxes].commands.run(["true"])
                if result.exit_code != 0:
                    raise RuntimeError(f"`true` exited {result.exit_code}")

            def bare_task(_: int) -> None:
                bare_true()

            progress(f"4 throughput: SDK, {workers} threads, {WARMUP_S:g} s + {seconds:g} s")
            sdk_lat, sdk_idx, window = _pool(workers, seconds, sdk_task)
            progress(f"4 throughput: bare spawn baseline, {workers} threads")
            bare_lat, _, bare_window = _pool(workers, seconds, bare_task)
            sweep: list[list[str]] = []
            for count in () if quick else SWEEP_WORKERS:
                progress(f"4 throughput: SDK with {count} threads, {SWEEP_S:g} s")
                lat, _, win = _pool(count, SWEEP_S, sdk_task)
                st = Stats.of_ns(lat)
                sweep.append(
                    [
                        str(count),
                        f"{len(lat) / win:,.0f}",
                        f"{st.p50:.2f}",
                        f"{st.p95:.2f}",
                        f"{st.p99:.2f}",
                    ]
                )
        finally:
            for sb in sandboxes:
                try:
                    sb.kill()
                except Exception as e:
                    progress(f"4 throughput: could not destroy {sb.id}: {e}")

    sdk_rate, bare_rate = len(sdk_lat) / window, len(bare_lat) / bare_window
    touched = len({i % n_sandboxes for i in sdk_idx})
    result = BenchResult(
        rows=[
            Row(
                "4",
                f"agentbox: commands/s, `true` round-robin over {n_sandboxes} sandboxes, "
                f"{workers} threads, {seconds:g} s",
                value=sdk_rate,
                unit="cmd/s",
                n=len(sdk_lat),
                ratio=f"{ratio(sdk_rate, bare_rate)} of bare",
                target=f">= {TARGET_PER_S:g} cmd/s",
                met=sdk_rate >= TARGET_PER_S,
                note=f"{touched} of {n_sandboxes} sandboxes ran commands in the window",
            ),
            Row("4", "  latency of those commands", Stats.of_ns(sdk_lat)),
            Row(
                "4",
                f"baseline: bare subprocess.run(['true']) spawns/s, same {workers} threads",
                value=bare_rate,
                unit="cmd/s",
                n=len(bare_lat),
                target="baseline",
            ),
            Row("4", "  latency of those spawns", Stats.of_ns(bare_lat), target="baseline"),
        ]
    )
    if sweep:
        result.sections.append(
            (
                f"Row 4 detail: SDK commands/s by number of threads ({n_sandboxes} sandboxes, "
                f"{SWEEP_S:g} s each; the headline uses {workers})",
                md_table(["threads", "cmd/s", "p50 ms", "p95 ms", "p99 ms"], sweep),
            )
        )
    return result
