"""The gVisor tier: create -> first result, beside bare ``runsc do`` on the same rootfs
and the default tier, interleaved; then ``exec`` in a live sandbox on both tiers (the
gVisor one through its exec agent) beside a bare ``runsc exec`` into the same sandbox,
and the memory of an idle gVisor sandbox (its cgroup's usage: Sentry, Gofer, stubs).

    .venv/bin/python bench/bench_gvisor.py [--quick] [--write]   (as root)

The baseline's rootfs is what the sandbox sees: the template's tree with the host /usr
bound read-only over it (the same overlay the sandbox uses, on a scratch upper layer);
``runsc --network=none do --root=ROOTFS /bin/true`` with the platform agentbox picks.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from agentbox import Sandbox  # noqa: E402
from agentbox.isolation import disk, gvisor, syscalls  # noqa: E402
from agentbox.runtime.runtime import Runtime  # noqa: E402
from common import bench_home, percentile, timed, write_doc_section  # noqa: E402

MS_BIND, MS_REMOUNT = 0x1000, 0x20
TARGET_RATIO = 1.5  # issue 18: create -> first result <= 1.5x bare runsc do
TARGET_EXEC_MS = 30.0
TARGET_IDLE_MIB = 40.0


@contextmanager
def baseline_rootfs(template_root: Path, host_usr: bool) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gvisor-bench-", dir="/var/tmp") as scratch:
        upper, work, root = (Path(scratch) / n for n in ("upper", "work", "root"))
        for d in (upper, work, root):
            d.mkdir()
        syscalls.mount("bench", str(root), "overlay", 0,
                       f"lowerdir={template_root},upperdir={upper},workdir={work}")  # fmt: skip
        try:
            if host_usr:
                syscalls.mount("/usr", str(root / "usr"), "none", MS_BIND)
                syscalls.mount("none", str(root / "usr"), "none",
                               MS_BIND | MS_REMOUNT | syscalls.MS_RDONLY)  # fmt: skip
            yield root
        finally:
            disk.unmount(root)


def runsc_do(runsc: gvisor.Runsc, root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="gvisor-bench-state-") as state:
        argv = [runsc.path, f"--root={state}", f"--platform={runsc.platform}",
                "--network=none", "do", f"--root={root}", "/bin/true"]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True)


def create_and_run(home: Path, isolation: str) -> tuple[float, float]:
    """(create -> first result ms, destroy ms) of one sandbox."""
    started = time.perf_counter_ns()
    sb = Sandbox.create(home=home, network="none", isolation=isolation, memory="512MiB")
    try:
        if sb.commands.run(["true"]).exit_code != 0:
            raise RuntimeError("`true` failed in a fresh sandbox")
    finally:
        ran = time.perf_counter_ns()
        sb.kill()
    return (ran - started) / 1e6, (time.perf_counter_ns() - ran) / 1e6


def stats(samples: list[float]) -> str:
    return " | ".join(f"{percentile(samples, q):.1f}" for q in (50, 95, 99))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    n = 10 if args.quick else 40
    runsc = gvisor.find_runsc()
    with bench_home("gvisor") as home:
        runtime = Runtime(home)
        template = runtime.templates.get("default")
        gv: list[float] = []
        gv_destroy: list[float] = []
        bare: list[float] = []
        ns: list[float] = []
        ns_destroy: list[float] = []
        with baseline_rootfs(template.rootfs, template.host_usr) as root:
            runsc_do(runsc, root)  # warm-up (page cache) for all three
            create_and_run(home, "gvisor")
            create_and_run(home, "namespaces")
            for _ in range(n):  # interleaved: the same host noise on every column
                first, gone = create_and_run(home, "gvisor")
                gv.append(first)
                gv_destroy.append(gone)
                bare += timed(lambda: runsc_do(runsc, root), 1)
                first, gone = create_and_run(home, "namespaces")
                ns.append(first)
                ns_destroy.append(gone)
        live_g = Sandbox.create(home=home, network="none", isolation="gvisor", memory="512MiB")
        live_n = Sandbox.create(home=home, network="none", memory="512MiB")
        try:
            exec_g: list[float] = []
            exec_n: list[float] = []
            exec_bare: list[float] = []
            # What each gVisor command cost before the exec agent: a bare runsc exec.
            bare_exec = runsc.argv(home / "sandboxes" / live_g.id / "runsc", "none", "exec",
                                   "--user=65534:65534", live_g.id, "/bin/true")  # fmt: skip
            for _ in range(n * 5):
                exec_g += timed(lambda: live_g.commands.run(["true"]), 1)
                exec_n += timed(lambda: live_n.commands.run(["true"]), 1)
                exec_bare += timed(lambda: subprocess.run(bare_exec, check=True), 1)
            idle = runtime.layout.sandbox(live_g.id).memory_current() / 2**20
            idle_n = runtime.layout.sandbox(live_n.id).memory_current() / 2**20
        finally:
            live_g.kill()
            live_n.kill()
    ratio = percentile(gv, 50) / percentile(bare, 50)
    exec_p50 = percentile(exec_g, 50)
    table = "\n".join([
        "| operation | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|",
        f"| gvisor tier: create -> first result | {stats(gv)} |",
        f"| baseline: bare `runsc do /bin/true` on the same rootfs (start to exit) | {stats(bare)} |",
        f"| namespaces tier: create -> first result | {stats(ns)} |",
        f"| gvisor tier: destroy | {stats(gv_destroy)} |",
        f"| namespaces tier: destroy | {stats(ns_destroy)} |",
        f"| gvisor tier: `commands.run(['true'])` in a live sandbox | {stats(exec_g)} |",
        f"| namespaces tier: `commands.run(['true'])` in a live sandbox | {stats(exec_n)} |",
        f"| baseline: bare `runsc exec CONTAINER /bin/true` in the same sandbox | {stats(exec_bare)} |",
        "",
        "| idle sandbox (cgroup memory, after one command) | MiB |",
        "|---|---|",
        f"| gvisor tier | {idle:.1f} |",
        f"| namespaces tier | {idle_n:.1f} |",
        "",
        f"- target create -> first result <= {TARGET_RATIO}x bare runsc do: {ratio:.2f}x, "
        f"{'met' if ratio <= TARGET_RATIO else 'not met'}",
        f"- target exec in a live sandbox <= {TARGET_EXEC_MS:.0f} ms p50: {exec_p50:.1f} ms, "
        f"{'met' if exec_p50 <= TARGET_EXEC_MS else 'not met'}",
        f"- target idle memory <= {TARGET_IDLE_MIB:.0f} MiB: {idle:.1f} MiB, "
        f"{'met' if idle <= TARGET_IDLE_MIB else 'not met'}",
    ])  # fmt: skip
    print(table)
    if args.write:
        about = (
            f"{n} interleaved rounds per column (create, exec: {n * 5}), runsc "
            f"{runsc.version}, platform {runsc.platform}, on a host shared with other "
            "engineers' test runs (numbers are noisy; compare the columns, not runs). "
            "Bare `runsc do` includes its own teardown (its Sentry is its child, reaped at "
            "once); a sandbox's destroy is timed apart: `runsc delete` waits until the "
            "Sentry is reaped, and the Sentry of a detached sandbox is the child of PID 1, "
            "which on this VM (not systemd) reaps orphans about once a second. A gvisor "
            "command goes through the sandbox's exec agent (one unix-socket round trip); "
            "the bare `runsc exec` row is what each command cost before it."
        )
        write_doc_section("gvisor", "Isolation tier gvisor (runsc)", "bench_gvisor.py",
                          "--quick" if args.quick else "", about, table)  # fmt: skip


if __name__ == "__main__":
    main()
