"""Shared pieces of the benchmarks: statistics, result rows, throwaway homes, machine facts.

Every benchmark gets its own ``AGENTBOX_HOME`` under ``/var/tmp`` (mode 0711: sandbox uids
must traverse it, nobody may list it) and removes every sandbox it made, even on error.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentbox import Sandbox
from agentbox.isolation.cgroups import CgroupLayout
from agentbox.runtime.host import release_home_mounts

NS_PER_MS = 1_000_000
MIB = 1 << 20


def now_ns() -> int:
    return time.perf_counter_ns()


def timed(fn: Callable[[], object], n: int) -> list[float]:
    """Milliseconds of ``n`` calls of ``fn``, one by one (wall clock)."""
    out = []
    for _ in range(n):
        start = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - start) / 1e6)
    return out


def progress(message: str) -> None:
    """One line on stderr, so the table on stdout stays clean."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- statistics ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


@dataclass(frozen=True)
class Stats:
    """Latency summary in milliseconds."""

    n: int
    p50: float
    p95: float
    p99: float
    mean: float
    max: float

    @staticmethod
    def of_ns(samples_ns: Sequence[int]) -> Stats:
        ms = [s / NS_PER_MS for s in samples_ns]
        return Stats(
            n=len(ms),
            p50=percentile(ms, 50),
            p95=percentile(ms, 95),
            p99=percentile(ms, 99),
            mean=sum(ms) / len(ms) if ms else math.nan,
            max=max(ms) if ms else math.nan,
        )


# ---- result rows --------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table.

    Latency rows carry ``stats`` (ms); scalar rows (memory, throughput, totals) carry
    ``value`` with its ``unit``. ``met`` is None for baselines and diagnostics.
    """

    bench: str  # "1", "2", ... (the numbering)
    what: str
    stats: Stats | None = None
    value: float | None = None
    unit: str = "ms"
    n: int | None = None
    ratio: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""

    def cells(self) -> list[str]:
        if self.stats is not None:
            n = str(self.stats.n)
            p50, p95, p99 = (fmt_ms(v) for v in (self.stats.p50, self.stats.p95, self.stats.p99))
        else:
            n = "" if self.n is None else str(self.n)
            p50, p95, p99 = fmt_value(self.value, self.unit), "", ""
        met = {None: "", True: "yes", False: "**NO**"}[self.met]
        what = self.what.lstrip()
        indent = "&nbsp;&nbsp;&nbsp;&nbsp;" * ((len(self.what) - len(what)) // 2)
        return [self.bench, indent + what, n, p50, p95, p99, self.ratio, self.target, met]


HEADER = ["#", "measurement", "n", "p50 / value", "p95", "p99", "ratio", "target", "target met?"]


def fmt_ms(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if value < 1:
        return f"{value:.3f} ms"
    return f"{value:.2f} ms" if value < 100 else f"{value:.0f} ms"


def fmt_value(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if unit == "ms":
        return fmt_ms(value)
    return f"{value:,.2f} {unit}" if abs(value) < 100 else f"{value:,.0f} {unit}"


def ratio(a: float, b: float) -> str:
    if b <= 0 or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a / b:.2f}x"


@dataclass
class BenchResult:
    """What one benchmark module returns: rows for the main table, plus extra sections."""

    rows: list[Row] = field(default_factory=list)
    sections: list[tuple[str, list[str]]] = field(default_factory=list)  # (title, md lines)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
    return out


# ---- throwaway homes ----------------------------------------------------------------------


@contextlib.contextmanager
def bench_home(name: str) -> Iterator[Path]:
    """A fresh AGENTBOX_HOME under /var/tmp (0711), every sandbox in it destroyed after."""
    home = Path(tempfile.mkdtemp(prefix=f"agentbox-bench-{name}-", dir="/var/tmp"))
    home.chmod(0o711)
    try:
        yield home
    finally:
        leftovers = destroy_all(home)
        if leftovers:
            progress(f"{name}: destroyed {leftovers} sandboxes left behind")
        remove_home(home)


def destroy_all(home: Path) -> int:
    """Destroy every sandbox recorded in ``home``; returns how many there were."""
    records = Sandbox.list(home=home)
    for record in records:
        with contextlib.suppress(Exception):
            Sandbox.connect(record.id, home=home).kill()
    return len(records)


def mounts_under(path: Path) -> list[str]:
    prefix = str(path) + "/"
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]


def remove_home(home: Path) -> None:
    """Delete the home unless something is still mounted in it (never delete through one)."""
    release_home_mounts(home)
    left = mounts_under(home)
    if left:
        progress(f"NOT removing {home}: still mounted: {left[:3]}")
        return
    shutil.rmtree(home, ignore_errors=True)


# ---- machine facts ------------------------------------------------------------------------


def _meminfo_kib() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0])
    return out


def meminfo_kib() -> dict[str, int]:
    return _meminfo_kib()


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "n/a"
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else "n/a"


def machine_facts() -> list[tuple[str, str]]:
    cpu = "n/a"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = _meminfo_kib()
    cgroups: str
    try:
        cgroups = _layout().mode
    except Exception as e:  # report, never fail the run for a fact
        cgroups = f"n/a ({e})"
    fs = _first_line(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", "/var/tmp"])
    return [
        ("nproc", _first_line(["nproc"])),
        ("CPU", cpu),
        ("kernel", platform.release()),
        ("memory", f"{mem['MemTotal'] / 1024 / 1024:.1f} GiB, swap {mem['SwapTotal'] // 1024} MiB"),
        ("OS", _os_release()),
        ("Python", platform.python_version()),
        ("bubblewrap", _first_line(["bwrap", "--version"])),
        ("cgroups", cgroups),
        ("cgroup migration (probe)", cgroup_migration_probe()),
        ("cgroup favordynmods", favordynmods_in_kernel_log()),
        ("/var/tmp filesystem", fs),
    ]


def cgroup_migration_probe(samples: int = 10, idle_s: float = 0.1) -> str:
    """p50 time for a process to move itself into a cgroup after ``idle_s`` without any move.

    After a pause the first migration waits for an RCU grace period (several ms) unless
    the kernel runs in cgroup "favordynmods" mode; agentbox pays this on hybrid hosts for
    every command that follows a pause, and for every create. Must run before threads.
    """
    probe = _layout().unified / f"agentbox-bench-probe-{os.getpid()}"
    probe.mkdir()
    times: list[float] = []
    try:
        for _ in range(samples):
            time.sleep(idle_s)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: move itself, report the time, exit at once
                t0 = time.perf_counter_ns()
                fd = os.open(probe / "cgroup.procs", os.O_WRONLY)
                os.write(fd, b"0")
                os.close(fd)
                os.write(w, str(time.perf_counter_ns() - t0).encode())
                os._exit(0)
            os.close(w)
            with os.fdopen(r, "rb") as f:
                times.append(int(f.read() or b"0") / NS_PER_MS)
            os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    p50 = percentile(times, 50)
    mode = "RCU grace period per migration" if p50 > 2.0 else "no grace-period wait"
    return f"{p50:.2f} ms p50 after {idle_s * 1000:g} ms idle ({mode})"


def favordynmods_in_kernel_log() -> str:
    """Whether cgroup favordynmods was switched on this boot (the kernel logs it; it is
    one-way on recent kernels and makes every cgroup migration cheap)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no dmesg)"
    hits = [line for line in done.stdout.splitlines() if "favordynmods" in line]
    if done.returncode != 0:
        return "unknown (dmesg failed)"
    if hits:
        return f"on this boot, per the kernel log: {hits[-1].split(']', 1)[-1].strip()}"
    return "not in the kernel log ring buffer (default off; the buffer may have rotated)"


def _os_release() -> str:
    with contextlib.suppress(OSError), open("/etc/os-release") as f:
        for line in f:
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    return "n/a"


# ---- process memory -----------------------------------------------------------------------


def pss_kib(pid: int) -> int:
    """Proportional set size of one process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0


@functools.cache
def _layout() -> CgroupLayout:
    return CgroupLayout.detect()


def sandbox_pids(sandbox_id: str) -> list[int]:
    """Every host process of a sandbox: its bwrap monitor and init live in its cgroups."""
    return _layout().sandbox(sandbox_id).pids()


class CpuMeter:
    """CPU seconds the whole host spent busy vs. what this process and its waited-for
    children spent: the difference is what other processes took during the run."""

    def __init__(self) -> None:
        self._host0, self._own0, self._wall0 = _host_busy_s(), _own_cpu_s(), time.monotonic()

    def others(self) -> str:
        host = _host_busy_s() - self._host0
        own = _own_cpu_s() - self._own0
        wall = time.monotonic() - self._wall0
        capacity = wall * cpu_count()
        other = max(0.0, host - own)
        return (
            f"{other:.0f} CPU-s of {capacity:.0f} available ({100 * other / capacity:.0f}%); "
            f"this run: {own:.0f} CPU-s (kernel threads working for this run count as others)"
        )


def _host_busy_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user..steal; guest time is already in user
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def write_doc_section(
    key: str, title: str, script: str, flags: str, about: str, table: str
) -> None:
    """Replace (or append) the ``<!-- key:begin -->…<!-- key:end -->`` section of
    docs/benchmarks.md: a heading, the command that produced it and when, and the table."""
    doc = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = f".venv/bin/python bench/{script} {flags + ' ' if flags else ''}--write"
    section = (
        f"{begin}\n## {title}\n\nGenerated by `{command}` at {stamp}. {about}\n\n{table}\n{end}"
    )
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if begin in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)
