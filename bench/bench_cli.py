"""What a user feels: whole ``agentbox`` processes (the CLI, a one-shot SDK script),
beside whole baseline processes, all in one interleaved run (A B C ... A B C ...), so
that a shared machine's drift moves every row alike and the ratios stay honest.

    .venv/bin/python bench/bench_cli.py [--quick] [-n N] [--write]   (as root)

Rows: bare ``true``; ``python -c pass`` and ``python -S -c pass`` (the interpreter's own
start, with and without ``site``); a plain bwrap
sandbox running ``true`` (``baselines.PlainBwrap``: agentbox's namespace shape, no disk,
cgroup or state) and ``nsenter`` into a live one (the exec floor); ``podman run --rm`` and
``podman exec`` on the default template's rootfs tree, network none, when podman is
installed (``scripts/install.sh --bench``; ``baselines.Podman``); then ``agentbox --help``, ``agentbox sandbox exec ID -- true``,
a one-shot SDK script (import, ``Sandbox.create()``, ``run('true')``, ``kill()``) and
``agentbox sandbox create`` / ``rm``. Each figure is one process from spawn to exit, wall
clock; CPU (user + system of the whole process tree, from the reaped children's rusage)
is shown beside it, since on a loaded host wall time also counts waiting for a core.
``agentbox`` is the command scripts/install.sh writes (``cli/script.py``: Python without
``site``), written into the bench's home; one row runs pip's console script instead.

(A ``--before SRC`` mode ran the rows with a base checkout's ``src`` on the path; dropped:
in the bench's fresh home the base code took other paths than in a used one, e.g. no
cached spec or help text, so its rows did not measure the base as users run it.)
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import itertools
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import agentbox  # noqa: E402
from agentbox.cli import script  # noqa: E402
from baselines import NsenterTarget, PlainBwrap, Podman, podman_path, template_rootfs  # noqa: E402
from common import (  # noqa: E402
    HEADER,
    Row,
    Stats,
    bench_home,
    md_table,
    percentile,
    progress,
    ratio,
    write_doc_section,
)

if TYPE_CHECKING:
    from agentbox.runtime.store import Store

PIP_SCRIPT = str(Path(sys.executable).parent / "agentbox")  # pip's console script
EXEC_TARGET_MS = 40.0
HELP_TARGET_MS = 60.0
ONESHOT_TARGET_MS = 60.0
ONESHOT_PODMAN_SPEEDUP = 2.0  # issue 20: the one-shot script at least 2x faster than podman run
EXEC_PODMAN_SHARE = 3.0  # issue 20: `sandbox exec` at most 1/3 of `podman exec`
PODMAN_NOTE = (
    "podman (Debian 12's 4.3, with runc: this host's crun refuses its hybrid cgroups) runs "
    "`true` on the default template's rootfs tree, as the sandboxes do: an overlay on top "
    "(`--rootfs DIR:O`), the host's /usr bound read-only, network none; `podman exec` "
    "enters a container of it left running (`sleep infinity`). "
)
ONESHOT = (
    "from agentbox import Sandbox\n"
    "sb = Sandbox.create()\n"
    "assert sb.commands.run('true').exit_code == 0\n"
    "sb.kill()\n"
)
# The same with settings no create in this home has seen (a memory size new each run):
# validated with pydantic, not read back from the home's cache (runtime/spec_cache.py).
ONESHOT_NEW_SETTINGS = ONESHOT.replace("Sandbox.create()", "Sandbox.create(memory='{mib}MiB')")
# The same script printing the wall clock (time.time(), which the bench reads too) at its
# first line and after each step: where a one-shot script's time goes. Its own row, so the
# plain one stays unmarked.
ONESHOT_MARKED = (
    "import time\n"
    "print(time.time())\n"
    "from agentbox import Sandbox\n"
    "print(time.time())\n"
    "sb = Sandbox.create()\n"
    "print(time.time())\n"
    "assert sb.commands.run('true').exit_code == 0\n"
    "print(time.time())\n"
    "sb.kill()\n"
    "print(time.time())\n"
)
# With the home's gateway serving: the same script, no AGENTBOX_URL, on the home of a gateway
# the bench started with a warm pool of POOL sandboxes of the default spec; the SDK finds it
# at $AGENTBOX_HOME/gateway.sock (agentbox/endpoint.py) and talks to it over the socket
# (client/unixhttp.py). Its own home: the in-process rows' home has no gateway (a pooled
# sandbox is claimed by any create in the home, so there the pool would serve them too).
POOL = 2
ONESHOT_SOCKET_MARKED = ONESHOT_MARKED + "print(int(sb.record.from_pool))\n"
PHASES = (
    "interpreter start (spawn to the script's first line)",
    "from agentbox import Sandbox",
    "Sandbox.create()",
    "sb.commands.run(['true'])",
    "sb.kill()",
    "interpreter exit (after kill() to reaped)",
)


class Measured:
    """Wall and CPU milliseconds of each run of one row."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.wall_ns: list[int] = []
        self.cpu_ms: list[float] = []

    @property
    def stats(self) -> Stats:
        return Stats.of_ns(self.wall_ns)

    @property
    def cpu_p50(self) -> float:
        return percentile(self.cpu_ms, 50)


def run_process(argv: list[str], env: dict[str, str]) -> tuple[int, float, bytes]:
    """One whole process: wall ns from spawn to reaped, its CPU ms, its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter_ns()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    wall = time.perf_counter_ns() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {done.returncode}: {done.stderr[-400:]!r}")
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e3
    return wall, cpu, done.stdout


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min) / {five:.1f} (5 min)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="15 rounds instead of 31")
    parser.add_argument("-n", type=int, help="rounds (each row runs once per round)")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    n = args.n or (15 if args.quick else 31)
    # What users run has its bytecode cached; PYTHONDONTWRITEBYTECODE (set on some hosts)
    # would otherwise make every run compile agentbox from source.
    compileall.compile_dir(str(Path(agentbox.__file__).parent), quiet=1)
    podman_cmd = podman_path()
    with bench_home("cli") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")}
        env["AGENTBOX_HOME"] = str(home)
        agentbox_cmd = str(home / "agentbox")
        script.write(agentbox_cmd)  # what scripts/install.sh installs
        plain = PlainBwrap(home / "baseline", home / "lib")
        target = NsenterTarget(plain)
        created = run_process([agentbox_cmd, "sandbox", "create"], env)[2].decode().strip()
        gateway = HomeGateway(agentbox_cmd, env, POOL)
        # On the tree the sandboxes' overlay has below (the create above made it).
        podman = Podman(podman_cmd, template_rootfs(home)) if podman_cmd else None
        try:
            if podman is not None:
                podman.start()  # the container `podman exec` enters
            phases: list[list[float]] = [[] for _ in PHASES]
            socket_phases: list[list[float]] = [[] for _ in PHASES]
            gateway.start()
            rows, rounds = _plan(env, plain, target, created, podman, agentbox_cmd, phases,
                                 gateway, socket_phases)  # fmt: skip
            progress(f"cli: {n} rounds of {len(rows)} rows, load {load()}")
            load_before = load()
            for i in range(n + 2):  # the first two rounds warm caches up, not counted
                for measured, once in rounds:
                    wall, cpu = once()
                    if i >= 2:
                        measured.wall_ns.append(wall)
                        measured.cpu_ms.append(cpu)
                if i == 1:  # nor are the warm-up rounds' phases
                    for samples in (*phases, *socket_phases):
                        samples.clear()
                    gateway.from_pool.clear()
            load_after = load()
        finally:
            gateway.stop()
            target.close()
            if podman is not None:
                podman.close()
            run_process([agentbox_cmd, "sandbox", "rm", created], env)
    table, met = _table(rows, podman)
    cpu_table = md_table(
        ["measurement", "CPU p50 (user + system)"],
        [[m.what, f"{m.cpu_p50:.1f} ms"] for m in rows.values()],
    )
    phase_table = md_table(
        ["one-shot SDK script, phase (marked rows)", "in-process p50", "p95",
         "through the home's gateway p50", "p95"],
        [[what, f"{percentile(ms, 50):.1f} ms", f"{percentile(ms, 95):.1f} ms",
          f"{percentile(sms, 50):.1f} ms", f"{percentile(sms, 95):.1f} ms"]
         for what, ms, sms in zip(PHASES, phases, socket_phases, strict=True)],
    )  # fmt: skip
    pooled = gateway.from_pool
    pool_line = (
        f"- through the home's gateway: {sum(pooled)} of {len(pooled)} marked creates were "
        f"served by the warm pool (pool of {POOL}; the rest made a sandbox while the script "
        "waited)"
    )
    text = "\n".join([*table, "", *cpu_table, "", *phase_table, "", *met, pool_line])
    print(text)
    if args.write:
        write_doc_section(
            "cli", "CLI and one-shot SDK scripts: whole processes", "bench_cli.py",
            f"-n {n}" if args.n else "--quick" if args.quick else "",
            f"{n} interleaved rounds (two warm-up rounds first), every row one whole process "
            f"from spawn to exit, wall clock; 2 cores, not reserved for the run: load "
            f"average {load_before} before, {load_after} after (a loaded host, or a slower "
            "one, stretches every row, the `python -c pass` baseline too: compare rows of "
            "the same run). "
            + (PODMAN_NOTE if podman else "podman is not installed on this host "
               "(`scripts/install.sh --bench` installs it), so its rows are absent: plain "
               "bwrap and nsenter into plain bwrap stand in for `podman run` and `podman "
               "exec`. ")
            + "The default sandbox (network allowlist, 2GiB, template default). "
            + "`agentbox --help` prints the text click rendered on an earlier call "
            "(`cli/help_cache.py`; the first-call row renders it each time); "
            "`sandbox exec` on a running sandbox takes `runtime/quick_exec.py`; the SDK "
            "script's settings were validated by an earlier create in this home "
            "(`runtime/spec_cache.py`; the new-settings row validates them each time). "
            + "`agentbox` is the command scripts/install.sh writes (`cli/script.py`: "
            "Python started without `site`); the `pip's console script` row runs the one "
            "pip writes. CPU is user + system time of each whole process tree (the "
            "sandbox's resident launcher, which runs `exec`'s command, is not in it). "
            "The earlier `before:` rows are gone: in the bench's fresh home the base "
            "code took other paths than it does in a used home. "
            + "The phase table is the marked rows': the script prints time.time() at its "
            "first line and after each step; the bench takes the same clock at spawn and "
            "at reap. `from agentbox import Sandbox` loads the SDK module only; the first "
            "call loads what it uses. In-process, the create imports the runtime (about 170 "
            "modules, half of them the standard library's: typing, pathlib, subprocess, "
            "sqlite3, json, ctypes, socket, ipaddress, dataclasses; and 21 dataclasses "
            "built) and makes the sandbox (disk clone and mounts, cgroups, the launcher's "
            "cgroup joins, bubblewrap, the veth); the command is one clone by the sandbox's "
            "resident launcher; the kill removes the veth, kills the cgroup and unmounts "
            "twice; the interpreter's exit tears down what the import built. "
            "The in-process rows run on a home no gateway serves (the SDK's look for one is "
            "a failed connect to the home's socket). "
            f"With the home's gateway serving (`agentbox serve` started by the bench on a home "
            f"of its own, config `sandbox.warm_pool: {POOL}`, the defaults otherwise: audit "
            "fsync always): the script, no `AGENTBOX_URL` set, finds it at "
            "`$AGENTBOX_HOME/gateway.sock` (`agentbox/endpoint.py`) and reaches it there with "
            "the operator token read beside it (`client/unixhttp.py`: about 40 modules, "
            "no runtime, no HTTP library); its create is a claim of a pooled sandbox (one "
            "database transaction, the request's settings applied, the audit record "
            "fsynced); its command and kill are the same work as in-process plus the "
            "gateway's part (token check, policy, audit). The pool is refilled between runs, "
            "untimed (the keeper starts a refill once the calls pause, "
            "`runtime/warmpool.py`), and the rows' CPU is the script's plus the gateway "
            "process's while the script ran. The CLI's create and rm on that home go "
            "through the gateway as well (its create a claim too).",
            text,
        )  # fmt: skip


class HomeGateway:
    """``agentbox serve`` on a bench home of its own, with a warm pool of ``pool`` default
    sandboxes; ``client_env`` is a script's on that home, which finds the gateway at its
    socket (the operator token is read beside it, as a root script on the host does)."""

    def __init__(self, agentbox_cmd: str, env: dict[str, str], pool: int) -> None:
        self._homes = bench_home("cli-gateway")
        self.home = self._homes.__enter__()
        self.pool = pool
        self.socket = self.home / "gateway.sock"
        config = self.home / "gateway.yaml"
        config.write_text(f"sandbox:\n  warm_pool: {pool}\n")
        self.env = {**env, "AGENTBOX_HOME": str(self.home)}
        self.argv = [agentbox_cmd, "serve", "--config", str(config),
                     "--listen", f"127.0.0.1:{_free_port()}"]  # fmt: skip
        # No AGENTBOX_URL: the SDK and the CLI find the gateway serving their home.
        self.client_env = dict(self.env)
        self.from_pool: list[int] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._store: Store | None = None

    def start(self) -> None:
        log = self.home / "serve.log"  # a file: a pipe nobody reads could stall the gateway
        with log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=out)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agentbox serve exited: {log.read_text()[-800:]}")
            if self.socket.exists() and self.pooled() >= self.pool:
                return
            time.sleep(0.2)
        raise RuntimeError("the gateway's warm pool did not fill in 300 s")

    def pooled(self) -> int:
        if self._store is None:
            from agentbox.runtime.runtime import Runtime

            self._store = Runtime(self.home).store
        return sum(r.state == "pooled" for r in self._store.list())

    def wait_full(self) -> None:
        """Until the pool is full again (untimed): each script finds what the first did,
        and the refill's CPU lands on no other row."""
        deadline = time.monotonic() + 120
        while self.pooled() < self.pool:
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway's warm pool did not refill in 120 s")
            time.sleep(0.02)

    def cpu_ms(self) -> float:
        """CPU time of the gateway process so far (all its threads, ns resolution)."""
        assert self.proc is not None
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
        return total / 1e6

    def run(self, code: str, refill: bool = True) -> tuple[int, float, bytes]:
        """One script through the gateway: wall, CPU of the script and of the gateway
        while it ran, its stdout; then (``refill``) the pool refilled."""
        before = self.cpu_ms()
        wall, cpu, out = run_process([sys.executable, "-c", code], self.client_env)
        cpu += self.cpu_ms() - before
        if refill:
            self.wait_full()
        return wall, cpu, out

    def run_cli(self, args: list[str]) -> tuple[int, float, bytes]:
        """One ``agentbox`` command on this home (through the gateway), timed as ``run``;
        the pool refilled after it, untimed."""
        before = self.cpu_ms()
        wall, cpu, out = run_process([self.argv[0], *args], self.client_env)
        cpu += self.cpu_ms() - before
        self.wait_full()
        return wall, cpu, out

    def stop(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(120)
        finally:
            self._homes.__exit__(None, None, None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plan(
    env: dict[str, str],
    plain: PlainBwrap,
    target: NsenterTarget,
    sandbox_id: str,
    podman: Podman | None,
    agentbox_cmd: str,
    phases: list[list[float]],
    gateway: HomeGateway,
    socket_phases: list[list[float]],
) -> tuple[dict[str, Measured], list[tuple[Measured, Callable[[], tuple[int, float]]]]]:
    def process(argv: list[str], with_env: dict[str, str] = env) -> Callable[[], tuple[int, float]]:
        return lambda: run_process(argv, with_env)[:2]

    def in_python(ns: Callable[[], int]) -> Callable[[], tuple[int, float]]:
        def once() -> tuple[int, float]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall = ns()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return wall, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e3

        return once

    pending: list[str] = []
    fresh = iter(range(1024, 1 << 20))  # MiB values: each run's settings are new

    def oneshot_new_settings() -> tuple[int, float]:
        code = ONESHOT_NEW_SETTINGS.format(mib=next(fresh))
        return run_process([sys.executable, "-c", code], env)[:2]

    def oneshot_marked() -> tuple[int, float]:
        spawned = time.time()
        wall, cpu, out = run_process([sys.executable, "-c", ONESHOT_MARKED], env)
        reaped = time.time()
        marks = [spawned, *(float(line) for line in out.split()), reaped]
        for samples, (a, b) in zip(phases, itertools.pairwise(marks), strict=True):
            samples.append((b - a) * 1e3)
        return wall, cpu

    def oneshot_socket_marked() -> tuple[int, float]:
        spawned = time.time()
        wall, cpu, out = gateway.run(ONESHOT_SOCKET_MARKED, refill=False)
        reaped = time.time()
        gateway.wait_full()
        *lines, from_pool = out.split()
        gateway.from_pool.append(int(from_pool))
        marks = [spawned, *(float(line) for line in lines), reaped]
        for samples, (a, b) in zip(socket_phases, itertools.pairwise(marks), strict=True):
            samples.append((b - a) * 1e3)
        return wall, cpu

    def help_first_call() -> tuple[int, float]:
        # No saved help text (cli/help_cache.py): click renders it, as on a first call.
        with tempfile.TemporaryDirectory() as cache:
            return run_process([agentbox_cmd, "--help"], {**env, "XDG_CACHE_HOME": cache})[:2]

    def create() -> tuple[int, float]:
        wall, cpu, out = run_process([agentbox_cmd, "sandbox", "create"], env)
        pending.append(out.decode().strip())
        return wall, cpu

    def remove() -> tuple[int, float]:
        return run_process([agentbox_cmd, "sandbox", "rm", pending.pop()], env)[:2]

    served: list[str] = []

    def create_served() -> tuple[int, float]:
        wall, cpu, out = gateway.run_cli(["sandbox", "create"])
        served.append(out.decode().strip())
        return wall, cpu

    def remove_served() -> tuple[int, float]:
        return gateway.run_cli(["sandbox", "rm", served.pop()])[:2]

    plan: list[tuple[str, str, Callable[[], tuple[int, float]]]] = [
        ("true", "baseline: bare `true`", process(["true"])),
        ("python", "baseline: `python -c pass`", process([sys.executable, "-c", "pass"])),
        ("python_s", "baseline: `python -S -c pass` (no site)",
         process([sys.executable, "-S", "-c", "pass"])),
        ("bwrap", "baseline: plain bwrap sandbox running `true`", in_python(plain.run_true)),
        ("nsenter", "baseline: nsenter into a live plain bwrap sandbox, `true`",
         in_python(target.run_true)),
    ]  # fmt: skip
    if podman is not None:
        plan += [
            ("podman_run", "baseline: `podman run --rm` `true` (default template's tree)",
             process(podman.run_argv("true"))),
            ("podman_exec", "baseline: `podman exec` `true` into a running container",
             process(podman.exec_argv("true"))),
        ]  # fmt: skip
    plan += [
        ("help", "agentbox --help", process([agentbox_cmd, "--help"])),
        ("help_first", "agentbox --help, no saved text (first call)", help_first_call),
        ("exec", "agentbox sandbox exec ID -- true",
         process([agentbox_cmd, "sandbox", "exec", sandbox_id, "--", "true"])),
        ("exec_pip", "agentbox sandbox exec ID -- true, pip's console script (with site)",
         process([PIP_SCRIPT, "sandbox", "exec", sandbox_id, "--", "true"])),
        ("oneshot", "SDK script: import, Sandbox.create(), run('true'), kill(); no gateway "
         "on the home (in-process)",
         process([sys.executable, "-c", ONESHOT])),
        ("oneshot_marked", "SDK script as above, printing the time after each step",
         oneshot_marked),
        ("oneshot_new", "SDK script as above, settings new to this home (memory=N MiB)",
         oneshot_new_settings),
        ("oneshot_socket",
         f"SDK script as above, the home's gateway serving (found at its socket; warm pool "
         f"of {POOL})", lambda: gateway.run(ONESHOT)[:2]),
        ("oneshot_socket_marked", "SDK script, the home's gateway serving, printing the time "
         "after each step", oneshot_socket_marked),
        ("create", "agentbox sandbox create, no gateway on the home (in-process)", create),
        ("rm", "agentbox sandbox rm ID, no gateway on the home (in-process)", remove),
        ("create_gw", "agentbox sandbox create, the home's gateway serving", create_served),
        ("rm_gw", "agentbox sandbox rm ID, the home's gateway serving", remove_served),
    ]  # fmt: skip
    rows = {key: Measured(what) for key, what, _ in plan}
    return rows, [(rows[key], once) for key, _, once in plan]


def _table(rows: dict[str, Measured], podman: Podman | None) -> tuple[list[str], list[str]]:
    p50 = {key: m.stats.p50 for key, m in rows.items()}
    exec_floor = "podman_exec" if "podman_exec" in rows else "nsenter"
    run_floor = "podman_run" if "podman_run" in rows else "bwrap"
    exec_ok = p50["exec"] <= EXEC_TARGET_MS
    exec_podman_ok = podman is not None and p50["exec"] * EXEC_PODMAN_SHARE <= p50["podman_exec"]
    help_ok = p50["help"] <= HELP_TARGET_MS
    oneshot_ok = p50["oneshot"] <= ONESHOT_TARGET_MS
    oneshot_podman_ok = (
        podman is not None and p50["oneshot"] * ONESHOT_PODMAN_SPEEDUP <= p50["podman_run"]
    )
    socket_ok = p50["oneshot_socket"] <= ONESHOT_TARGET_MS
    socket_podman_ok = (
        podman is not None and p50["oneshot_socket"] * ONESHOT_PODMAN_SPEEDUP <= p50["podman_run"]
    )
    out = []
    for key, m in rows.items():
        row = Row("20.1", m.what, m.stats)
        if key == "exec":
            row.ratio = f"{ratio(p50['exec'], p50[exec_floor])} of {exec_floor}"
            row.target = f"<= {EXEC_TARGET_MS:.0f} ms" + (
                f" and <= 1/{EXEC_PODMAN_SHARE:g} of podman exec" if podman else ""
            )
            row.met = exec_ok and (exec_podman_ok or podman is None)
        elif key == "help":
            row.ratio = f"{ratio(p50['help'], p50['python'])} of python"
            row.target, row.met = f"<= {HELP_TARGET_MS:.0f} ms", help_ok
        elif key == "oneshot":
            row.ratio = f"{ratio(p50['oneshot'], p50[run_floor])} of {run_floor}"
            row.target = f"<= {ONESHOT_TARGET_MS:.0f} ms" + (
                f" and <= 1/{ONESHOT_PODMAN_SPEEDUP:g} of podman run" if podman else ""
            )
            row.met = oneshot_ok and (oneshot_podman_ok or podman is None)
        elif key == "oneshot_socket":
            row.ratio = f"{ratio(p50[key], p50[run_floor])} of {run_floor}"
            row.target = f"<= {ONESHOT_TARGET_MS:.0f} ms" + (
                f" and <= 1/{ONESHOT_PODMAN_SPEEDUP:g} of podman run" if podman else ""
            )
            row.met = socket_ok and (socket_podman_ok or podman is None)
        elif key in ("create", "rm", "create_gw", "rm_gw", "help_first", "oneshot_new",
                     "exec_pip"):  # fmt: skip
            row.ratio = f"{ratio(p50[key], p50['python'])} of python"
        out.append(row.cells())
    met = [
        f"- target `sandbox exec` p50 <= {EXEC_TARGET_MS:.0f} ms: {p50['exec']:.1f} ms, "
        + ("met" if exec_ok else "NOT met"),
        (
            f"- target `sandbox exec` p50 <= 1/{EXEC_PODMAN_SHARE:g} of `podman exec`: "
            f"{p50['exec']:.1f} vs {p50['podman_exec']:.1f} ms "
            f"({ratio(p50['exec'], p50['podman_exec'])}), "
            + ("met" if exec_podman_ok else "NOT met")
            if podman is not None
            else "- target `sandbox exec` p50 <= 1/3 of `podman exec`: not checked (no podman; "
            f"nsenter into plain bwrap, which has no cgroup leaf or seccomp, takes "
            f"{p50['nsenter']:.1f} ms)"
        ),
        f"- target `agentbox --help` p50 <= {HELP_TARGET_MS:.0f} ms: {p50['help']:.1f} ms, "
        + ("met" if help_ok else "NOT met"),
    ]
    for key, which, ok, podman_ok in (
        ("oneshot", "no gateway on the home, in-process (`SDK script: import, ...` row)",
         oneshot_ok, oneshot_podman_ok),
        ("oneshot_socket", "the home's gateway serving (`SDK script as above, the home's "
         "gateway serving` row)", socket_ok, socket_podman_ok),
    ):  # fmt: skip
        met += [
            f"- target one-shot SDK script p50 <= {ONESHOT_TARGET_MS:.0f} ms, {which}: "
            f"{p50[key]:.1f} ms, " + ("met" if ok else "NOT met"),
            (
                f"- target one-shot SDK script >= {ONESHOT_PODMAN_SPEEDUP:g}x faster than "
                f"`podman run --rm`, {which}: {p50[key]:.1f} vs {p50['podman_run']:.1f} ms "
                f"({ratio(p50['podman_run'], p50[key])} faster), "
                + ("met" if podman_ok else "NOT met")
                if podman is not None
                else f"- target one-shot SDK script >= 2x faster than `podman run --rm`, "
                f"{which}: not checked (no podman)"
            ),
        ]
    return md_table(HEADER, out), met


if __name__ == "__main__":
    main()
