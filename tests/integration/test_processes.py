"""Background processes and persistent shell sessions."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.errors import InvalidRequest, ProcessNotFound
from agentbox.runtime.commands import FOREGROUND_LEAF
from agentbox.runtime.runtime import Runtime
from hostres import wait_for
from tierkit import command_lines, sandbox_on

# The tests marked BOTH_TIERS run on both isolation tiers; the others exercise what the
# gvisor tier answers with a typed TierUnsupported (input detection and adoption:
# test_gvisor_tier checks that error); and the exit file's `find /` (22 s on gvisor, whose tree it does not reach either: the
# files are on the disk's host side, never bound into its root).
BOTH_TIERS = pytest.mark.parametrize("sandbox", ["namespaces", "gvisor"], indirect=True)


@pytest.fixture
def sandbox(
    request: pytest.FixtureRequest, runtime: Runtime, agentbox_home: Path
) -> Iterator[Sandbox]:
    with sandbox_on(runtime, agentbox_home, getattr(request, "param", "namespaces")) as sb:
        yield sb


@BOTH_TIERS
def test_background_process_output_offsets_and_exit(sandbox: Sandbox) -> None:
    handle = sandbox.commands.start("for i in 1 2 3; do echo line$i; done; exit 4")
    info = handle.wait(timeout=30)
    assert not info.running and info.exit_code == 4
    first = handle.read("stdout", offset=0, limit=6)
    assert first.text == "line1\n"
    rest = handle.read("stdout", offset=first.next_offset)
    assert rest.text == "line2\nline3\n"


@BOTH_TIERS
def test_background_stdin_and_signal(sandbox: Sandbox) -> None:
    handle = sandbox.commands.start(["/bin/sh", "-c", "read x; echo got:$x; sleep 300"], stdin=True)
    handle.send_stdin("hello\n")
    for _ in range(2000):  # bounded: output arrives within milliseconds
        if handle.read().text:
            break
        handle.wait(timeout=0.01)
    assert handle.read().text == "got:hello\n"
    assert handle.info().running
    handle.signal("SIGTERM")
    info = handle.wait(timeout=30)
    assert not info.running and info.exit_code == 128 + 15


@BOTH_TIERS
def test_kill_takes_the_whole_tree(sandbox: Sandbox) -> None:
    def sleeping() -> list[str]:
        return [line for line in command_lines(sandbox) if line.startswith("sleep 30")]

    handle = sandbox.commands.start("setsid sleep 300 & sleep 301")
    wait_for(lambda: len(sleeping()) == 2, 30, "both sleeps to run (the control)")
    handle.kill()
    assert not handle.wait(timeout=30).running
    assert sleeping() == []


@BOTH_TIERS
def test_list_and_reconnect(sandbox: Sandbox, agentbox_home) -> None:  # type: ignore[no-untyped-def]
    handle = sandbox.commands.start("echo hi")
    handle.wait(timeout=30)
    again = Sandbox.connect(sandbox.id, home=agentbox_home).commands.connect(handle.id)
    assert again.read().text == "hi\n"
    assert handle.id in [p.id for p in sandbox.commands.list()]


def test_exit_file_is_beyond_the_sandbox_reach(sandbox: Sandbox) -> None:
    # The record of how a process ended lives on the host side of the disk, not in the
    # sandbox's view, so the agent cannot rewrite it.
    handle = sandbox.commands.start("exit 5")
    handle.wait(timeout=30)
    # Every file system the sandbox sees (its disk's /workspace, /tmp and /var/tmp too,
    # the disk the record is on) but the kernel's and the host's read-only /usr; a file
    # of that name planted in /tmp is the control that the search finds one.
    control = f"/tmp/ctl-{handle.id}/exit"
    assert sandbox.commands.run(f"mkdir -p {control.rsplit('/', 1)[0]} && touch {control}").ok
    r = sandbox.commands.run(
        r"find / \( -path /proc -o -path /sys -o -path /dev -o -path /usr \) -prune -o "
        f"-name exit -path '*{handle.id}*' -print 2>/dev/null",
        timeout=120,
    )
    assert not r.timed_out and r.stdout.split() == [control], r
    assert handle.info().exit_code == 5


@BOTH_TIERS
def test_shell_session_keeps_cwd_and_env(sandbox: Sandbox) -> None:
    shell = sandbox.shell()
    assert shell.run("mkdir -p /tmp/d && cd /tmp/d && export FOO=bar").exit_code == 0
    r = shell.run("pwd; echo $FOO")
    assert r.stdout == "/tmp/d\nbar\n"
    assert shell.run("exit 9").exit_code == 9
    assert shell.run("syntax error ((").exit_code != 0
    assert shell.run("pwd").stdout == "/tmp/d\n"  # state survived the failures
    other = sandbox.shell()
    assert other.run("pwd; echo ${FOO:-unset}").stdout == "/workspace\nunset\n"


# Commands that wait for input (issue 13 item 6): each prompt kind the template has.
PROMPTS = {
    "read -p": ('read -p "Name? " n; echo "hi $n"', "", "bob\n", "hi bob\n"),
    "read -s": ('read -s -p "Secret: " s; echo "got $s"', "", "pw\n", "got pw\n"),
    "input()": ("python3 -c 'print(\"ok:\" + input(\"Continue? [Y/n] \"))'", "Continue? [Y/n]",
                "y\n", "Continue? [Y/n] ok:y\n"),
    "getpass": ("python3 -c 'import getpass; print(\"pw:\" + getpass.getpass(\"Password: \"))'",
                "Password:", "s3cret\n", "pw:s3cret\n"),
    "editor": ("vi /workspace/edited.txt", "", "ihello\x1b:wq\n", None),
}  # fmt: skip


def test_a_command_waiting_for_input_returns_early_and_runs_on(
    sandbox: Sandbox, runtime: Runtime
) -> None:
    commands, table = runtime.commands(sandbox.id), runtime.processes(sandbox.id)
    for kind, (command, prompt, answer, output) in PROMPTS.items():
        r = commands.run(command, timeout=60, detect_input=True, adopt=table.adopt)
        assert r.waiting_for_input and not r.timed_out, kind
        assert r.prompt is not None and r.prompt.endswith(prompt), (kind, r.prompt)
        assert r.process_id is not None and r.exit_code == -1, kind
        info = table.get(r.process_id)
        assert info.running and info.waiting_for_input, kind  # process_read's view too
        assert table.write_stdin(r.process_id, answer) == len(answer.encode())
        info = table.wait(r.process_id, timeout=30)
        assert not info.running and info.exit_code == 0, (kind, info)
        if output is not None:
            assert table.read_output(r.process_id).text.endswith(output), kind
    assert sandbox.files.read("/workspace/edited.txt") == "hello\n"  # vi saved it
    # No longer a foreground command: the idle watcher and task cancel ignore it.
    assert not runtime.layout.sandbox(sandbox.id).populated_leaves(FOREGROUND_LEAF)


def test_waiting_without_an_adopter_is_killed_and_says_so(sandbox: Sandbox,
                                                          runtime: Runtime) -> None:  # fmt: skip
    r = runtime.commands(sandbox.id).run("echo -n 'Proceed? [Y/n] '; read a", timeout=60,
                                         detect_input=True)  # fmt: skip
    assert r.waiting_for_input and r.prompt == "Proceed? [Y/n]" and r.process_id is None
    assert r.signal == 9 and r.exit_code == 137 and not r.timed_out


@BOTH_TIERS
def test_busy_commands_are_not_waiting_for_input(sandbox: Sandbox, runtime: Runtime) -> None:
    commands = runtime.commands(sandbox.id)
    # Quiet but not reading stdin; reading another pipe; reading stdin that was given.
    for command, stdin in (("sleep 1.5; echo done", None), ("sleep 1.5 | cat; echo done", None),
                           ("read a; sleep 1; echo done $a", "x\n")):  # fmt: skip
        r = commands.run(command, stdin=stdin, timeout=60, detect_input=True)
        assert not r.waiting_for_input and r.exit_code == 0, command
        assert r.stdout.startswith("done"), command


def test_a_background_process_reports_waiting_for_input(sandbox: Sandbox,
                                                        runtime: Runtime) -> None:  # fmt: skip
    table = runtime.processes(sandbox.id)
    info = table.start("echo 'Overwrite? [y/N]'; read a; echo answered $a", stdin=True)
    while not table.get(info.id).waiting_for_input:  # bounded by the wait below
        assert table.wait(info.id, timeout=0.05).running
    assert table.get(info.id).prompt == "Overwrite? [y/N]"
    table.write_stdin(info.id, "y\n")
    assert table.wait(info.id, timeout=30).exit_code == 0
    assert not table.get(info.id).waiting_for_input
    assert table.read_output(info.id).text.endswith("answered y\n")


@BOTH_TIERS
def test_a_signal_right_after_start_reaches_the_command(sandbox: Sandbox,
                                                        runtime: Runtime) -> None:  # fmt: skip
    """start() returns once the command runs: a SIGKILL 0 ms later used to remove the leaf
    under the launcher (exit 125, "agentbox failed"), a SIGTERM found no process at all
    (on gvisor too: it looked for the command under its wrapper, not yet forked)."""
    table = runtime.processes(sandbox.id)
    for sig, code in (("SIGKILL", 137), ("SIGTERM", 143)):
        for _ in range(5):
            info = table.start("sleep 300")
            assert table.signal(info.id, sig)
            assert table.wait(info.id, timeout=30).exit_code == code, sig


@BOTH_TIERS
def test_signalling_an_ended_process_says_it_was_not_signalled(sandbox: Sandbox,
                                                               runtime: Runtime) -> None:  # fmt: skip
    table = runtime.processes(sandbox.id)
    info = table.start("exit 3")
    assert table.wait(info.id, timeout=30).exit_code == 3
    assert table.signal(info.id, "SIGTERM") is False
    assert table.signal(info.id, "SIGKILL") is False
    assert table.get(info.id).exit_code == 3


def test_an_adopted_command_whose_daemon_is_gone_ends(sandbox: Sandbox, runtime: Runtime) -> None:
    """The relay lives in the daemon that adopted the command: when that process is gone,
    the command's pipes close, it ends, and get() says so (with no exit code to report)."""
    import subprocess
    import sys

    script = (
        "import sys; from agentbox.runtime.runtime import Runtime; rt = Runtime(); "
        f"t = rt.processes({sandbox.id!r}); "
        f'r = rt.commands({sandbox.id!r}).run("python3 -c \'input(\\"name? \\")\'", '
        "timeout=60, detect_input=True, adopt=t.adopt); print(r.process_id, flush=True)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    process_id = done.stdout.strip()
    table = runtime.processes(sandbox.id)
    for _ in range(600):  # EOF ends it at once; 30 s at most
        if not (info := table.get(process_id)).running:
            break
        table.wait(process_id, timeout=0.05)
    assert not info.running and info.exit_code is None and not info.waiting_for_input


@BOTH_TIERS
def test_close_stdin_sends_eof(sandbox: Sandbox, runtime: Runtime) -> None:
    table = runtime.processes(sandbox.id)
    info = table.start("cat; echo eof-seen", stdin=True)
    table.write_stdin(info.id, "sent\n")
    table.close_stdin(info.id)
    assert table.wait(info.id, timeout=30).exit_code == 0
    assert table.read_output(info.id).text == "sent\neof-seen\n"
    with pytest.raises(InvalidRequest, match="was closed"):
        table.write_stdin(info.id, "more")


@BOTH_TIERS
def test_stdin_stays_open_until_closed(sandbox: Sandbox, runtime: Runtime) -> None:
    """The launcher holds the write end: writes that come and go are no EOF."""
    table = runtime.processes(sandbox.id)
    info = table.start("cat", stdin=True)
    for word in ("one\n", "two\n"):
        table.write_stdin(info.id, word)
    assert table.wait(info.id, timeout=0.3).running
    handle = sandbox.commands.connect(info.id)
    handle.close_stdin()
    assert table.wait(info.id, timeout=30).exit_code == 0
    assert table.read_output(info.id).text == "one\ntwo\n"


@BOTH_TIERS
def test_stdin_outlives_the_process_that_started_it(sandbox: Sandbox, agentbox_home) -> None:  # type: ignore[no-untyped-def]
    """The launcher, not the caller, holds the write end: a process started by a program
    that has since exited (an SDK script, a restarted daemon) still reads what is sent."""
    code = (
        "from agentbox import Sandbox; "
        "from pathlib import Path; "
        f"sb = Sandbox.connect({sandbox.id!r}, home=Path({str(agentbox_home)!r})); "
        "print(sb.commands.start('cat', stdin=True).id)"
    )
    started = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    handle = sandbox.commands.connect(started.stdout.strip())
    handle.send_stdin("after\n")
    handle.close_stdin()
    assert handle.wait(timeout=30).exit_code == 0
    assert handle.read().text == "after\n"


@BOTH_TIERS
def test_close_stdin_needs_a_stdin(sandbox: Sandbox, runtime: Runtime) -> None:
    table = runtime.processes(sandbox.id)
    info = table.start("sleep 300")
    with pytest.raises(InvalidRequest, match="no stdin"):
        table.close_stdin(info.id)
    table.signal(info.id, "SIGKILL")


@BOTH_TIERS
def test_a_process_on_a_terminal(sandbox: Sandbox, runtime: Runtime) -> None:
    table = runtime.processes(sandbox.id)
    script = (
        "trap 'echo winch; stty size; read line; echo got:$line; exit 0' WINCH; "
        "tty; stty size; echo ready; while :; do sleep 0.05; done"
    )
    info = table.start(["/bin/bash", "-c", script], pty=(90, 30))
    assert table.get(info.id).terminal

    def output_has(text: str) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if text in table.read_output(info.id).text:
                return True
            table.wait(info.id, timeout=0.02)
        return False

    assert output_has("ready")
    assert "30 90" in table.read_output(info.id).text
    table.resize(info.id, 120, 40)
    assert output_has("winch")
    table.write_stdin(info.id, "hello\n")
    assert table.wait(info.id, timeout=30).exit_code == 0
    out = table.read_output(info.id).text
    # gvisor's terminal has no /dev/pts name inside (docs/design.md, feature table)
    pts = "not a tty" if sandbox.info().isolation == "gvisor" else "/dev/pts/"
    assert out.startswith(pts), out
    assert "40 120" in out and "got:hello" in out
    assert table.read_output(info.id, "stderr").text == ""
    with pytest.raises(InvalidRequest, match="terminal"):
        table.close_stdin(info.id)


@BOTH_TIERS
def test_a_kill_returns_once_the_end_is_recorded(sandbox: Sandbox, runtime: Runtime) -> None:
    """After a SIGKILL the process is ended at once: not running, and a second kill finds
    nothing (E2B's pty.kill said True twice). Its end is recorded by the waiter or the
    terminal's relay a moment after the tree dies; on the namespaces tier the kill did not
    wait for it (under load 13 of 40 kills here still read running)."""
    table = runtime.processes(sandbox.id)
    still_running = []
    for i in range(12):
        for argv, pty in ((["sleep", "300"], None), (["/bin/bash", "-i"], (80, 24))):
            info = table.start(argv, pty=pty)
            assert table.signal(info.id, "SIGKILL")
            if table.get(info.id).running or table.signal(info.id, "SIGKILL"):
                still_running.append((i, argv[0]))
            assert table.wait(info.id, timeout=30).exit_code == 137
    assert still_running == [], f"read as running right after the kill: {still_running}"


@BOTH_TIERS
def test_a_terminal_process_is_signalled_and_killed(sandbox: Sandbox, runtime: Runtime) -> None:
    table = runtime.processes(sandbox.id)
    info = table.start(["/bin/bash", "-i"], pty=(80, 24))
    assert table.signal(info.id, "SIGKILL")
    assert table.wait(info.id, timeout=30).exit_code == 137
    with pytest.raises(ProcessNotFound, match="terminal"):
        table.write_stdin(info.id, "echo late\n")
    with pytest.raises(InvalidRequest, match="no terminal"):
        table.resize(table.start("true").id, 80, 24)
    with pytest.raises(InvalidRequest, match="cols"):
        table.start("true", pty=(0, 24))
