"""Sandbox lifecycle: create, list, get, destroy, outliving the creator, lifetime."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.errors import (
    InvalidRequest,
    SandboxNotFound,
    SandboxNotRunning,
    TemplateNotFound,
)
from agentbox.runtime.runtime import Runtime
from hostres import host_resources

# The tests that make a sandbox run on both isolation tiers (tests/conftest.py); the
# others check arguments and errors before any tier is involved.
BOTH_TIERS = pytest.mark.usefixtures("default_tier")


@BOTH_TIERS
def test_create_list_get_destroy(runtime: Runtime, agentbox_home: Path) -> None:
    sb = Sandbox.create(memory="128MiB", disk="64MiB", home=agentbox_home)
    alive = host_resources(agentbox_home, {sb.id})
    assert alive["cgroups"] and alive["mounts"] and alive["loops"], "nothing to check against"
    assert sb.id in [r.id for r in Sandbox.list(home=agentbox_home)]
    assert sb.info().state == "running"
    assert sb.info().spec.memory == 128 * 1024**2
    sb.kill()
    assert sb.id not in [r.id for r in Sandbox.list(home=agentbox_home)]
    with pytest.raises(SandboxNotFound):
        sb.commands.run("true")
    left = host_resources(agentbox_home, {sb.id})
    assert left["cgroups"] == []
    assert [m for m in left["mounts"] if sb.id in m] == []
    assert [d for d in left["dirs"] if sb.id in d] == []
    assert [lo for lo in left["loops"] if sb.id in lo] == []
    assert _processes_naming(sb.id) == []  # gvisor: its Sentry and Gofer are gone too


@BOTH_TIERS
def test_sandbox_outlives_the_process_that_created_it(agentbox_home: Path) -> None:
    script = (
        "from agentbox import Sandbox; from pathlib import Path; import sys;"
        f"sb = Sandbox.create(memory='128MiB', disk='64MiB', home=Path({str(agentbox_home)!r}));"
        "sb.files.write('/workspace/note', 'kept'); print(sb.id)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    sandbox_id = out.stdout.strip()
    sb = Sandbox.connect(sandbox_id, home=agentbox_home)
    try:
        assert sb.files.read("/workspace/note") == "kept"
        assert sb.commands.run("echo alive").stdout == "alive\n"
    finally:
        sb.kill()


@BOTH_TIERS
def test_destroy_kills_daemonised_processes(agentbox_home: Path, default_tier: str) -> None:
    sb = Sandbox.create(memory="128MiB", disk="64MiB", home=agentbox_home)
    sb.commands.run("setsid nohup sleep 1000 >/dev/null 2>&1 & (setsid sleep 1001 &) ; true")
    if default_tier == "gvisor":
        # Its processes live in the Sentry, no host process each: the host holds the
        # Sentry, the Gofer and their ptrace stubs, which must all go.
        assert _processes_naming(sb.id), "the sandbox's runsc processes should be running"
        sb.kill()
        assert _processes_naming(sb.id) == []
        return
    host_pids = [p for p in os.listdir("/proc") if p.isdigit()]
    survivors = [p for p in host_pids if _cmdline(p) in ("sleep 1000", "sleep 1001")]
    assert len(survivors) == 2, "the daemons should be running before destroy"
    sb.kill()
    still = [
        p
        for p in os.listdir("/proc")
        if p.isdigit() and _cmdline(p) in ("sleep 1000", "sleep 1001")
    ]
    assert still == []


def _processes_naming(sandbox_id: str) -> list[str]:
    """Host processes whose command line names the sandbox (runsc's name it)."""
    return [p for p in os.listdir("/proc") if p.isdigit() and sandbox_id in _cmdline(p)]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


@BOTH_TIERS
def test_lifetime_ends_the_sandbox_without_a_daemon(agentbox_home: Path) -> None:
    sb = Sandbox.create(memory="128MiB", disk="64MiB", timeout=1, home=agentbox_home)
    record = sb.info()
    assert record.init_pid is not None
    deadline = time.monotonic() + 30
    while Path(f"/proc/{record.init_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the init's own lifetime timer ends it; we only observe
    assert not Path(f"/proc/{record.init_pid}").exists(), "init outlived its lifetime"
    # The next listing sweeps what is left on the host.
    assert sb.id not in [r.id for r in Sandbox.list(home=agentbox_home)]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"memory": "lots"}, "memory"),
        ({"memory": "1KiB"}, "memory"),
        ({"disk": "-5GiB"}, "disk"),
        ({"cpus": 0}, "cpus"),
        ({"pids": 1}, "pids"),
        ({"timeout": "forever"}, "lifetime"),
    ],
)
def test_invalid_settings_are_clear_errors(
    agentbox_home: Path, kwargs: dict[str, object], needle: str
) -> None:
    before = host_resources(agentbox_home, set())
    with pytest.raises(InvalidRequest) as err:
        Sandbox.create(home=agentbox_home, **kwargs)  # type: ignore[arg-type]
    assert needle in err.value.message
    assert host_resources(agentbox_home, set()) == before


def test_unknown_template(agentbox_home: Path) -> None:
    with pytest.raises(TemplateNotFound) as err:
        Sandbox.create("no-such-template", home=agentbox_home)
    assert "no-such-template" in err.value.message


def test_errors_round_trip_as_dicts() -> None:
    from agentbox.errors import AgentboxError

    err = TemplateNotFound("x", name="t")
    again = AgentboxError.from_dict(json.loads(json.dumps(err.to_dict())))
    assert type(again) is TemplateNotFound and again.details == {"name": "t"}


def test_home_under_a_private_directory_is_refused_with_the_fix(tmp_path: Path) -> None:
    from agentbox.errors import HostUnsupported

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(HostUnsupported) as err:
        Runtime(private / "home")
    assert "chmod o+x" in err.value.message and str(private) in err.value.message


@BOTH_TIERS
def test_a_runtime_notices_a_sandbox_ended_elsewhere(agentbox_home: Path) -> None:
    """A long-lived Runtime (the gateway's) caches running sandboxes; ending one from
    another process, or its init dying, must be seen on the next call."""
    gateway_view, other_process = Runtime(agentbox_home), Runtime(agentbox_home)
    first = gateway_view.create({"memory": "128MiB", "disk": "64MiB"})
    second = gateway_view.create({"memory": "128MiB", "disk": "64MiB"})
    try:
        for record in (first, second):
            gateway_view.files(record.id).write("/workspace/f", b"x")  # now cached
        other_process.destroy(first.id)
        with pytest.raises(SandboxNotFound):
            gateway_view.files(first.id).read("/workspace/f")
        assert second.init_pid is not None
        os.kill(second.init_pid, 9)
        for _ in range(200):  # the kernel reaps it asynchronously
            if not Path(f"/proc/{second.init_pid}").exists():
                break
            time.sleep(0.01)
        with pytest.raises(SandboxNotRunning):
            gateway_view.files(second.id).read("/workspace/f")
    finally:
        for record in (first, second):
            with contextlib.suppress(SandboxNotFound):
                other_process.destroy(record.id)
