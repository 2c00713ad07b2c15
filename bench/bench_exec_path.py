"""A command in a live sandbox, through the sandbox's resident launcher (runtime/resident.py)
beside the same command through ``agentbox-nsexec enter`` per command, interleaved in one
run (A B A B ...), so that a shared machine's drift moves both alike.

    .venv/bin/python bench/bench_exec_path.py [-n N] [--write]   (as root)

Rows: the CLI's light path (``runtime.quick_exec.run``, what ``agentbox sandbox exec ID
-- true`` does after its start-up) and the runtime's ``CommandRunner.run`` (the SDK
in-process and the gateway's ``terminal_run``), each way, in this process; then whole
``agentbox sandbox exec ID -- true`` processes (through the launcher) beside ``python -c
pass`` (the interpreter's own start, the floor of any Python CLI).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentbox import Sandbox
from agentbox.runtime import quick_exec
from agentbox.runtime.runtime import Runtime
from common import Stats, bench_home, md_table, progress, write_doc_section

AGENTBOX = str(Path(sys.executable).parent / "agentbox")


def quick(sandbox_id: str, through_launcher: bool) -> Callable[[], object]:
    def call() -> object:
        prepared = quick_exec.prepare(sandbox_id, ["true"], "c" + os.urandom(6).hex())
        assert prepared is not None, "the sandbox does not take the light path"
        if not through_launcher:  # no launcher answers there, and none is started
            prepared.socket = "/nonexistent/launcher.sock"
            prepared.resident_argv = ["/bin/true", "--leaf", "/nonexistent/leaf"]
        status, _ = quick_exec.run(prepared, None, lambda fd, data: None)
        assert status == 0
        return status

    return call


def whole(argv: list[str], env: dict[str, str]) -> Callable[[], object]:
    return lambda: subprocess.run(argv, env=env, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=41, help="rounds (each row once per round)")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    load_before = "{:.1f} / {:.1f}".format(*os.getloadavg()[:2])
    with bench_home("exec") as home:
        env = {**os.environ, "AGENTBOX_HOME": str(home)}
        os.environ["AGENTBOX_HOME"] = str(home)
        sb = Sandbox.create(home=home)
        by_launcher = Runtime(home).commands(sb.id)
        by_enter = Runtime(home).commands(sb.id)
        by_enter.uses_resident = False  # type: ignore[misc]
        by_launcher.run("true")  # the first command starts the launcher
        rows: dict[str, Callable[[], object]] = {
            "`quick_exec.run(['true'])` (CLI light path), resident launcher": quick(sb.id, True),
            "`quick_exec.run(['true'])`, `agentbox-nsexec enter`": quick(sb.id, False),
            "`CommandRunner.run('true')` (SDK, gateway), resident launcher": lambda: (
                by_launcher.run("true")
            ),
            "`CommandRunner.run('true')`, `agentbox-nsexec enter`": lambda: by_enter.run("true"),
            "whole process: `agentbox sandbox exec ID -- true`": whole(
                [AGENTBOX, "sandbox", "exec", sb.id, "--", "true"], env
            ),
            "whole process: `python -c pass`": whole([sys.executable, "-c", "pass"], env),
        }
        samples: dict[str, list[int]] = {label: [] for label in rows}
        progress(f"exec: {args.n} rounds of {len(rows)} rows")
        for _ in range(args.n):
            for label, call in rows.items():
                start = time.perf_counter_ns()
                call()
                samples[label].append(time.perf_counter_ns() - start)
        sb.kill()
    load_after = "{:.1f} / {:.1f}".format(*os.getloadavg()[:2])
    stats = {label: Stats.of_ns(values) for label, values in samples.items()}
    labels = list(rows)
    lines = md_table(
        ["measurement", "n", "p50 ms", "p95 ms", "p99 ms"],
        [[label, str(args.n), f"{s.p50:.2f}", f"{s.p95:.2f}", f"{s.p99:.2f}"]
         for label, s in stats.items()],
    )  # fmt: skip
    lines.append("")
    for launcher, enter in ((labels[0], labels[1]), (labels[2], labels[3])):
        lines.append(
            f"- {enter.split(',')[0]}: `enter` p50 / launcher p50 = "
            f"{stats[enter].p50 / stats[launcher].p50:.1f}x"
        )
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_doc_section(
            "exec-path", "A command in a live sandbox: resident launcher vs enter",
            "bench_exec_path.py", f"-n {args.n}",
            f"{args.n} interleaved rounds, one sandbox (default settings); the first four "
            "rows in this process, the last two whole processes. 2 cores shared with about "
            f"8 engineers' test runs: load average {load_before} before, {load_after} "
            "after (1 min / 5 min); compare rows of the same run.",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
