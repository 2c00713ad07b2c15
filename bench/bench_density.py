"""Row 3: N idle sandboxes alive at once — host memory per sandbox, then destroy them all.

Memory is read three ways: the host's own accounting (MemTotal - MemAvailable, and
MemTotal - MemFree, from /proc/meminfo, before and after), the PSS of every sandbox
process (/proc/PID/smaps_rollup), and the sandboxes' memory cgroups.
"""

from __future__ import annotations

import gc
import time

from agentbox import Sandbox
from agentbox.isolation.cgroups import CgroupLayout
from baselines import PlainBwrap
from common import (
    MIB,
    NS_PER_MS,
    BenchResult,
    Row,
    Stats,
    bench_home,
    md_table,
    meminfo_kib,
    now_ns,
    percentile,
    progress,
    pss_kib,
    ratio,
    sandbox_pids,
)
from phases import SETUP_PHASES, PhaseTimer

TARGET_MIB = 4.0
TARGET_DESTROY_S = 10.0
SIZE = "64MiB"


def _settled_meminfo() -> dict[str, int]:
    gc.collect()
    time.sleep(1.0)  # let deferred frees (RCU, exiting processes) land
    return meminfo_kib()


def run(quick: bool) -> BenchResult:
    n = 50 if quick else 500
    n_bwrap = 10 if quick else 30
    sandboxes: list[Sandbox] = []
    create_ns: list[int] = []
    destroy_ns: list[int] = []
    with bench_home("density") as home:
        try:
            # Warm-up: the template, the launcher and the seccomp filter exist before "before".
            Sandbox.create(memory=SIZE, disk=SIZE, home=home, network="none").kill()
            plain = PlainBwrap(home / "baseline", home / "lib")
            plain.run_true()
            bwrap_idle = [plain.run_true() for _ in range(n_bwrap)]
            mounts_idle = _mount_count()
            before = _settled_meminfo()
            progress(f"3 density: creating {n} sandboxes (memory={SIZE}, disk={SIZE})")
            timer = PhaseTimer(SETUP_PHASES)
            with timer.active():
                for i in range(n):
                    t0 = now_ns()
                    sandboxes.append(
                        Sandbox.create(memory=SIZE, disk=SIZE, home=home, network="none")
                    )
                    create_ns.append(now_ns() - t0)
                    if (i + 1) % 100 == 0:
                        progress(f"3 density: {i + 1}/{n} alive")
            after = _settled_meminfo()
            alive = sum(1 for sb in sandboxes if sb.is_running())
            pss, procs, cg_bytes = _sandbox_memory(sandboxes)
            mounts_full = _mount_count()
            bwrap_full = [plain.run_true() for _ in range(n_bwrap)]
            progress(f"3 density: destroying {n} sandboxes")
            t_all = now_ns()
            while sandboxes:
                sb = sandboxes.pop()
                t0 = now_ns()
                sb.kill()
                destroy_ns.append(now_ns() - t0)
            destroy_total_s = (now_ns() - t_all) / 1e9
            released = _settled_meminfo()
        finally:
            for sb in sandboxes:  # only on error: the loop above empties the list
                try:
                    sb.kill()
                except Exception as e:
                    progress(f"3 density: could not destroy {sb.id}: {e}")

    used = {k: (before["MemTotal"] - before[k]) for k in ("MemAvailable", "MemFree")}
    used_after = {k: (after["MemTotal"] - after[k]) for k in ("MemAvailable", "MemFree")}
    per_avail = (used_after["MemAvailable"] - used["MemAvailable"]) / 1024 / n
    per_free = (used_after["MemFree"] - used["MemFree"]) / 1024 / n
    per_pss = pss / 1024 / n
    kernel_keys = ("SUnreclaim", "KernelStack", "PageTables", "Percpu")
    per_kernel = sum(after[k] - before[k] for k in kernel_keys if k in before) / 1024 / n
    leftover = ((released["MemTotal"] - released["MemAvailable"]) - used["MemAvailable"]) / 1024
    st_create, st_destroy = Stats.of_ns(create_ns), Stats.of_ns(destroy_ns)
    tenth = max(1, n // 10)
    first, last = Stats.of_ns(create_ns[:tenth]), Stats.of_ns(create_ns[-tenth:])
    rows = [
        Row(
            "3",
            f"host memory per idle sandbox (MemTotal-MemAvailable delta / {n})",
            value=per_avail,
            unit="MiB",
            n=n,
            target=f"<= {TARGET_MIB:g} MiB",
            met=per_avail <= TARGET_MIB,
        ),
        Row(
            "3",
            f"  PSS of sandbox processes / {n} ({procs / n:.1f} processes each)",
            value=per_pss,
            unit="MiB",
            n=n,
        ),
        Row(
            "3",
            "  PSS + unreclaimable kernel memory (SUnreclaim, KernelStack, PageTables, "
            f"Percpu deltas) / {n}",
            value=per_pss + per_kernel,
            unit="MiB",
            n=n,
            note="less exposed to other processes on the host than MemAvailable; "
            "leaves out the sandboxes' reclaimable page cache",
        ),
        Row(
            "3",
            "  memory cgroup usage / sandbox (charged pages incl. kernel)",
            value=cg_bytes / MIB / n,
            unit="MiB",
            n=n,
        ),
        Row(
            "3",
            f"  MemTotal-MemFree delta / {n} (incl. page cache of the disk images)",
            value=per_free,
            unit="MiB",
            n=n,
        ),
        Row(
            "3",
            f"destroy all {n} sandboxes (sequential sb.kill())",
            value=destroy_total_s,
            unit="s",
            n=n,
            target=f"<= {TARGET_DESTROY_S:g} s total",
            met=destroy_total_s <= TARGET_DESTROY_S,
        ),
        Row("3", "  one sb.kill() while the others stay alive", st_destroy),
        Row(
            "3",
            f"create with {n} alive: Sandbox.create(memory/disk {SIZE}), all {n}",
            st_create,
            note=f"p50 of the first {tenth} creates {first.p50:.2f} ms, "
            f"of the last {tenth} {last.p50:.2f} ms",
        ),
        Row(
            "3",
            "  host-wide MemAvailable drop left after destroying all (other processes count too)",
            value=leftover,
            unit="MiB",
            n=n,
        ),
    ]
    st_idle, st_full = Stats.of_ns(bwrap_idle), Stats.of_ns(bwrap_full)
    rows += [
        Row(
            "3",
            f"baseline: plain bwrap `true`, no sandbox alive ({mounts_idle} host mounts)",
            st_idle,
            target="baseline",
        ),
        Row(
            "3",
            f"baseline: plain bwrap `true`, {n} sandboxes alive ({mounts_full} host mounts)",
            st_full,
            ratio=f"{ratio(st_full.p50, st_idle.p50)} of idle",
            target="baseline",
        ),
    ]
    result = BenchResult(rows=rows)
    result.sections.append(
        (
            f"Row 3 detail: create phases (p50 ms) as sandboxes accumulate (0 -> {n} alive)",
            _growth_table(timer, n),
        )
    )
    result.sections.append(
        (
            f"Row 3 detail: /proc/meminfo around {n} idle sandboxes",
            _meminfo_table(before, after, released, n),
        )
    )
    if alive != n:
        rows[0].note = f"only {alive} of {n} sandboxes were running when memory was read"
    return result


def _mount_count() -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for _ in f)


def _growth_table(timer: PhaseTimer, n: int) -> list[str]:
    """Each phase's p50 per fifth of the creates: what grows with the number alive."""
    buckets = 5
    size = max(1, n // buckets)
    header = ["phase"] + [f"alive {k * size}-{min(n, (k + 1) * size) - 1}" for k in range(buckets)]
    rows = []
    for label, _, _ in SETUP_PHASES:
        samples = timer.samples.get(label, [])
        if len(samples) != n:
            continue
        cells = [label.strip()]
        for k in range(buckets):
            chunk = samples[k * size : (k + 1) * size]
            cells.append(f"{percentile(chunk, 50) / NS_PER_MS:.2f}")
        rows.append(cells)
    return md_table(header, rows)


def _sandbox_memory(sandboxes: list[Sandbox]) -> tuple[int, int, int]:
    """(total PSS KiB, number of processes, total memory-cgroup bytes)."""
    layout = CgroupLayout.detect()
    pss = procs = cg = 0
    for sb in sandboxes:
        pids = sandbox_pids(sb.id)
        procs += len(pids)
        pss += sum(pss_kib(pid) for pid in pids)
        cg += layout.sandbox(sb.id).memory_current()
    return pss, procs, cg


def _meminfo_table(
    before: dict[str, int], after: dict[str, int], released: dict[str, int], n: int
) -> list[str]:
    keys = [
        "MemFree",
        "MemAvailable",
        "Cached",
        "Dirty",
        "Shmem",
        "Slab",
        "SReclaimable",
        "SUnreclaim",
        "KernelStack",
        "PageTables",
        "Percpu",
        "AnonPages",
    ]
    rows = []
    for key in keys:
        if key not in before:
            continue
        delta = after[key] - before[key]
        rows.append(
            [
                key,
                f"{before[key] / 1024:,.1f}",
                f"{after[key] / 1024:,.1f}",
                f"{delta / 1024:+,.1f}",
                f"{delta / n:+,.1f}",
                f"{(released[key] - before[key]) / 1024:+,.1f}",
            ]
        )
    return md_table(
        [
            "field",
            "before MiB",
            f"with {n} MiB",
            "delta MiB",
            "delta KiB / sandbox",
            "after destroy, vs before MiB",
        ],
        rows,
    )
