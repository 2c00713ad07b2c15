"""The SDK's two backends keep one contract: every call runs against the in-process runtime
AND a real gateway (RemoteRuntime over REST), and the results are compared (the SWE-ReX
pattern). An argument the remote backend dropped (env, stdin, max_output_bytes, perms,
make_parents, parents, exist_ok) or changed (an argv sent as a shell string) shows here
as a difference; an argument it cannot carry would be refused, never ignored. Both take
the same request objects (``agentbox.runtime.requests``), which the SDK's methods build.

Each scenario also asserts what the right answer is, so that both backends cannot agree
on a wrong one.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox.client.interfaces import Backend
from agentbox.client.remote import GatewayClient, RemoteRuntime
from agentbox.client.sandbox import Sandbox
from agentbox.errors import AgentboxError
from agentbox.runtime.files import FileInfo
from agentbox.runtime.output import CommandResult
from agentbox.runtime.processes import ProcessInfo
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, running_gateway

SPEC = {"memory": "256MiB", "disk": "128MiB", "pids": 256, "network": "none"}
Scenario = Callable[[Sandbox], list[Any]]


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None
) -> Iterator[RunningGateway]:
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("contract")) as running:
        yield running


@pytest.fixture(scope="module")
def backends(gw: RunningGateway, runtime: Runtime) -> Iterator[dict[str, Backend]]:
    client = GatewayClient(gw.url, gw.operator_token)
    try:
        yield {"local": runtime, "remote": RemoteRuntime(client)}
    finally:
        client.close()


def both(
    backends: dict[str, Backend], scenario: Scenario, tier: str = "namespaces"
) -> dict[str, list[Any]]:
    """``scenario``'s outcomes on a fresh sandbox of each backend, on isolation ``tier``."""
    outcomes = {}
    for name, backend in backends.items():
        sb = Sandbox(backend.create({**SPEC, "isolation": tier}), backend)
        try:
            outcomes[name] = scenario(sb)
        finally:
            sb.kill()
    return outcomes


def agree(backends: dict[str, Backend], scenario: Scenario, tier: str = "namespaces") -> list[Any]:
    outcomes = both(backends, scenario, tier)
    assert outcomes["local"] == outcomes["remote"]
    return outcomes["local"]


# The contracts marked so hold on both isolation tiers, through both backends.
BOTH_TIERS = pytest.mark.parametrize("tier", ["namespaces", "gvisor"])


def outcome(call: Callable[[], Any]) -> Any:
    """What a call gave, comparable across backends: a normalised result, or the error's
    class and code (the remote backend re-raises the same class)."""
    try:
        return normal(call())
    except AgentboxError as e:
        return ("error", type(e).__name__, e.code)


def normal(value: Any) -> Any:
    if isinstance(value, CommandResult):
        return {
            "stdout": _without_marker(value.stdout),
            "stderr": value.stderr,
            "exit_code": value.exit_code,
            "timed_out": value.timed_out,
            "truncated": value.truncated,
            "stdout_total": value.stdout_total,
            "stderr_total": value.stderr_total,
        }
    if isinstance(value, FileInfo):  # mtime is the moment it ran
        return (value.path, value.name, value.type, value.size, value.mode, value.symlink_target)
    if isinstance(value, ProcessInfo):  # ids and start times are each run's own
        return (value.argv, value.running, value.exit_code)
    if isinstance(value, list):
        return [normal(v) for v in value]
    if hasattr(value, "data") and hasattr(value, "next_offset"):  # ProcessOutput
        return (value.data, value.next_offset)
    return value


def _without_marker(text: str) -> str:
    """The cut marker names where a gateway saved the whole stream (the in-process call
    saves nothing): compare what was kept around it."""
    return "\n".join(
        "[cut]" if line.startswith("[agentbox: ") else line for line in text.split("\n")
    )


# commands -----------------------------------------------------------------------------------
@BOTH_TIERS
def test_run_carries_every_argument(backends: dict[str, Backend], tier: str) -> None:
    def scenario(sb: Sandbox) -> list[Any]:
        run = sb.commands.run
        return [
            outcome(lambda: run("echo $GREETING from $(pwd)", env={"GREETING": "hi"}, cwd="/tmp")),
            outcome(lambda: run(["printf", "%s|", "a b", "$HOME", "*", ";", "'"])),
            outcome(lambda: run(["sh", "-c", 'echo "$0:$1"', "zero", "one"])),
            outcome(lambda: run("cat; echo; cat /dev/null", stdin="from stdin")),
            outcome(lambda: run(["cat"], stdin=b"bytes in")),
            outcome(lambda: run("seq 1 20000", max_output_bytes=1000)),
            outcome(lambda: run("echo out; echo err >&2; exit 7")),
            outcome(lambda: run("sleep 5", timeout=0.5)),
            outcome(lambda: run("echo hidden", max_output_bytes=0)),  # a streaming caller's
        ]

    results = agree(backends, scenario, tier)
    (env, argv, dollar0, stdin, stdin_bytes, capped, exits, timed, nothing) = results
    assert env["stdout"] == "hi from /tmp\n"
    assert argv["stdout"] == "a b|$HOME|*|;|'|"  # an argv, not a shell line
    assert dollar0["stdout"] == "zero:one\n"
    assert stdin["stdout"] == "from stdin\n" and stdin_bytes["stdout"] == "bytes in"
    assert capped["truncated"] and capped["stdout_total"] == len(
        "".join(f"{i}\n" for i in range(1, 20001))
    )
    kept = capped["stdout"].split("\n")
    assert kept[0] == "1" and "[cut]" in kept and kept[-2] == "20000"
    assert len(capped["stdout"]) < 2 * 1000 + 100  # head and tail of 1000 bytes at most
    assert (exits["stdout"], exits["stderr"], exits["exit_code"]) == ("out\n", "err\n", 7)
    assert timed["timed_out"]
    assert nothing["truncated"] and "hidden" not in nothing["stdout"]
    assert nothing["stdout_total"] == len("hidden\n")


@BOTH_TIERS
def test_an_argv_is_never_run_through_a_shell(backends: dict[str, Backend], tier: str) -> None:
    """The process table shows what ran: the argv itself, in both backends."""

    def scenario(sb: Sandbox) -> list[Any]:
        handle = sb.commands.start(["sleep", "30"])
        try:
            return [outcome(handle.info), outcome(sb.commands.list)]
        finally:
            handle.kill()

    info, listed = agree(backends, scenario, tier)
    assert info == (["sleep", "30"], True, None)
    assert listed == [(["sleep", "30"], True, None)]


@BOTH_TIERS
def test_run_on_a_terminal(backends: dict[str, Backend], tier: str) -> None:
    """``pty=True`` reaches the command through a gateway too (it was refused there, and
    the home's gateway now serves plain scripts): a terminal on both ends, stderr in
    stdout, the exit code kept."""
    script = "[ -t 0 ] && echo in-tty; [ -t 1 ] && echo out-tty; echo err >&2; exit 3"

    def scenario(sb: Sandbox) -> list[Any]:
        return [outcome(lambda: sb.commands.run(script, pty=True, timeout=30)),
                outcome(lambda: sb.commands.run(script, timeout=30))]  # fmt: skip

    on_terminal, on_pipes = agree(backends, scenario, tier)
    lines = on_terminal["stdout"].replace("\r\n", "\n").split("\n")
    assert lines[:3] == ["in-tty", "out-tty", "err"]
    assert (on_terminal["stderr"], on_terminal["exit_code"]) == ("", 3)
    assert (on_pipes["stdout"], on_pipes["stderr"]) == ("", "err\n")  # the control


# processes ----------------------------------------------------------------------------------
@BOTH_TIERS
def test_background_processes(backends: dict[str, Backend], tier: str) -> None:
    def scenario(sb: Sandbox) -> list[Any]:
        handle = sb.commands.start(
            ["sh", "-c", 'read x; echo "got:$x:$GREETING:$(pwd)"'],
            env={"GREETING": "hi"}, cwd="/tmp", stdin=True,
        )  # fmt: skip
        written = handle.send_stdin("ok\n")
        ended = handle.wait(timeout=30)
        out = handle.read()
        later = handle.read(offset=out.next_offset)
        quiet = sb.commands.start("echo quiet")
        return [
            written,
            normal(ended),
            normal(out),
            normal(later),
            outcome(lambda: handle.signal("SIGTERM")),  # already ended: not delivered
            normal(quiet.wait(timeout=30)),
            outcome(lambda: sb.commands.connect("p-000000000000")),
            outcome(lambda: quiet.send_stdin("x")),  # started without stdin
        ]

    results = agree(backends, scenario, tier)
    assert results[0] == 3
    assert results[1] == (["sh", "-c", 'read x; echo "got:$x:$GREETING:$(pwd)"'], False, 0)
    assert results[2] == (b"got:ok:hi:/tmp\n", len("got:ok:hi:/tmp\n"))
    assert results[3] == (b"", len("got:ok:hi:/tmp\n")) and results[4] is False
    assert results[5][1:] == (False, 0)
    assert results[6] == ("error", "ProcessNotFound", "process_not_found")
    assert results[7] == ("error", "InvalidRequest", "invalid_request")


# sessions -----------------------------------------------------------------------------------
@BOTH_TIERS
def test_shell_sessions(backends: dict[str, Backend], tier: str) -> None:
    def scenario(sb: Sandbox) -> list[Any]:
        shell = sb.shell(cwd="/tmp", env={"SESSION_VAR": "kept"})
        out = [
            outcome(lambda: shell.run("echo $SESSION_VAR; pwd; cd /workspace; export B=2")),
            outcome(lambda: shell.run("echo $B $(pwd)")),
            outcome(lambda: shell.run("cat", stdin="to the session")),
            outcome(lambda: shell.run("seq 1 5000", max_output_bytes=500)),
        ]
        shell.close()
        out.append(outcome(lambda: shell.run("true")))
        return out

    first, second, stdin, capped, closed = agree(backends, scenario, tier)
    assert first["stdout"] == "kept\n/tmp\n" and second["stdout"] == "2 /workspace\n"
    assert stdin["stdout"] == "to the session"
    assert capped["truncated"] and capped["stdout"].startswith("1\n2\n")
    assert closed == ("error", "SessionNotFound", "session_not_found")


# files --------------------------------------------------------------------------------------
@BOTH_TIERS
def test_files(backends: dict[str, Backend], tier: str) -> None:
    def scenario(sb: Sandbox) -> list[Any]:
        f = sb.files
        w = "/workspace"
        return [
            outcome(lambda: f.write(f"{w}/a/b/new.txt", "alpha beta", perms=0o600)),
            outcome(lambda: f.write(f"{w}/a/b/new.txt", "more", mode="append", perms=0o777)),
            outcome(lambda: f.write(f"{w}/a/b/new.txt", "x", mode="create")),
            outcome(lambda: f.write(f"{w}/missing/file.txt", "x", make_parents=False)),
            outcome(lambda: f.exists(f"{w}/missing")),
            outcome(lambda: f.write(f"{w}/bin.dat", bytes(range(256)))),
            outcome(lambda: f.read_bytes(f"{w}/bin.dat", offset=250)),
            outcome(lambda: f.read(f"{w}/a/b/new.txt", offset=6, length=4)),
            outcome(lambda: f.edit(f"{w}/a/b/new.txt", "beta", "gamma")),
            outcome(lambda: f.edit(f"{w}/a/b/new.txt", "nothing", "x")),
            outcome(lambda: f.mkdir(f"{w}/x/y", parents=False)),
            outcome(lambda: f.mkdir(f"{w}/x/y")),
            outcome(lambda: f.mkdir(f"{w}/x/y", exist_ok=False)),
            outcome(lambda: f.mkdir(f"{w}/x/y", exist_ok=True)),
            outcome(lambda: f.move(f"{w}/bin.dat", f"{w}/x/bin.dat")),
            outcome(lambda: f.move(f"{w}/x/bin.dat", f"{w}/a/b/new.txt")),
            outcome(lambda: f.list(w, depth=3)),
            outcome(lambda: f.stat(f"{w}/nope")),
            outcome(lambda: f.remove(f"{w}/x")),
            outcome(lambda: f.remove(f"{w}/x", recursive=True)),
            outcome(lambda: sorted(e.name for e in f.list(w))),
            outcome(lambda: _tar_round_trip(sb)),
        ]

    r = agree(backends, scenario, tier)
    assert r[0][4] & 0o777 == 0o600  # perms carried
    assert r[1][3] == len("alpha betamore") and r[1][4] & 0o777 == 0o600  # kept its mode
    assert r[2] == ("error", "FileExists", "file_exists")
    assert r[3][0] == "error" and r[4] is False  # make_parents=False made nothing
    assert r[6] == bytes(range(250, 256)) and r[7] == "beta"
    assert r[8] == 1 and r[9] == ("error", "EditMismatch", "edit_mismatch")
    assert r[10][0] == "error" and r[11][2] == "dir"  # parents=False refused
    assert r[12] == ("error", "FileExists", "file_exists") and r[13][2] == "dir"
    assert r[17] == ("error", "FileNotFound", "file_not_found")
    assert r[18][0] == "error" and r[19] is None
    assert r[20] == ["a"] and r[21] == (3, "a/b/new.txt")


def _tar_round_trip(sb: Sandbox) -> tuple[int, str]:
    archive = io.BytesIO()
    entries = sb.files.download_tar("/workspace/a", archive)
    archive.seek(0)
    sb.files.upload_tar("/workspace/copy", archive)
    copied = sb.files.list("/workspace/copy", depth=3)
    return entries, next(e.path for e in copied if e.type == "file").removeprefix(
        "/workspace/copy/"
    )


# volumes ------------------------------------------------------------------------------------
def test_volumes(backends: dict[str, Backend]) -> None:
    """Named volumes through both backends (they share one home: run one after the other)."""

    def scenario(backend: Backend) -> list[Any]:
        volumes = backends_volumes = backend.volumes
        made = volumes.create("contract-cache", "32MiB")
        steps: list[Any] = [(made["name"], made["size"], made["mounts"])]
        steps.append(outcome(lambda: volumes.create("contract-cache", "32MiB")))
        steps.append(outcome(lambda: volumes.create("Bad Name", "32MiB")))
        mounts = [{"name": "contract-cache", "path": "/home/user/cache", "mode": "rw"}]
        sb = Sandbox(backend.create({**SPEC, "volumes": mounts}), backend)
        try:
            steps.append(outcome(lambda: sb.commands.run("echo hi > /home/user/cache/f")))
            steps.append(outcome(lambda: backend.create({**SPEC, "volumes": mounts})))
            steps.append(outcome(lambda: backends_volumes.remove("contract-cache")))
            held = volumes.get("contract-cache")
            steps.append([(m["path"], m["mode"], m["sandbox"] == sb.id) for m in held["mounts"]])
            steps.append(held["used_bytes"] > 0 and held["free_bytes"] > 0)
        finally:
            sb.kill()
        steps.append([v["name"] for v in volumes.list()])
        volumes.remove("contract-cache")
        steps.append(outcome(lambda: volumes.get("contract-cache")))
        return steps

    outcomes = {name: scenario(backend) for name, backend in backends.items()}
    assert outcomes["local"] == outcomes["remote"]
    local = outcomes["local"]
    assert local[0] == ("contract-cache", 32 * 1024**2, [])
    assert local[1] == ("error", "VolumeExists", "volume_exists")
    assert local[2][2] == "invalid_request"
    assert local[4] == ("error", "VolumeInUse", "volume_in_use")
    assert local[5] == ("error", "VolumeInUse", "volume_in_use")
    assert local[6] == [("/home/user/cache", "rw", True)]
    assert local[8] == ["contract-cache"]
    assert local[9] == ("error", "VolumeNotFound", "volume_not_found")
