"""The CLI's light exec path (``runtime.quick_exec``) against real sandboxes: it must
start exactly what the runtime starts, and leave every other case to the runtime."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.errors import AgentboxError
from agentbox.runtime import quick_exec
from agentbox.runtime.commands import launch_failure
from agentbox.runtime.runtime import Runtime

# One tier: the light path is the namespaces tier's own (it starts the launcher
# directly); a gvisor sandbox is left to the runtime, which the last test checks.

ARGV = ["sh", "-c", "echo out; echo err >&2; exit 3"]


@pytest.mark.parametrize(
    "settings",
    [{}, {"network": "none", "env": {"GREETING": "hi there", "EMPTY": ""}}],
    ids=["default-network", "no-network-with-env"],
)
def test_it_builds_the_runtimes_launcher_argv_and_environment(
    runtime: Runtime, agentbox_home: Path, settings: dict[str, object]
) -> None:
    with Sandbox.create(memory="128MiB", disk="64MiB", home=agentbox_home, **settings) as sb:  # type: ignore[arg-type]
        prepared = quick_exec.prepare(sb.id, ARGV, "cquick")
        assert prepared is not None
        runner = Runtime(agentbox_home).commands(sb.id)
        assert prepared.argv == runner.launcher_argv(ARGV, "cquick", None)
        assert prepared.env == runner.environment(None)
        assert prepared.leaf_dir == runner.cgroup.leaf_dir("cquick")


def test_it_runs_the_command_and_removes_its_leaf(sandbox: Sandbox) -> None:
    prepared = quick_exec.prepare(sandbox.id, ARGV, "cquick2")
    assert prepared is not None
    seen: list[tuple[int, bytes]] = []
    status, err_head = quick_exec.run(prepared, None, lambda fd, chunk: seen.append((fd, chunk)))
    assert status == 3 and err_head == b"err\n"
    assert b"".join(c for fd, c in seen if fd == 1) == b"out\n"
    assert not os.path.exists(prepared.leaf_dir)
    # stdin is fed; a background child holding the pipes does not keep the call waiting
    prepared = quick_exec.prepare(sandbox.id, ["sh", "-c", "sleep 600 & wc -c"], "cquick3")
    assert prepared is not None
    out: list[bytes] = []
    status, _ = quick_exec.run(prepared, b"12345", lambda fd, chunk: out.append(chunk))
    assert (status, b"".join(out).strip()) == (0, b"5")


def test_every_other_case_goes_to_the_runtime(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert quick_exec.prepare("sb-000000000000", ["true"], "cx") is None  # unknown id
    assert quick_exec.prepare(sandbox.id, [], "cx") is None
    sandbox.pause()  # the runtime resumes a paused sandbox; this path cannot
    assert quick_exec.prepare(sandbox.id, ["true"], "cx") is None
    sandbox.resume()
    assert quick_exec.prepare(sandbox.id, ["true"], "cx") is not None
    monkeypatch.setenv("AGENTBOX_URL", "http://127.0.0.1:9")  # a gateway: the remote client
    assert quick_exec.prepare(sandbox.id, ["true"], "cx") is None
    monkeypatch.delenv("AGENTBOX_URL")
    sandbox.stop()  # processes gone, record kept: the runtime says what to do
    assert quick_exec.prepare(sandbox.id, ["true"], "cx") is None


def test_a_launch_failure_reads_as_on_the_full_path(sandbox: Sandbox) -> None:
    """The launcher's own refusal (exit 125, its message on stderr) is the same typed error
    whichever path ran it."""
    missing_cwd = ["--cwd", "/no/such/dir"]
    prepared = quick_exec.prepare(sandbox.id, ["true"], "cquick4")
    assert prepared is not None
    # The launcher's argv, not the resident launcher (running since the create): a socket
    # nothing listens on sends the command the old way.
    prepared.socket = os.path.join(os.path.dirname(prepared.socket), "nobody.sock")
    i = prepared.argv.index("--cwd")
    prepared.argv[i : i + 2] = missing_cwd
    status, err_head = quick_exec.run(prepared, None, lambda fd, chunk: None)
    failure = launch_failure(status, err_head)
    assert failure is not None and failure.code == "invalid_request"
    assert "/no/such/dir" in failure.message
    with pytest.raises(AgentboxError) as full:
        sandbox.commands.run(["true"], cwd="/no/such/dir")
    assert type(full.value) is type(failure) and full.value.message == failure.message


def test_a_gvisor_sandbox_is_left_to_the_runtime(runtime: Runtime, agentbox_home: Path) -> None:
    with Sandbox.create(memory="128MiB", disk="64MiB", isolation="gvisor",
                        home=agentbox_home) as sb:  # fmt: skip
        assert quick_exec.prepare(sb.id, ARGV, "cquick") is None
