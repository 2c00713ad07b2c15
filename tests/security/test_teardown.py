"""Attack 7 — surviving destruction, and leaking host resources over many lifecycles.

Covers: daemonised processes (``setsid nohup``, a subshell double fork, a python
fork+setsid+fork daemon, a background ``commands.start`` process) are all gone from the
host's /proc as soon as ``sb.kill()`` returns; 1,000 create/destroy cycles (some running
commands, background processes and file writes) leave no mount, cgroup, nsfs
(network namespace) mount, loop device, directory, record or process behind.
"""

from __future__ import annotations

import functools
import secrets
import time
from pathlib import Path

from secprobe import host_uid

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime
from hostres import (
    cmdline,
    host_pids,
    host_resources,
    nsfs_mounts,
    pids_with_cmdline,
    proc_uid,
    wait_for,
)

CYCLES = 1000

DAEMON = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.closerange(0, 3)\n"
    "        os.execvp('sleep', ['sleep', '{duration}'])\n"
    "    os._exit(0)\n"
)


def test_daemonised_processes_do_not_survive_kill(runtime: Runtime, agentbox_home: Path) -> None:
    sb = Sandbox.create(memory="128MiB", disk="32MiB", home=agentbox_home)
    durations = [f"{1000 + secrets.randbelow(100_000)}.{n}" for n in range(4)]
    commands = [f"sleep {d}" for d in durations]
    try:
        uid = host_uid(sb)
        sb.commands.run(
            f"setsid nohup sleep {durations[0]} >/dev/null 2>&1 & "
            f"(setsid sleep {durations[1]} >/dev/null 2>&1 &) ; true"
        )
        sb.commands.run(["python3", "-c", DAEMON.format(duration=durations[2])])
        sb.commands.start(["sleep", durations[3]])
        for command in commands:
            wait_for(functools.partial(pids_with_cmdline, command, uid), 10, f"{command} to run")
    finally:
        sb.kill()
    survivors = {c: pids_with_cmdline(c) for c in commands if pids_with_cmdline(c)}
    assert not survivors, f"processes survived sb.kill(): {survivors}"


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rfind(")") + 2 :].split()[0]


def _processes_of(sandbox_ids: set[str], *, zombies: bool) -> list[str]:
    """Host processes still in a cgroup of one of ``sandbox_ids`` (zombies: exited processes
    whose parent, the host's init after the sandbox's bubblewrap died, has not reaped them
    yet; they hold a pid but run nothing)."""
    found = []
    for pid in host_pids():
        try:
            groups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if not zombies and _state(pid) in ("Z", "gone"):
            continue
        for line in groups.splitlines():
            path = line.split(":", 2)[2]
            parts = path.split("/")
            if len(parts) > 2 and parts[1] == "agentbox" and parts[2] in sandbox_ids:
                found.append(f"{pid} uid={proc_uid(pid)} {cmdline(pid)!r} {path}")
                break
    return found


def test_thousand_lifecycles_leave_nothing_behind(runtime: Runtime, agentbox_home: Path) -> None:
    before = host_resources(agentbox_home)
    nsfs_before = nsfs_mounts()
    created: set[str] = set()
    started = time.monotonic()
    for i in range(CYCLES):
        sb = Sandbox.create(memory="64MiB", disk="32MiB", pids=32, home=agentbox_home)
        created.add(sb.id)
        try:
            if i % 10 == 0:
                assert sb.commands.run("true").exit_code == 0
            if i % 50 == 0:
                sb.commands.start("setsid sleep 1000 & sleep 1000")
                sb.files.write("/workspace/f", b"x" * 4096)
        finally:
            sb.kill()
    elapsed = time.monotonic() - started
    after = host_resources(agentbox_home)
    # Cgroups are host-wide (other homes may run sandboxes meanwhile): compare ours only.
    leaked = {k: sorted(set(after[k]) - set(before[k])) for k in after if k != "cgroups"}
    leaked["cgroups"] = host_resources(agentbox_home, created)["cgroups"]
    assert not any(leaked.values()), f"leaked after {CYCLES} cycles: {leaked}"
    assert nsfs_mounts() == nsfs_before
    assert not _processes_of(created, zombies=False), _processes_of(created, zombies=False)
    # Exited processes are reaped by the host's init, not by us: give it a moment.
    wait_for(lambda: not _processes_of(created, zombies=True), 15, "zombies to be reaped")
    assert not created & {r.id for r in Sandbox.list(home=agentbox_home)}
    assert not [p for p in (agentbox_home / "sandboxes").iterdir() if p.name in created]
    print(
        f"{CYCLES} create/destroy cycles in {elapsed:.1f}s ({elapsed / CYCLES * 1000:.1f} ms each)"
    )
    # ~20 s on an idle 2-core host; the bound only catches pathological slowdowns (a leak
    # that makes each cycle slower than the last), not a busy CI machine.
    assert elapsed < 180, f"{CYCLES} cycles took {elapsed:.0f}s"
