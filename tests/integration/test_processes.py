"""Background processes and persistent shell sessions."""

from __future__ import annotations

from agentbox import Sandbox


def test_background_process_output_offsets_and_exit(sandbox: Sandbox) -> None:
    handle = sandbox.commands.start("for i in 1 2 3; do echo line$i; done; exit 4")
    info = handle.wait(timeout=30)
    assert not info.running and info.exit_code == 4
    first = handle.read("stdout", offset=0, limit=6)
    assert first.text == "line1\n"
    rest = handle.read("stdout", offset=first.next_offset)
    assert rest.text == "line2\nline3\n"


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


def test_kill_takes_the_whole_tree(sandbox: Sandbox) -> None:
    handle = sandbox.commands.start("setsid sleep 300 & sleep 300")
    handle.kill()
    assert not handle.wait(timeout=30).running
    left = sandbox.commands.run("ps -eo comm | grep -c '^sleep$' || true")
    assert left.stdout.strip() == "0"


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
    r = sandbox.commands.run(f"find / -xdev -name exit -path '*{handle.id}*' 2>/dev/null | wc -l")
    assert r.stdout.strip() == "0"
    assert handle.info().exit_code == 5


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
