"""The gVisor tier's exec agent (isolation/gvisor_agent.c, runtime/gvisor_agent_client.py):
one-shot commands are one round trip to the sandbox's first process, which the sandbox
itself can neither kill, trace, nor impersonate; without it, commands still run (runsc
exec). The host side's handling of hostile replies: tests/unit/test_gvisor_agent_client.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.isolation import gvisor
from agentbox.runtime import gvisor_agent_client as agent
from agentbox.runtime.runtime import Runtime
from hostres import runsc_execs
from tierkit import command_lines


@pytest.fixture(scope="module", autouse=True)
def runsc_ready() -> None:
    probe = gvisor.probe()
    if not probe.ok:
        pytest.fail(f"the gvisor tier cannot run on this host: {probe.detail} "
                    f"(fix: {gvisor.INSTALL_FIX}; see agentbox doctor)")  # fmt: skip


@pytest.fixture(scope="module")
def box(agentbox_home: Path) -> Iterator[Sandbox]:
    sb = Sandbox.create(memory="512MiB", disk="256MiB", isolation="gvisor", network="none",
                        home=agentbox_home)  # fmt: skip
    try:
        yield sb
    finally:
        sb.kill()


def _socket(runtime: Runtime, sb: Sandbox) -> Path:
    return runtime.home / "sandboxes" / sb.id / "agent" / agent.SOCKET_NAME


def _runsc_execs_during_a_command(sb: Sandbox) -> set[int]:
    """The ``runsc exec`` processes the host runs while one command of ``sb`` runs."""
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(sb.commands.run, "echo running; sleep 2", timeout=60)
        seen: set[int] = set()
        while not running.done():
            seen |= runsc_execs(sb.id)
            time.sleep(0.02)  # sampling period, not a wait for a condition
        r = running.result()
    assert (r.exit_code, r.stdout) == (0, "running\n"), r
    return seen


def test_commands_go_to_the_agent_not_runsc_exec(box: Sandbox) -> None:
    """Its sandbox's PID 1 is the agent, and no ``runsc exec`` runs on the host while a
    command does (the fallback's does: test_without_an_agent_commands_fall_back...)."""
    r = box.commands.run("tr '\\0' ' ' < /proc/1/cmdline")
    assert r.exit_code == 0 and r.stdout.startswith("/.agentbox/agent "), r.stdout
    assert _runsc_execs_during_a_command(box) == set()
    # Each contract item through the agent: argv, env, cwd, stdin, exit code, signal.
    r = box.commands.run(["sh", "-c", 'cat; echo "$X" $(pwd) >&2; exit 9'], env={"X": "x y"},
                         cwd="/tmp", stdin=b"in\x00put")  # fmt: skip
    assert (r.exit_code, r.stdout_bytes, r.stderr) == (9, b"in\x00put", "x y /tmp\n")
    r = box.commands.run("kill -TERM $$")
    assert (r.exit_code, r.signal) == (128 + 15, 15)


def test_the_sandbox_cannot_trace_or_replace_its_agent(box: Sandbox, runtime: Runtime) -> None:
    """Nor signal it: every command is the init of a PID namespace below the agent's, in
    which the agent has no pid (``/proc/1`` is the container's procfs, not a handle)."""
    probe = (
        "import os, socket\n"
        "def attempt(f):\n"
        "    try: f(); return 'done'\n"
        "    except OSError as e: return e.errno\n"
        "print(attempt(lambda: open('/proc/1/mem', 'rb').read(1)))\n"
        # gVisor shows a non-dumpable process's environ; the agent's holds no request's
        "def env(): assert b'SECRET' not in open('/proc/1/environ', 'rb').read()\n"
        "print(attempt(env))\n"
        f"path = '{agent.IN_SANDBOX_DIR}/{agent.SOCKET_NAME}'\n"
        "print(attempt(lambda: os.unlink(path)))\n"
        "print(attempt(lambda: os.rename(path, path + '.x')))\n"
        "print(attempt(lambda: socket.socket(socket.AF_UNIX).connect(path)))\n"
    )
    r = box.commands.run(["python3", "-c", probe], env={"TOKEN": "SECRET"})
    mem, environ, unlinked, renamed, connected = r.stdout.split()
    assert mem != "done" and environ == "done"  # not dumpable; no secret in environ
    assert unlinked != "done" and renamed != "done"  # its directory is root's
    assert connected != "done"  # runsc --host-uds=create: no connect to host sockets
    assert _socket(runtime, box).is_socket()
    assert box.commands.run("echo still served").stdout == "still served\n"


def test_without_an_agent_commands_fall_back_to_runsc_exec(
    agentbox_home: Path, runtime: Runtime
) -> None:
    sb = Sandbox.create(memory="256MiB", isolation="gvisor", network="none", home=agentbox_home)
    try:
        _socket(runtime, sb).unlink()  # what a sandbox restored from a checkpoint looks like
        r = sb.commands.run("echo via runsc; exit 4")
        assert (r.exit_code, r.stdout) == (4, "via runsc\n")
        assert _runsc_execs_during_a_command(sb)  # the control of the agent test above
    finally:
        sb.kill()


def test_a_timeout_through_the_agent_kills_the_tree(box: Sandbox) -> None:
    r = box.commands.run("setsid sleep 5151 & echo forked; sleep 5152", timeout=5)
    assert r.timed_out and r.exit_code == 137 and "forked" in r.stdout, r
    assert not [line for line in command_lines(box) if "sleep 515" in line]
