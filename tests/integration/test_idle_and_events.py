"""Idle timeouts, the definition of activity, and lifecycle events with their reasons,
against real sandboxes (the watcher's passes are driven by the test, not by a timer)."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.errors import AgentboxError, SandboxNotFound, SandboxNotRunning
from agentbox.runtime.lifecycle import IdleWatcher
from agentbox.runtime.runtime import Runtime
from tierkit import command_lines, not_on_gvisor

# Every test on both isolation tiers (tests/conftest.py, default_tier).
pytestmark = pytest.mark.usefixtures("default_tier")

IDLE = 1.5  # seconds


def events(runtime: Runtime, sandbox_id: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in runtime.store.events_after(0, sandbox=sandbox_id)]


def idle_past(watcher: IdleWatcher, seconds: float = IDLE + 0.7) -> list[str]:
    """Two passes ``seconds`` apart (the first one measures CPU, the second decides)."""
    watcher.check()
    time.sleep(seconds)
    return watcher.check()


def acted_on_when_idle(watcher: IdleWatcher, sandbox_id: str, rounds: int = 8) -> bool:
    """Whether the watcher acts on the sandbox within ``rounds`` idle periods. The work a
    call started goes on a moment after it returns (on gvisor a background process's
    ``runsc exec`` takes ~0.1 s of CPU), which on a loaded host can fall after the first
    pass: the watcher rightly counts it as activity and the idle clock starts again."""
    return any(sandbox_id in idle_past(watcher) for _ in range(rounds))


@pytest.fixture
def make(agentbox_home: Path, runtime: Runtime) -> Iterator[Any]:
    made: list[Sandbox] = []

    def create(**kwargs: Any) -> Sandbox:
        kwargs = {"memory": "256MiB", "disk": "128MiB", "network": "none", **kwargs}
        sb = Sandbox.create(home=agentbox_home, **kwargs)
        made.append(sb)
        return sb

    yield create
    for sb in made:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


def test_an_idle_sandbox_with_a_sleeping_process_is_paused(runtime: Runtime, make: Any) -> None:
    sb = make(idle_timeout=IDLE)
    sb.commands.start("sleep 600")  # a background process that does nothing
    assert acted_on_when_idle(IdleWatcher(runtime), sb.id)
    assert runtime.get(sb.id).state == "paused"
    assert ("paused", "idle") in events(runtime, sb.id)
    # a call resumes it transparently, and says why
    assert sb.commands.run("echo back").stdout == "back\n"
    assert runtime.get(sb.id).state == "running"
    assert events(runtime, sb.id)[-1] == ("resumed", "activity")


def test_a_busy_cpu_keeps_a_sandbox_without_calls(runtime: Runtime, make: Any) -> None:
    sb = make(idle_timeout=IDLE, cpus=1)
    sb.commands.start("while :; do :; done")  # a long test run, say
    watcher = IdleWatcher(runtime)
    for _ in range(3):
        assert sb.id not in idle_past(watcher, IDLE / 2 + 0.3)
    assert runtime.get(sb.id).state == "running"
    assert ("paused", "idle") not in events(runtime, sb.id)


def test_a_running_foreground_command_is_activity(runtime: Runtime, make: Any) -> None:
    """A command a call waits on keeps its sandbox from idling, though it uses no CPU. The
    twin, with the same command in the background, is the control: the watcher finds it
    idle over the same passes (the Sentry's own CPU on gvisor keeps neither awake)."""
    import threading

    sb, twin = make(idle_timeout=IDLE), make(idle_timeout=IDLE)
    for each in (sb, twin):
        each.commands.start("sleep 1")  # warm: the sandbox works
    done = threading.Event()

    def foreground() -> None:
        try:
            sb.commands.run("sleep 30", timeout=60)
        except AgentboxError:  # the kill below (gvisor: the exec agent hangs up)
            pass
        finally:
            done.set()

    worker = threading.Thread(target=foreground, daemon=True)
    worker.start()
    twin.commands.start("sleep 30")
    watcher = IdleWatcher(runtime)
    for _ in range(8):  # as acted_on_when_idle: a start's own work can fall in a pass
        found = idle_past(watcher)
        assert sb.id not in found  # no CPU, no calls: only the command
        if twin.id in found:
            break
    else:
        raise AssertionError("the control was never found idle: this check could not fail")
    assert runtime.get(sb.id).state == "running" and not done.is_set()
    sb.kill()  # ends the command
    worker.join(30)
    assert done.is_set()


def test_calls_restart_the_idle_clock(runtime: Runtime, make: Any) -> None:
    sb = make(idle_timeout=IDLE)
    watcher = IdleWatcher(runtime)
    watcher.check()
    for _ in range(3):
        time.sleep(IDLE / 2)
        sb.files.write("/workspace/note", "x")  # a call
        assert sb.id not in watcher.check()
    assert runtime.get(sb.id).state == "running"


def test_on_idle_stop_keeps_files_and_resume_starts_it_again(
    runtime: Runtime, make: Any, default_tier: str
) -> None:
    not_on_gvisor(default_tier, "on_idle stop is refused there with tier_unsupported "
                  "(tests/integration/test_gvisor_tier.py checks the error)")  # fmt: skip
    sb = make(idle_timeout=IDLE, on_idle="stop")
    sb.files.write("/workspace/kept.txt", "still here")
    sb.commands.start("sleep 600")
    assert acted_on_when_idle(IdleWatcher(runtime), sb.id)
    assert runtime.get(sb.id).state == "stopped"
    assert events(runtime, sb.id)[-1] == ("stopped", "idle")
    with pytest.raises(SandboxNotRunning, match="resume it"):
        sb.commands.run("true")
    sb.resume()
    assert events(runtime, sb.id)[-1] == ("started", "operator")
    assert sb.files.read("/workspace/kept.txt") == "still here"
    left = [line for line in command_lines(sb) if line.startswith("sleep")]
    assert left == []  # its processes were ended, not kept


def assert_init_exited_when_it_returns(
    runtime: Runtime, sandbox_id: str, end: Callable[[str], object]
) -> None:
    """``end(sandbox_id)`` (a stop or a destroy) returns only once the init has exited."""
    init = runtime.get(sandbox_id).init_pid
    assert init is not None
    pidfd = os.pidfd_open(init)
    try:
        end(sandbox_id)
        assert select.select([pidfd], [], [], 0)[0], f"{end.__name__} returned before init exited"
    finally:
        os.close(pidfd)


def test_a_stop_returns_once_the_init_has_exited(
    runtime: Runtime, make: Any, default_tier: str
) -> None:
    """A stop empties the sandbox's cgroup, but the kernel takes a process out of its
    cgroup before it marks it exited: in between, its namespaces are gone while a pidfd
    still shows it running, and another process's cached view (the SDK's) tried to enter
    them ("/proc/PID/ns/ipc: No such file or directory") instead of saying "stopped".
    An init with many children to reap on its way out widens that window."""
    not_on_gvisor(default_tier, "the init there is runsc, whose namespaces nothing enters "
                  "(commands go through the exec agent's socket)")  # fmt: skip
    sb = make(pids=512)
    other = Runtime(runtime.home)  # the SDK's own runtime holds sb's cached view
    for _ in range(5):
        sb.commands.run("for i in $(seq 150); do sleep 600 & done")
        assert_init_exited_when_it_returns(runtime, sb.id, other.stop)
        with pytest.raises(SandboxNotRunning, match="resume it"):
            sb.commands.run("true")
        sb.resume()


def test_a_destroy_returns_once_the_init_has_exited(
    runtime: Runtime, make: Any, default_tier: str
) -> None:
    """The stop's window above, for a destroy that leaves its teardown to a thread (a
    gateway's): it returns once the processes are dead, and the init must be marked
    exited by then, so another process's cached view says "not found" instead of trying
    to enter namespaces that are gone."""
    not_on_gvisor(default_tier, "the init there is runsc, whose namespaces nothing enters "
                  "(commands go through the exec agent's socket)")  # fmt: skip
    other = Runtime(runtime.home)
    other.defer_teardowns()
    try:
        for _ in range(5):
            sb = make(pids=1024)
            sb.commands.run("for i in $(seq 400); do sleep 600 & done")
            assert_init_exited_when_it_returns(runtime, sb.id, other.destroy)
            # "destroying" while its teardown runs, "not found" after: never a launch error
            with pytest.raises((SandboxNotRunning, SandboxNotFound)):
                sb.commands.run("true")
    finally:
        other.finish_teardowns()


def test_on_idle_destroy(runtime: Runtime, make: Any) -> None:
    sb = make(idle_timeout=IDLE, on_idle="destroy")
    assert acted_on_when_idle(IdleWatcher(runtime), sb.id)
    with pytest.raises(SandboxNotFound):
        runtime.get(sb.id)
    assert events(runtime, sb.id)[-1] == ("destroyed", "idle")


def test_idle_timeout_zero_means_never(runtime: Runtime, make: Any) -> None:
    sb = make(idle_timeout=0)
    control = make(idle_timeout=IDLE)  # idle as long, with a timeout: acted on
    assert acted_on_when_idle(IdleWatcher(runtime), control.id)
    assert runtime.get(sb.id).state == "running"
    assert ("paused", "idle") not in events(runtime, sb.id)


def test_every_event_carries_its_reason(runtime: Runtime, make: Any) -> None:
    sb = make(idle_timeout=0)
    sb.pause()
    sb.resume()
    sb.stop()
    sb.resume()
    sb.kill()
    assert events(runtime, sb.id) == [
        ("created", "operator"),
        ("paused", "operator"),
        ("resumed", "operator"),
        ("stopped", "operator"),
        ("started", "operator"),
        ("destroyed", "operator"),
    ]


def test_lifetime_end_is_an_event(runtime: Runtime, make: Any) -> None:
    sb = make(timeout=2, idle_timeout=0)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and runtime.store.get(sb.id) is not None:
        IdleWatcher(runtime).check()
        time.sleep(0.3)
    assert runtime.store.get(sb.id) is None
    assert events(runtime, sb.id)[-1] == ("destroyed", "lifetime")


def test_a_crashed_sandbox_ends_with_reason_error(runtime: Runtime, make: Any) -> None:
    sb = make(idle_timeout=0)
    record = runtime.get(sb.id)
    assert record.init_pid is not None
    os.kill(record.init_pid, 9)  # from the host: as if it crashed
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and runtime.store.get(sb.id) is not None:
        IdleWatcher(runtime).check()
        time.sleep(0.2)
    assert events(runtime, sb.id)[-1] == ("destroyed", "error")


def test_an_oom_kill_is_an_event(runtime: Runtime, make: Any, default_tier: str) -> None:
    not_on_gvisor(default_tier, "one memory cgroup holds the Sentry and every process, so "
                  "an OOM ends the whole sandbox, not one process (docs/design.md; "
                  "tests/security/test_resource_limits.py checks that tier's answer)")  # fmt: skip
    sb = make(memory="64MiB", idle_timeout=0)
    watcher = IdleWatcher(runtime)
    watcher.check()
    result = sb.commands.run(["python3", "-c", "x = bytearray(512 * 1024 * 1024)"], timeout=60)
    assert result.exit_code != 0  # killed
    watcher.check()
    assert ("oom", "oom") in events(runtime, sb.id)
    assert runtime.get(sb.id).state == "running"  # the sandbox itself lives on
