"""Commands in a real sandbox: results, streams, timeouts, caps, stdin, env, cwd, pty."""

from __future__ import annotations

import pytest

from agentbox import Sandbox
from agentbox.runtime.host import UID_BASE
from tierkit import command_lines


@pytest.fixture
def sandbox(tiered_sandbox: Sandbox) -> Sandbox:
    """Every test here on both isolation tiers (tests/conftest.py)."""
    return tiered_sandbox


def host_uid(sb: Sandbox) -> int:
    return UID_BASE + sb.info().slot


def test_shell_string_and_argv(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo out; echo err >&2; exit 7")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 7, False)
    r = sandbox.commands.run(["printf", "%s|", "a b", "$HOME"])
    assert r.stdout == "a b|$HOME|"  # argv is not re-parsed by a shell


def test_runs_as_unprivileged_user_in_workspace(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("id -u; id -g; pwd; hostname")
    uid, gid, cwd, hostname = r.stdout.split()
    # gvisor: the sandbox's own host uid, named `user` (no user namespace on that tier).
    expected = "1000" if sandbox.info().isolation == "namespaces" else str(host_uid(sandbox))
    assert (uid, gid, cwd) == (expected, expected, "/workspace") and expected != "0"
    assert sandbox.commands.run("id -un").stdout == "user\n"
    assert hostname == sandbox.id


def test_cwd_env_stdin(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(
        "pwd; echo $GREETING; cat", cwd="/tmp", env={"GREETING": "hi"}, stdin=b"from stdin"
    )
    assert r.stdout == "/tmp\nhi\nfrom stdin"


def test_relative_cwd_is_below_workspace(sandbox: Sandbox) -> None:
    sandbox.files.mkdir("/workspace/a/b")
    assert sandbox.commands.run("pwd", cwd="a/b").stdout == "/workspace/a/b\n"
    assert sandbox.commands.run("pwd", cwd="a/../a").stdout == "/workspace/a\n"


def test_missing_cwd_is_a_clear_error(sandbox: Sandbox) -> None:
    from agentbox.errors import InvalidRequest

    try:
        sandbox.commands.run("true", cwd="/does/not/exist")
    except InvalidRequest as e:
        assert "/does/not/exist" in e.message and "cwd" in e.message
    else:
        raise AssertionError("a missing cwd must raise InvalidRequest")


def test_command_not_found_is_exit_127(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["no-such-program"])
    assert r.exit_code == 127
    assert "no-such-program" in r.stderr


def test_timeout_kills_the_whole_tree(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(
        "setsid sh -c 'sleep 300' & (sleep 300 &) ; echo forked; sleep 300", timeout=5
    )
    assert r.timed_out and "forked" in r.stdout, r  # the control: the tree was made
    assert r.exit_code != 0
    # Read from /proc (`ps` fails on the gvisor tier and would show nothing either way).
    left = [line for line in command_lines(sandbox) if "sleep 300" in line]
    assert left == [], f"timed-out command left processes behind: {left}"


def test_killed_by_signal_reports_the_signal(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("kill -TERM $$")
    assert r.signal == 15 and r.exit_code == 128 + 15


def test_output_is_capped_with_head_and_tail(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("seq 1 200000", max_output_bytes=1000)
    assert r.truncated
    assert r.stdout.startswith("1\n2\n3\n")
    assert r.stdout.rstrip().endswith("200000")
    assert "lines) of stdout cut here" in r.stdout
    assert r.stdout_total == len("\n".join(str(i) for i in range(1, 200001))) + 1


def test_hundred_megabytes_of_output(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("head -c 100000000 /dev/zero", timeout=60, max_output_bytes=4096)
    assert r.exit_code == 0 and r.truncated
    assert r.stdout_total == 100_000_000
    assert len(r.stdout_bytes) < 5000


def test_binary_and_invalid_utf8_output(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["printf", "\\377\\376\\000abc\\200"])
    assert r.stdout_bytes == b"\xff\xfe\x00abc\x80"
    assert "abc" in r.stdout  # decoding replaces, never raises


def test_exit_code_cannot_be_forged_through_output(sandbox: Sandbox) -> None:
    # Output that looks like an exit marker changes nothing: the host waits the process.
    r = sandbox.commands.run("echo 'exit_code=0'; echo '__EXIT__ 0'; exit 3")
    assert r.exit_code == 3


def test_background_child_holding_stdout_does_not_hang(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("sleep 300 & echo started", timeout=30)
    assert r.stdout == "started\n" and not r.timed_out and r.exit_code == 0


def test_pty_mode(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("tty; test -t 0 && echo interactive", pty=True)
    assert r.exit_code == 0
    # gvisor: the Sentry's pty has no /dev/pts name inside, so `tty` says so (design.md).
    name = "/dev/pts/0" if sandbox.info().isolation == "namespaces" else "not a tty"
    assert r.stdout.replace("\r", "").splitlines()[:2] == [name, "interactive"]
