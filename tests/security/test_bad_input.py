"""Attack 8 — hostile input to the SDK/runtime API.

Covers: every operation on a destroyed sandbox (and on ids that look like paths) raises
SandboxNotFound and touches nothing on the host; NUL bytes in a command string, argv,
environment names/values, cwd, file paths and sandbox env are InvalidRequest, and so are
lone surrogates there and in stdin text (naming the field); an
oversized argv or environment (E2BIG) is an agentbox error that names no host path;
100 MB of output (pipes, stderr, pty) is capped without the caller's memory growing by
more than 50 MB; invalid UTF-8 output round-trips byte-exact in ``stdout_bytes`` /
``stderr_bytes`` and through the file API.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.errors import AgentboxError, InvalidRequest, SandboxNotFound
from agentbox.runtime.runtime import Runtime
from hostres import host_resources

MB = 1_000_000


@pytest.fixture(scope="module")
def destroyed(runtime: Runtime, agentbox_home: Path) -> Sandbox:
    sb = Sandbox.create(memory="64MiB", disk="32MiB", home=agentbox_home)
    sb.kill()
    return sb


OPERATIONS: dict[str, Callable[[Sandbox], Any]] = {
    "run": lambda sb: sb.commands.run("true"),
    "run-argv": lambda sb: sb.commands.run(["true"]),
    "run-pty": lambda sb: sb.commands.run("true", pty=True),
    "start": lambda sb: sb.commands.start("true"),
    "list-processes": lambda sb: sb.commands.list(),
    "read": lambda sb: sb.files.read("/etc/passwd"),
    "write": lambda sb: sb.files.write("/workspace/x", b"x"),
    "list": lambda sb: sb.files.list("/"),
    "stat": lambda sb: sb.files.stat("/"),
    "mkdir": lambda sb: sb.files.mkdir("/workspace/d"),
    "remove": lambda sb: sb.files.remove("/workspace/x"),
    "shell": lambda sb: sb.shell(),
    "kill-again": lambda sb: sb.kill(),
    "connect": lambda sb: Sandbox.connect(sb.id, home=Path(os.environ["AGENTBOX_HOME"])),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_destroyed_sandbox_is_not_found(
    destroyed: Sandbox, agentbox_home: Path, operation: str
) -> None:
    before = host_resources(agentbox_home, {destroyed.id})
    with pytest.raises(SandboxNotFound):
        OPERATIONS[operation](destroyed)
    assert host_resources(agentbox_home, {destroyed.id}) == before
    assert not (agentbox_home / "sandboxes" / destroyed.id).exists()


@pytest.mark.parametrize(
    "sandbox_id",
    ["../../../etc", "..", "/", "sb-../../x", "sb-000000000000/../..", "sb-\0x", "", "%2e%2e"],
)
def test_path_like_sandbox_ids_are_not_found(
    runtime: Runtime, agentbox_home: Path, sandbox_id: str
) -> None:
    before = host_resources(agentbox_home, {sandbox_id})
    with pytest.raises((SandboxNotFound, InvalidRequest)):
        Sandbox.connect(sandbox_id, home=agentbox_home)
    with pytest.raises((SandboxNotFound, InvalidRequest)):
        runtime.destroy(sandbox_id)
    assert host_resources(agentbox_home, {sandbox_id}) == before


NUL_CALLS: dict[str, Callable[[Sandbox], Any]] = {
    "command": lambda sb: sb.commands.run("echo a\0b"),
    "argv": lambda sb: sb.commands.run(["echo", "a\0b"]),
    "argv0": lambda sb: sb.commands.run(["ec\0ho", "a"]),
    "env-value": lambda sb: sb.commands.run("true", env={"A": "x\0y"}),
    "env-name": lambda sb: sb.commands.run("true", env={"A\0B": "x"}),
    "env-name-with-equals": lambda sb: sb.commands.run("true", env={"LD_PRELOAD=/x": "y"}),
    "cwd": lambda sb: sb.commands.run("true", cwd="/tmp\0/etc"),
    "start-command": lambda sb: sb.commands.start("echo a\0b"),
    "start-env": lambda sb: sb.commands.start("true", env={"A": "\0"}),
    "pty": lambda sb: sb.commands.run("echo a\0b", pty=True),
    "file-read": lambda sb: sb.files.read("/etc/passwd\0/x"),
    "file-write": lambda sb: sb.files.write("/workspace/a\0b", b"x"),
    "file-list": lambda sb: sb.files.list("/workspace\0"),
    "file-move": lambda sb: sb.files.move("/workspace/a", "/workspace/\0"),
    "session": lambda sb: sb.shell().run("echo a\0b"),
}


@pytest.mark.parametrize("call", sorted(NUL_CALLS))
def test_nul_bytes_are_invalid_requests(shared_sandbox: Sandbox, call: str) -> None:
    with pytest.raises(InvalidRequest):
        NUL_CALLS[call](shared_sandbox)


# "\ud800" has no bytes even under surrogateescape: subprocess and open() raised a raw
# UnicodeEncodeError. Each must be an InvalidRequest naming what held it.
LONE = "\ud800"
SURROGATE_CALLS: dict[str, tuple[Callable[[Sandbox], Any], str]] = {
    "command": (lambda sb: sb.commands.run(f"echo {LONE}"), "the command"),
    "argv": (lambda sb: sb.commands.run(["echo", LONE]), "argument 1"),
    "env-value": (lambda sb: sb.commands.run("true", env={"A": LONE}), "environment variable A"),
    "env-name": (lambda sb: sb.commands.run("true", env={LONE: "x"}), "an environment variable name"),
    "cwd": (lambda sb: sb.commands.run("true", cwd=f"/tmp/{LONE}"), "cwd"),
    "stdin": (lambda sb: sb.commands.run("cat", stdin=LONE), "stdin"),
    "pty-stdin": (lambda sb: sb.commands.run("cat", stdin=LONE, pty=True), "stdin"),
    "start-env": (lambda sb: sb.commands.start("true", env={"A": LONE}), "environment variable A"),
    "start-stdin": (lambda sb: sb.commands.start("cat", stdin=True).send_stdin(LONE), "data"),
    "session": (lambda sb: sb.shell().run(f"echo {LONE}"), "the command"),
    "file-write": (lambda sb: sb.files.write(f"/workspace/{LONE}", b"x"), "Unicode"),
    "file-read": (lambda sb: sb.files.read(f"/workspace/{LONE}"), "Unicode"),
}  # fmt: skip


@pytest.mark.parametrize("call", sorted(SURROGATE_CALLS))
def test_lone_surrogates_are_invalid_requests(shared_sandbox: Sandbox, call: str) -> None:
    action, named = SURROGATE_CALLS[call]
    with pytest.raises(InvalidRequest, match=named):
        action(shared_sandbox)


def test_surrogate_in_sandbox_env_is_invalid(runtime: Runtime, agentbox_home: Path) -> None:
    before = host_resources(agentbox_home, ())
    with pytest.raises(InvalidRequest, match="environment variable A"):
        Sandbox.create(env={"A": "\ud800"}, home=agentbox_home)
    assert host_resources(agentbox_home, ()) == before


def test_nul_in_sandbox_env_is_invalid(runtime: Runtime, agentbox_home: Path) -> None:
    before = host_resources(agentbox_home, ())  # no id was ever assigned
    with pytest.raises(InvalidRequest):
        Sandbox.create(env={"A": "x\0y"}, home=agentbox_home)
    assert host_resources(agentbox_home, ()) == before


@pytest.mark.parametrize("how", ["argv", "command", "env", "start"])
def test_oversized_arguments_are_agentbox_errors(
    shared_sandbox: Sandbox, agentbox_home: Path, how: str
) -> None:
    big = "x" * (256 * 1024)  # past MAX_ARG_STRLEN (128 KiB) for one string
    call: Callable[[], Any] = {
        "argv": lambda: shared_sandbox.commands.run(["echo", big]),
        "command": lambda: shared_sandbox.commands.run(f"echo {big}"),
        "env": lambda: shared_sandbox.commands.run("true", env={"BIG": big}),
        "start": lambda: shared_sandbox.commands.start(["echo", big]).wait(timeout=30),
    }[how]
    try:
        call()
    except AgentboxError as e:
        assert str(agentbox_home) not in e.message, f"the error names a host path: {e.message}"
    except OSError as e:
        pytest.fail(f"an oversized {how} raised a raw OSError naming host paths: {e}")
    phantoms = [p.id for p in shared_sandbox.commands.list() if p.running and big in p.argv]
    assert not phantoms, f"a process that never started is listed as running: {phantoms}"


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    ("command", "pty"),
    [
        ("head -c 100000000 /dev/zero", False),
        ("head -c 100000000 /dev/zero >&2", False),
        ("head -c 100000000 /dev/zero", True),
    ],
    ids=["stdout", "stderr", "pty"],
)
def test_hundred_megabytes_of_output_is_capped(
    shared_sandbox: Sandbox, command: str, pty: bool
) -> None:
    gc.collect()
    rss_before = _rss_bytes()
    tracemalloc.start()
    try:
        r = shared_sandbox.commands.run(command, timeout=120, pty=pty)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.exit_code == 0 and not r.timed_out, r
    assert r.truncated
    assert r.stdout_total + r.stderr_total >= 100 * MB
    assert len(r.stdout_bytes) + len(r.stderr_bytes) < 2 * (1 << 20) + 200
    assert peak < 50 * MB, f"capturing 100 MB allocated {peak / MB:.0f} MB"
    assert _rss_bytes() - rss_before < 50 * MB


INVALID = b"\xff\xfe\x00abc\x80\xc3\x28\xed\xa0\x80\xf8\x88\x80\x80\x80"


def test_invalid_utf8_output_round_trips(shared_sandbox: Sandbox) -> None:
    printf = "".join(f"\\{b:03o}" for b in INVALID)
    r = shared_sandbox.commands.run(f"printf '{printf}'; printf '{printf}' >&2")
    assert r.stdout_bytes == INVALID
    assert r.stderr_bytes == INVALID
    assert "abc" in r.stdout and "\ufffd" in r.stdout  # decoding replaces, never raises
    r = shared_sandbox.commands.run(["printf", printf], pty=True)
    assert r.stdout_bytes == INVALID


def test_invalid_utf8_through_the_file_api(shared_sandbox: Sandbox) -> None:
    shared_sandbox.files.write("/workspace/bin", INVALID)
    assert shared_sandbox.files.read_bytes("/workspace/bin") == INVALID
    assert "\ufffd" in shared_sandbox.files.read("/workspace/bin")
    with pytest.raises(InvalidRequest):
        shared_sandbox.files.edit("/workspace/bin", "abc", "def")
    assert shared_sandbox.files.read_bytes("/workspace/bin") == INVALID
