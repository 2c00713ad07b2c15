"""Terminals (``sandbox.pty``) and ``close_stdin`` with the unmodified E2B Python SDK.

The same three variables as tests/integration/test_e2b_sdk.py; every call is a tool call
of the gateway (process_start with a pty, process_write, process_resize), audited with
the API key's principal.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox, SandboxException
from e2b.sandbox.commands.command_handle import PtySize

from agentbox import Sandbox as AgentboxSandbox
from agentbox.errors import InvalidRequest
from gateway_harness import RunningGateway, running_gateway

# Every test on both isolation tiers (tests/conftest.py, default_tier).
pytestmark = pytest.mark.usefixtures("default_tier")

KEY = "kp-" + secrets.token_hex(16)
E2B_YAML = """
e2b:
  api_keys:
    - {name: team-pty, project: alpha, key_env: E2B_TEST_KEY_PTY}
"""
# Typed into the terminal's shell: a program that reports SIGWINCH and the size it then
# sees. $((1+1)) makes the markers differ from the typed text the terminal echoes.
WINCH_PROGRAM = (
    b'bash -c \'trap "echo WIN$((1+1))CH; stty size; exit 0" WINCH; '
    b"echo ar$((1+1))med; while :; do sleep 0.05; done'\n"
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(
        agentbox_home, tmp_path_factory.mktemp("e2bpty"), "20s",
        env={"E2B_TEST_KEY_PTY": KEY}, extra_yaml=E2B_YAML, terminals=True,
    ) as running:  # fmt: skip
        yield running


@pytest.fixture
def e2b_env(gw: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", f"{gw.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{gw.url}/e2b")
    monkeypatch.setenv("E2B_API_KEY", KEY)


def test_sync_pty_input_resize_and_sigwinch(
    e2b_env: None, gw: RunningGateway, default_tier: str
) -> None:
    sb = Sandbox.create(timeout=600)
    try:
        # The terminal's stream is bounded by its timeout (the SDK's 60 s by default): on
        # a loaded host, the four steps below must not be what ends it.
        term = sb.pty.create(
            PtySize(cols=80, rows=24), envs={"ABC": "123"}, cwd="/tmp", timeout=300
        )
        sb.pty.send_stdin(term.pid, b"echo $ABC-$PWD; tty; stty size\n")
        seen, stage = "", 0
        try:
            for _, _, pty in term:  # the events as they come; each step waits for its output
                seen += (pty or b"").decode("utf-8", "replace")
                if stage == 0 and "24 80" in seen:
                    sb.pty.send_stdin(term.pid, WINCH_PROGRAM)
                    stage = 1
                elif stage == 1 and "ar2med" in seen:
                    sb.pty.resize(term.pid, PtySize(cols=100, rows=30))
                    stage = 2
                elif stage == 2 and "30 100" in seen:
                    sb.pty.send_stdin(term.pid, b"exit 0\n")
                    stage = 3
        except Exception as error:  # which step's output never came
            raise AssertionError(f"stuck at step {stage}; the terminal showed {seen!r}") from error
        assert term.wait().exit_code == 0
        assert stage == 3, seen
        assert "123-/tmp" in seen
        # gvisor's terminal has no /dev/pts name inside (docs/design.md, feature table)
        assert ("not a tty" if default_tier == "gvisor" else "/dev/pts/") in seen
        assert seen.index("WIN2CH") < seen.index("30 100")
    finally:
        sb.kill()
    mine = [r for r in _audit(gw) if r.get("sandbox") == sb.sandbox_id]
    calls = [(r["tool"], r["decision"]) for r in mine if r.get("tool")]
    for tool in ("process_start", "process_write", "process_resize"):
        assert (tool, "allowed") in calls, tool
    assert calls.count(("process_write", "allowed")) == 3  # every input is a call
    assert {r["actor"] for r in mine} == {"token:e2b-key:team-pty"}


def test_async_pty_and_reconnect(e2b_env: None) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(timeout=120)
        try:
            out: list[bytes] = []
            got = asyncio.Event()

            def on_data(data: bytes) -> None:
                out.append(data)
                if b"bar" in b"".join(out).replace(b"$FOO", b""):
                    got.set()

            term = await sb.pty.create(PtySize(80, 24), on_data=on_data, envs={"FOO": "bar"})
            await sb.pty.send_stdin(term.pid, b"echo $FOO\n")
            await asyncio.wait_for(got.wait(), 30)
            await term.disconnect()
            again: list[bytes] = []
            handle = await sb.pty.connect(term.pid, on_data=again.append)
            await sb.pty.resize(term.pid, PtySize(cols=123, rows=45))
            await sb.pty.send_stdin(term.pid, b"stty size; exit 3\n")
            with pytest.raises(CommandExitException) as ended:
                await handle.wait()
            assert ended.value.exit_code == 3
            assert "45 123" in b"".join(again).decode()
            assert term.pid not in [p.pid for p in await sb.commands.list()]
        finally:
            await sb.kill()

    asyncio.run(main())


def test_pty_kill(e2b_env: None) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        # A kill returns once the terminal has ended, so a second one finds nothing (on
        # gVisor the end was recorded a moment later: 1 in 5 said True twice). Ten rounds.
        for _ in range(10):
            term = sb.pty.create(PtySize(80, 24))
            assert sb.pty.kill(term.pid)
            assert not sb.pty.kill(term.pid)  # gone
        with pytest.raises(SandboxException):
            term.wait()
    finally:
        sb.kill()


def test_close_stdin_sends_eof_sync_and_async(e2b_env: None) -> None:
    sb = Sandbox.create(timeout=120)
    try:
        cmd = sb.commands.run("cat", background=True, stdin=True)
        cmd.send_stdin("Hello, ")
        sb.commands.send_stdin(cmd.pid, "World!")
        cmd.close_stdin()
        result = cmd.wait()
        assert (result.exit_code, result.stdout) == (0, "Hello, World!")
        streamed = sb.commands.run("cat; echo end", background=True, stdin=True)
        sb.commands.stream_input(streamed.pid, ["a", "b", "c\n"])
        sb.commands.close_stdin(streamed.pid)
        assert streamed.wait().stdout == "abc\nend\n"
    finally:
        sb.kill()

    async def main() -> None:
        asb = await AsyncSandbox.create(timeout=120)
        try:
            cmd = await asb.commands.run("wc -c", background=True, stdin=True)
            await asb.commands.send_stdin(cmd.pid, "12345")
            await asb.commands.close_stdin(cmd.pid)
            assert (await cmd.wait()).stdout.strip() == "5"
        finally:
            await asb.kill()

    asyncio.run(main())


def test_terminals_are_off_unless_the_operator_turns_them_on(
    tmp_path: Path, agentbox_home: Path, host_ready: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is typed into a terminal is code the command policy cannot see: a gateway
    refuses terminals by default, and with them on still judges the program started."""
    with running_gateway(agentbox_home, tmp_path, env={"E2B_TEST_KEY_PTY": KEY},
                         extra_yaml=E2B_YAML) as off:  # fmt: skip
        monkeypatch.setenv("E2B_API_URL", f"{off.url}/e2b")
        monkeypatch.setenv("E2B_SANDBOX_URL", f"{off.url}/e2b")
        monkeypatch.setenv("E2B_API_KEY", KEY)
        sb = Sandbox.create(timeout=60)
        try:
            with pytest.raises(SandboxException, match="policy_denied: interactive terminals"):
                sb.pty.create(PtySize(80, 24))
            assert sb.commands.run("echo still-fine").stdout == "still-fine\n"
        finally:
            sb.kill()
    denied = [r for r in _audit(off) if r.get("sandbox") == sb.sandbox_id]
    assert ("process_start", "denied") in [(r["tool"], r["decision"]) for r in denied]


def test_a_terminal_program_is_still_judged(gw: RunningGateway) -> None:
    """terminals: true lifts only the stdin rule: the program on the terminal must pass
    the allow and deny lists like any command (the REST route, an operator token)."""
    with gw.operator() as http:
        sb = http.post("/v1/sandboxes", json={}).json()["id"]
        try:
            for command, rule in (("curl -i", "deny: curl"), ("perl -de0", "terminal.run.allow")):
                r = http.post(f"/v1/sandboxes/{sb}/processes",
                              json={"command": command, "pty": {"cols": 80, "rows": 24}})  # fmt: skip
                assert r.status_code == 403 and rule in r.text, r.text
            r = http.post(f"/v1/sandboxes/{sb}/processes",
                          json={"command": "bash -i", "pty": {"cols": 80, "rows": 24}})  # fmt: skip
            assert r.status_code == 201, r.text
            pid = r.json()["process_id"]
            r = http.post(f"/v1/sandboxes/{sb}/processes/{pid}/resize",
                          json={"cols": 0, "rows": 24})  # fmt: skip
            assert r.status_code == 400, r.text
            r = http.post(f"/v1/sandboxes/{sb}/processes/{pid}/stdin",
                          json={"data": "exit 7\n"})  # fmt: skip
            assert r.status_code == 200 and r.json()["written"] == 7
        finally:
            http.delete(f"/v1/sandboxes/{sb}")


def test_agentbox_sdk_over_the_gateway_closes_stdin_and_resizes(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """agentbox's own SDK, remote backend: the same calls as in-process (REST routes)."""
    monkeypatch.setenv("AGENTBOX_URL", gw.url)
    monkeypatch.setenv("AGENTBOX_TOKEN", gw.operator_token)
    with AgentboxSandbox.create(memory="128MiB", disk="64MiB") as sb:
        cat = sb.commands.start("cat", stdin=True)
        cat.send_stdin("remote")
        cat.close_stdin()
        assert cat.wait(timeout=30).exit_code == 0 and cat.read().text == "remote"
        size = "import os, sys; sys.stdin.readline(); print(*os.get_terminal_size())"
        term = sb.commands.start(f"python3 -c '{size}'", pty=(80, 24))
        term.resize(101, 33)
        term.send_stdin("\n")
        assert term.wait(timeout=30).exit_code == 0
        assert "101 33" in term.read().text
        with pytest.raises(InvalidRequest, match="no terminal"):
            cat.resize(80, 24)


def _audit(gw: RunningGateway) -> list[dict[str, object]]:
    return [json.loads(line) for line in gw.audit_path.read_text().splitlines()]
