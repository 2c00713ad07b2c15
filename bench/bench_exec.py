"""Row 2: one command in a live sandbox through the in-process SDK.

Round-robin in one loop: ``sb.commands.run(["true"])``; a bare ``subprocess.run(["true"])``;
``nsenter`` into a live plain-bwrap sandbox; and two diagnostics that peel layers off the
SDK call: a cached ``CommandRunner`` (no record lookup) and the ``agentbox-nsexec enter``
launcher spawned directly with ``subprocess.run`` (no cgroup mkdir/rmdir, no Python pump).
"""

from __future__ import annotations

import subprocess
import time

from agentbox import Sandbox
from agentbox.runtime.requests import RunRequest
from agentbox.runtime.runtime import Runtime
from baselines import NsenterTarget, PlainBwrap, bare_true
from common import BenchResult, Row, Stats, bench_home, now_ns, progress, ratio
from phases import EXEC_PHASES, PhaseTimer

TARGET_MS = 3.0
IDLE_S = 0.1


def run(quick: bool) -> BenchResult:
    n, warmup, n_phases = (200, 20, 100) if quick else (1500, 50, 300)
    n_idle = 20 if quick else 80
    idle_sdk: list[int] = []
    idle_bare: list[int] = []
    sdk: list[int] = []
    cached: list[int] = []
    launcher: list[int] = []
    bare: list[int] = []
    nsenter: list[int] = []
    with bench_home("exec") as home:
        plain = PlainBwrap(home / "baseline", home / "lib")
        target = NsenterTarget(plain)
        sb = Sandbox.create(home=home, network="none")  # the baselines have no network either
        try:
            runner = Runtime(home).commands(sb.id)
            leaf = runner.new_leaf()
            raw_argv = runner.launcher_argv(["true"], leaf, None)
            raw_env = runner.environment(None)

            def sdk_once() -> int:
                t0 = now_ns()
                result = sb.commands.run(["true"])
                elapsed = now_ns() - t0
                if result.exit_code != 0:
                    raise RuntimeError(f"`true` exited {result.exit_code}")
                return elapsed

            def cached_once() -> int:
                t0 = now_ns()
                result = runner.run(RunRequest(["true"]))
                elapsed = now_ns() - t0
                if result.exit_code != 0:
                    raise RuntimeError(f"`true` exited {result.exit_code}")
                return elapsed

            def launcher_once() -> int:
                t0 = now_ns()
                done = subprocess.run(
                    raw_argv, env=raw_env, stdin=subprocess.DEVNULL, capture_output=True
                )
                elapsed = now_ns() - t0
                if done.returncode != 0:
                    raise RuntimeError(f"nsexec exited {done.returncode}: {done.stderr!r}")
                return elapsed

            progress(f"2 exec in a live sandbox: {warmup} warm-up + {n} measured rounds")
            for i in range(warmup + n):
                samples = (
                    sdk_once(),
                    bare_true(),
                    target.run_true(),
                    cached_once(),
                    launcher_once(),
                )
                if i >= warmup:
                    for bucket, value in zip(
                        (sdk, bare, nsenter, cached, launcher), samples, strict=True
                    ):
                        bucket.append(value)
            progress(f"2 exec in a live sandbox: {n_idle} commands each after {IDLE_S:g} s idle")
            for _ in range(n_idle):
                time.sleep(IDLE_S)
                idle_sdk.append(sdk_once())
                time.sleep(IDLE_S)
                idle_bare.append(bare_true())
            progress(f"2 exec in a live sandbox: phase breakdown over {n_phases} commands")
            timer = PhaseTimer(EXEC_PHASES)
            with timer.active():
                for _ in range(n_phases):
                    sb.commands.run(["true"])
        finally:
            target.close()
            sb.kill()

    st_sdk, st_bare, st_ns = Stats.of_ns(sdk), Stats.of_ns(bare), Stats.of_ns(nsenter)
    rows = [
        Row(
            "2",
            "agentbox: sb.commands.run(['true']) in a live sandbox (SDK, in-process)",
            st_sdk,
            ratio=f"{ratio(st_sdk.p50, st_bare.p50)} bare, {ratio(st_sdk.p50, st_ns.p50)} nsenter",
            target=f"p50 <= {TARGET_MS:g} ms",
            met=st_sdk.p50 <= TARGET_MS,
        ),
        Row(
            "2",
            "  diagnostic: cached CommandRunner.run (no record lookup)",
            Stats.of_ns(cached),
        ),
        Row(
            "2",
            "  diagnostic: agentbox-nsexec enter spawned directly (no cgroup leaf, no pump)",
            Stats.of_ns(launcher),
        ),
        Row(
            "2",
            f"  diagnostic: sb.commands.run(['true']) after {IDLE_S * 1000:g} ms idle",
            Stats.of_ns(idle_sdk),
            ratio=f"{ratio(Stats.of_ns(idle_sdk).p50, st_sdk.p50)} of back-to-back",
            note="the launcher's first cgroup.procs write after a pause waits for an RCU "
            "grace period unless the kernel runs with cgroup favordynmods (see the probe in "
            "the machine table and 'Why the slow steps are slow')",
        ),
        Row("2", "baseline: bare subprocess.run(['true'])", st_bare, target="baseline"),
        Row(
            "2",
            f"baseline: bare subprocess.run(['true']) after {IDLE_S * 1000:g} ms idle",
            Stats.of_ns(idle_bare),
            target="baseline",
        ),
        Row(
            "2",
            "baseline: nsenter --all into a live plain bwrap sandbox, `true`",
            st_ns,
            target="baseline",
        ),
    ]
    result = BenchResult(rows=rows)
    result.sections.append(
        (
            f"Row 2 breakdown: one sb.commands.run(['true']) ({n_phases} wrapped commands)",
            timer.table(n_phases),
        )
    )
    return result
