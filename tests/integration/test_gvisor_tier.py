"""The gVisor isolation tier (``isolation: gvisor``): real sandboxes under runsc.

What holds on this tier is tested here against the same contract as the default tier;
what does not yet hold must raise ``TierUnsupported`` (docs/design.md, Isolation tiers).
When runsc is missing or cannot run here the tests fail and say so (scripts/install.sh
installs it), as every other required tool does.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.audit.log import read_records
from agentbox.egressd import daemon as egressd
from agentbox.errors import SandboxNotFound, TierUnsupported
from agentbox.isolation import gvisor
from agentbox.network import plane
from agentbox.runtime.gvisor_host import GvisorHost
from agentbox.runtime.output import CommandResult
from agentbox.runtime.requests_extra import SessionRunRequest
from agentbox.runtime.runtime import Runtime
from hostres import wait_for
from nettopo import UPSTREAM_A, UPSTREAM_B, Internet, internet
from tierkit import command_lines

AGENTBOX = str(Path(sys.executable).parent / "agentbox")


@pytest.fixture(scope="module", autouse=True)
def runsc_ready() -> None:
    probe = gvisor.probe()
    if not probe.ok:
        pytest.fail(f"the gvisor tier cannot run on this host: {probe.detail} "
                    f"(fix: {gvisor.INSTALL_FIX}; see agentbox doctor)")  # fmt: skip


def _create(home: Path, **options: Any) -> Sandbox:
    options.setdefault("network", "none")
    return Sandbox.create(memory="512MiB", disk="256MiB", isolation="gvisor", home=home,
                          **options)  # fmt: skip


@pytest.fixture(scope="module")
def box(agentbox_home: Path, runtime: Runtime) -> Iterator[Sandbox]:
    sb = _create(agentbox_home)
    try:
        yield sb
    finally:
        sb.kill()


def _processes(sb: Sandbox) -> str:
    """Every process's command line in the sandbox (gVisor's /proc), one per line; the
    listing proves it ran (tierkit.command_lines), so an absence it shows is real."""
    return "\n".join(command_lines(sb))


# the tier is chosen and shown ----------------------------------------------------------


def test_the_record_and_the_listing_show_the_tier(
    box: Sandbox, agentbox_home: Path, runtime: Runtime
) -> None:
    assert box.info().to_dict()["isolation"] == "gvisor"
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    listed = subprocess.run([AGENTBOX, "sandbox", "ls"], env=env,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    line = next(row for row in listed.splitlines() if row.startswith(box.id))
    assert line.split()[3] == "gvisor", listed


def test_the_cli_creates_a_gvisor_sandbox(agentbox_home: Path) -> None:
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    made = subprocess.run(
        [AGENTBOX, "sandbox", "create", "--isolation", "gvisor",
         "--network", "none", "--memory", "256MiB", "--disk", "64MiB", "--json"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    sandbox_id = made.stdout.split('"id": "')[1].split('"')[0]
    try:
        ran = subprocess.run(
            [AGENTBOX, "sandbox", "exec", sandbox_id, "--", "uname", "-r"],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        assert ran.stdout.strip() == "4.4.0", ran.stderr
        shell = subprocess.run([AGENTBOX, "sandbox", "shell", sandbox_id], env=env,
                               input="cd /tmp; pwd; uname -r", capture_output=True, text=True)  # fmt: skip
        assert shell.stdout.split() == ["/tmp", "4.4.0"], shell.stderr
    finally:
        Sandbox.connect(sandbox_id, home=agentbox_home).kill()


def test_a_template_names_the_default_tier_of_its_sandboxes(agentbox_home: Path) -> None:
    """``template set NAME --isolation gvisor``: a create without an isolation of its own
    runs on gVisor; one that names a tier gets that tier."""
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}

    def template(*args: str) -> str:
        done = subprocess.run([AGENTBOX, "template", *args], env=env, capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    template("set", "default", "--isolation", "gvisor")
    made: list[Sandbox] = []
    try:
        assert "(isolation gvisor)" in template("ls")
        made.append(Sandbox.create(network="none", memory="256MiB", home=agentbox_home))
        made.append(Sandbox.create(network="none", memory="256MiB", home=agentbox_home,
                                   isolation="namespaces"))  # fmt: skip
        assert [sb.info().to_dict()["isolation"] for sb in made] == ["gvisor", "namespaces"]
        assert made[0].commands.run(["uname", "-r"]).stdout == "4.4.0\n"
    finally:
        template("set", "default", "--isolation", "namespaces")
        for sb in made:
            sb.kill()
    assert "isolation" not in template("ls")
    made_after = Sandbox.create(network="none", memory="256MiB", home=agentbox_home)
    try:
        assert made_after.info().to_dict()["isolation"] == "namespaces"
    finally:
        made_after.kill()


# the guest kernel is gVisor's ----------------------------------------------------------


def test_the_guest_kernel_is_gvisors(box: Sandbox) -> None:
    r = box.commands.run("uname -r; cat /proc/version; dmesg")
    assert r.exit_code == 0, r.stderr
    release, version, *dmesg = r.stdout.splitlines()
    assert release == "4.4.0" and release != platform.release()
    assert platform.release() not in version
    assert any("gVisor" in line for line in dmesg), dmesg


def test_host_proc_facts_are_invisible(box: Sandbox, agentbox_home: Path) -> None:
    r = box.commands.run(
        "cat /proc/sys/kernel/random/boot_id; cat /proc/self/mountinfo; cat /proc/modules"
    )
    host_boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert host_boot_id not in r.stdout
    # No host path (the home, the disk image, the overlay layers) in the mount table.
    assert str(agentbox_home) not in r.stdout and "/var/tmp" not in r.stdout, r.stdout
    # The host's processes: none of them, only the sandbox's own (its agent, whose
    # workers show the same command line).
    seen = _processes(box)
    assert "agentbox" not in re.sub(r"/\.agentbox/(agent|exec/agent\.sock)\b", "", seen), seen
    assert "pytest" not in seen and "/proc/[0-9]*" in seen, seen  # with its control


def test_io_uring_and_userfaultfd_are_answered_by_gvisor(box: Sandbox) -> None:
    """Kernel-bug-class surfaces: the calls reach the Sentry (its answer, not the host
    kernel's, and not the default tier's seccomp EPERM)."""
    probe = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        "params = ctypes.create_string_buffer(120); "
        "print(libc.syscall(425, 8, params), ctypes.get_errno()); "  # io_uring_setup
        "print(libc.syscall(323, 0), ctypes.get_errno())"  # userfaultfd
    )
    r = box.commands.run(["python3", "-c", probe])
    assert r.exit_code == 0, r.stderr
    (ring, ring_errno), (uffd, uffd_errno) = (
        map(int, line.split()) for line in r.stdout.split("\n")[:2]
    )
    assert uffd == -1 and uffd_errno == errno.ENOSYS  # gVisor has no userfaultfd
    # gVisor's own io_uring (or ENOSYS where it is off); never the host's EPERM
    assert ring >= 0 or ring_errno == errno.ENOSYS, (ring, ring_errno)
    assert ring_errno != errno.EPERM


# commands -------------------------------------------------------------------------------


def test_commands_argv_shell_stdin_and_exit_codes(box: Sandbox) -> None:
    r = box.commands.run("read line; echo got:$line; echo oops >&2; exit 7", stdin="hi\n")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "got:hi\n", "oops\n")
    r = box.commands.run(["printf", "%s|", "a b", "$HOME", "*"])
    assert (r.exit_code, r.stdout) == (0, "a b|$HOME|*|")
    r = box.commands.run("id -un; pwd; echo $HOME", env={"EXTRA": "1"})
    assert r.stdout.split() == ["user", "/workspace", "/home/user"]
    r = box.commands.run(["sh", "-c", "echo $EXTRA"], env={"EXTRA": "x y"}, cwd="/tmp")
    assert r.stdout == "x y\n"
    assert box.commands.run(["/no/such/program"]).exit_code != 0


def test_a_timeout_kills_the_whole_tree_setsid_included(box: Sandbox) -> None:
    r = box.commands.run("sleep 4241 & setsid sleep 4242 & nohup sleep 4243 & echo forked; "
                         "sleep 4244", timeout=5)  # fmt: skip
    assert r.timed_out and r.exit_code != 0 and "forked" in r.stdout, r
    seen = _processes(box)
    assert not any(f"sleep 424{i}" in seen for i in range(1, 5)), seen
    # the sandbox itself lives on
    assert box.commands.run("echo alive").stdout == "alive\n"


def test_kill_foreground_ends_running_commands_only(box: Sandbox, runtime: Runtime) -> None:
    """What a task's cancellation does: running commands die, background ones live on."""
    table = runtime.processes(box.id)
    background = table.start(["sleep", "3131"])
    results: list[CommandResult] = []
    running = threading.Thread(
        target=lambda: results.append(box.commands.run("sleep 3132", timeout=120))
    )
    running.start()
    wait_for(lambda: "sleep 3132" in _processes(box), 30, "the command to run")
    runtime.commands(box.id).kill_foreground()
    running.join(timeout=60)
    assert results and results[0].exit_code != 0 and not results[0].timed_out
    assert table.get(background.id).running
    table.signal(background.id, "SIGKILL")


def test_a_pty_command_has_a_terminal_and_cannot_inject_into_it(box: Sandbox) -> None:
    r = box.commands.run("test -t 0 && echo interactive; read x; echo got:$x; exit 6",
                         pty=True, stdin="hello\n")  # fmt: skip
    assert r.exit_code == 6 and "interactive" in r.stdout and "got:hello" in r.stdout, r.stdout
    inject = (
        "import fcntl, termios\ntry:\n fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('injected')"
        "\nexcept OSError as e: print('refused', e.errno)"
    )
    r = box.commands.run(["python3", "-c", inject], pty=True)
    assert "refused" in r.stdout, r.stdout  # gVisor's tty passes no TIOCSTI on
    r = box.commands.run("sleep 4646 & echo forked; setsid sleep 4647", pty=True, timeout=5)
    assert r.timed_out and "forked" in r.stdout and "sleep 464" not in _processes(box), r


def test_output_is_capped_and_marked(box: Sandbox) -> None:
    r = box.commands.run("head -c 200000 /dev/zero | tr '\\0' a", max_output_bytes=1000)
    assert r.truncated and len(r.stdout_bytes) < 2000 and r.stdout_total == 200000


def test_the_agent_is_not_root_and_has_no_capabilities(box: Sandbox) -> None:
    nnp = "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"  # GET_NO_NEW_PRIVS
    r = box.commands.run(f"id -u; grep -E '^Cap(Prm|Eff)' /proc/self/status; python3 -c '{nnp}'")
    uid, prm, eff, no_new_privs = r.stdout.splitlines()
    assert int(uid) != 0
    assert prm.split()[1] == eff.split()[1] == "0000000000000000", (prm, eff)
    assert no_new_privs == "1"


# files ---------------------------------------------------------------------------------


def test_files_api_and_the_shell_see_one_tree(box: Sandbox) -> None:
    box.files.write("/workspace/f.txt", "one\n")
    assert box.commands.run("cat /workspace/f.txt").stdout == "one\n"
    box.files.write("/workspace/f.txt", "two\n")  # the Sentry must not serve a stale copy
    assert box.commands.run("cat /workspace/f.txt").stdout == "two\n"
    box.commands.run("echo from-shell > /tmp/g.txt; mkdir -p /workspace/d; echo z > /workspace/d/z")
    assert box.files.read("/tmp/g.txt") == "from-shell\n"
    assert [e.path for e in box.files.list("/workspace/d")] == ["/workspace/d/z"]
    # owned by the agent on both sides: the shell may change what the files API wrote
    r = box.commands.run("echo three >> /workspace/f.txt && cat /workspace/f.txt")
    assert r.stdout == "two\nthree\n", r.stderr


def test_symlinks_made_inside_do_not_lead_the_files_api_out(box: Sandbox) -> None:
    box.commands.run("ln -sfn / /workspace/up; ln -sfn ../../../../../etc /workspace/etc")
    inside = box.commands.run("cat /etc/passwd").stdout
    assert box.files.read("/workspace/up/etc/passwd") == inside
    assert box.files.read("/workspace/etc/passwd") == inside
    assert inside != Path("/etc/passwd").read_text()
    name = f"written-{box.id}"
    box.files.write(f"/workspace/up/tmp/{name}", "x")  # lands in the sandbox's own /tmp
    assert not Path(f"/tmp/{name}").exists()
    assert box.commands.run(f"cat /tmp/{name}").stdout == "x"


# what this tier does not do yet ----------------------------------------------------------


def test_unsupported_features_raise_a_typed_error(box: Sandbox, runtime: Runtime) -> None:
    attempts = {
        # the default tier's launcher would join the Sentry's host namespaces (the browser)
        "host launch": lambda: runtime.commands(box.id).launcher_argv(["chromium"], "b", None),
        "on_idle stop": lambda: runtime.create({"isolation": "gvisor", "on_idle": "stop"}),
    }
    for name, attempt in attempts.items():
        with pytest.raises(TierUnsupported) as caught:
            attempt()
        assert caught.value.code == "tier_unsupported", name
        assert "gvisor" in caught.value.message and "namespaces" in caught.value.message
    assert box.commands.run("echo still").stdout == "still\n"


def test_background_processes(box: Sandbox, runtime: Runtime) -> None:
    table = runtime.processes(box.id)
    trap = "echo started; trap 'echo got-term; exit 5' TERM; while :; do sleep 0.1; done"
    p = table.start(["sh", "-c", trap])
    wait_for(lambda: table.read_output(p.id).data == b"started\n", 15, "the process to start")
    assert table.get(p.id).running
    assert table.signal(p.id, "SIGTERM")  # to the command itself, which handles it
    done = table.wait(p.id, timeout=30)
    assert (done.running, done.exit_code) == (False, 5)
    assert table.read_output(p.id).data == b"started\ngot-term\n"
    # stdin through the FIFO, SIGKILL of the whole tree
    q = table.start("sleep 9191 & setsid sleep 9192 & cat; wait", stdin=True)
    assert table.write_stdin(q.id, "hello\n") == 6
    wait_for(lambda: table.read_output(q.id).data == b"hello\n", 15, "cat to echo")
    wait_for(lambda: all(f"sleep 919{i}" in _processes(box) for i in (1, 2)), 30,
             "both sleeps to run (the tree the kill must take)")  # fmt: skip
    assert table.signal(q.id, "SIGKILL")
    # As on the namespaces tier, a SIGKILL returns once the command has ended: at once
    # not running, and a second kill finds nothing (E2B's pty.kill said True twice).
    assert not table.get(q.id).running
    assert not table.signal(q.id, "SIGKILL")
    assert table.wait(q.id, timeout=30).exit_code == 137
    seen = _processes(box)
    assert "sleep 919" not in seen, seen
    # the exit status comes from the host-side waiter, and outlives this handle
    r = runtime.processes(box.id).start(["sh", "-c", "exit 3"])
    assert runtime.processes(box.id).wait(r.id, timeout=30).exit_code == 3


def test_shell_sessions_keep_cwd_and_env(box: Sandbox, runtime: Runtime) -> None:
    sessions = runtime.sessions(box.id)
    sid = sessions.create()
    sessions.run(SessionRunRequest(sid, "mkdir -p /tmp/sess && cd /tmp/sess && export GREETING=hi"))
    assert sessions.run(SessionRunRequest(sid, "pwd; echo $GREETING")).stdout == "/tmp/sess\nhi\n"
    sessions.close(sid)


def test_limits_hold_the_whole_sandbox(box: Sandbox, runtime: Runtime) -> None:
    """The Sentry, the Gofer and every ptrace stub live in the sandbox's own cgroups
    (runsc would otherwise make unlimited ones of its own), and the Sentry sizes its
    memory to the limit."""
    record = box.info()
    cgroup = runtime.layout.sandbox(box.id)
    members = cgroup.pids()
    assert record.init_pid in members and len(members) >= 2  # Sentry + Gofer at least
    for pid in members:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        for controller in cgroup.v1:  # hybrid hosts: every v1 controller we limit with
            assert any(f":{controller}:/agentbox/{box.id}" in line for line in lines), lines
    r = box.commands.run("grep MemTotal /proc/meminfo")
    assert int(r.stdout.split()[1]) * 1024 == record.spec.memory, r.stdout
    assert cgroup.memory_current() > 0


def test_stop_keeps_the_disk_and_resume_starts_it_again(
    agentbox_home: Path, net: Internet, runtime: Runtime
) -> None:
    sb = _create(agentbox_home, network={"mode": "allowlist", "allow": ["allowed.test"],
                                         "hosts": HOSTS})  # fmt: skip
    try:
        sb.commands.run("echo kept > /workspace/kept")
        sb.commands.start("sleep 4545")  # a background process: it outlives its call
        wait_for(lambda: "sleep 4545" in _processes(sb), 30, "the background process to run")
        assert runtime.stop(sb.id).state == "stopped"
        assert not runtime.alive(runtime.get(sb.id))
        assert runtime.resume(sb.id).state == "running"
        assert sb.commands.run("cat /workspace/kept").stdout == "kept\n"
        assert "sleep 4545" not in _processes(sb)
        code, body = _curl(sb, "http://allowed.test/")  # its network is wired again
        assert code == 200 and body.startswith("hello from allowed.test"), body
    finally:
        sb.kill()


def test_pause_and_resume(box: Sandbox, runtime: Runtime) -> None:
    box.commands.run("echo kept > /tmp/kept")
    assert runtime.pause(box.id).state == "paused"
    assert runtime.layout.sandbox(box.id).frozen()  # the Sentry itself is frozen
    assert box.commands.run("cat /tmp/kept").stdout == "kept\n"  # resumes first
    assert runtime.get(box.id).state == "running"


# network -------------------------------------------------------------------------------

HOSTS = {"allowed.test": UPSTREAM_A, "other.test": UPSTREAM_B}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with internet(tmp_path_factory.mktemp("net")) as world:
        yield world


def _curl(sb: Sandbox, *args: str) -> tuple[int, str]:
    r = sb.commands.run(["curl", "-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}",
                         *args])  # fmt: skip
    lines = r.stdout.rsplit("\n", 1)
    return int(lines[-1] or 0), lines[0]


def test_allowlist_egress_goes_through_the_same_proxy(
    agentbox_home: Path, net: Internet, runtime: Runtime
) -> None:
    sb = _create(agentbox_home, network={"mode": "allowlist", "allow": ["allowed.test"],
                                         "hosts": HOSTS})  # fmt: skip
    try:
        code, body = _curl(sb, "http://allowed.test/")
        assert code == 200 and body.startswith("hello from allowed.test"), body
        before = net.seen()
        assert _curl(sb, "http://other.test/")[0] == 403
        assert _curl(sb, f"http://{UPSTREAM_A}/")[0] == 403  # IP literal
        # a program ignoring the proxy variables is intercepted and filtered by name
        code, _ = _curl(sb, "--noproxy", "*", "--resolve", f"other.test:80:{UPSTREAM_B}",
                        "http://other.test/")  # fmt: skip
        assert code == 403
        assert net.seen() == before, "a denied request reached the upstream"
        decisions = [r["decision"] for r in read_records(egressd.audit_path(agentbox_home),
                     limit=None) if r["sandbox"] == sb.id]  # fmt: skip
        assert "egress_allowed" in decisions and "egress_denied" in decisions, decisions
        # no UDP leaves (DNS exfiltration): dropped at the sandbox's interface
        r = sb.commands.run(["python3", "-c", "import socket; s=socket.socket(2, 2); "
                             f"s.sendto(b'q', ('{UPSTREAM_B}', 53)); print('sent')"])  # fmt: skip
        assert r.ok and r.stdout == "sent\n", r  # the control: the packet left the program
        time.sleep(0.5)  # one that leaked would be logged by now (no wait for a condition)
        assert "udp" not in net.seen()[len(before) :]
    finally:
        sb.kill()


def test_network_none_has_only_loopback(agentbox_home: Path, net: Internet) -> None:
    sb = _create(agentbox_home, network="none")
    try:
        r = sb.commands.run("cat /proc/net/dev; env")
        assert "lo:" in r.stdout, r.stdout  # the control: the interfaces were listed
        assert "eth0" not in r.stdout and "HTTP_PROXY" not in r.stdout
        # curl's 7: it could not connect (no route), not a missing binary or a timeout.
        r = sb.commands.run(["curl", "-sS", "--max-time", "10", f"http://{UPSTREAM_A}/"])
        assert r.exit_code == 7 and not r.timed_out, (r.exit_code, r.stderr)
        r = sb.commands.run(["python3", "-c", "import socket; s=socket.socket(); "
                             "s.bind(('127.0.0.1', 0)); s.listen(); c=socket.socket(); "
                             "c.connect(s.getsockname()); print('lo ok')"])  # fmt: skip
        assert r.stdout == "lo ok\n", r.stderr
    finally:
        sb.kill()


# destroy -------------------------------------------------------------------------------


def test_destroy_leaves_nothing_behind(agentbox_home: Path, runtime: Runtime) -> None:
    sb = _create(agentbox_home, network={"mode": "allowlist", "allow": ["allowed.test"]})
    record = sb.info()
    directory = agentbox_home / "sandboxes" / sb.id
    link = plane.home_net(agentbox_home).link(record.slot)
    state_root = directory / "runsc"
    assert state_root.is_dir() and Path(f"/sys/class/net/{link.host_ifname}").exists()
    sb.commands.run("sleep 1000 & setsid sleep 1001 &")
    sb.kill()
    assert not directory.exists()
    assert sb.id not in Path("/proc/self/mountinfo").read_text()
    assert not Path(f"/sys/class/net/{link.host_ifname}").exists()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert str(state_root).encode() not in cmdline, f"runsc process {pid} survived"
    cgroup = runtime.layout.sandbox(sb.id)
    assert not cgroup.unified.exists() and not any(p.exists() for p in cgroup.v1.values())
    assert runtime.store.get(sb.id) is None


def test_snapshot_and_restore_keep_the_tier_and_the_files(box: Sandbox, runtime: Runtime) -> None:
    box.commands.run("echo snap > /workspace/s.txt; echo home > ~/h.txt")
    info = runtime.snapshot(box.id)
    restored = runtime.restore(info.id)
    try:
        assert restored.isolation == "gvisor"
        r = runtime.commands(restored.id).run("cat /workspace/s.txt ~/h.txt; uname -r")
        assert r.stdout == "snap\nhome\n4.4.0\n", r.stderr
    finally:
        runtime.destroy(restored.id)
        runtime.delete_snapshot(info.id)


def test_fork_copies_the_disk_onto_the_same_tier(box: Sandbox, runtime: Runtime) -> None:
    box.commands.run("echo base > /workspace/forked.txt")
    fork = runtime.fork(box.id)
    try:
        assert fork.isolation == "gvisor"
        r = runtime.commands(fork.id).run(
            "cat /workspace/forked.txt; id -un; echo more >> /workspace/forked.txt"
        )
        assert r.stdout == "base\nuser\n", r.stderr
        assert runtime.files(fork.id).read("/workspace/forked.txt") == b"base\nmore\n"
        assert box.commands.run("cat /workspace/forked.txt").stdout == "base\n"
    finally:
        runtime.destroy(fork.id)


def test_a_warm_gvisor_sandbox_serves_only_gvisor_requests(
    agentbox_home: Path, runtime: Runtime
) -> None:
    from agentbox.runtime.spec_input import spec_from

    wanted = {"isolation": "gvisor", "network": "none", "memory": "256MiB", "disk": "64MiB"}
    pooled = runtime.fill_pool(spec_from(wanted))
    try:
        other = runtime.create({**wanted, "isolation": "namespaces"})
        assert other.id != pooled.id and other.isolation == "namespaces"
        runtime.destroy(other.id)
        claimed = runtime.create(wanted)
        assert claimed.id == pooled.id and claimed.isolation == "gvisor"
        assert runtime.commands(claimed.id).run("uname -r").stdout == "4.4.0\n"
    finally:
        runtime.destroy(pooled.id)


def test_recovery_removes_an_orphaned_gvisor_sandbox(agentbox_home: Path, runtime: Runtime) -> None:
    """A sandbox whose record is gone (a crash between steps) is found by its directory
    and removed whole: runsc's state and processes, the netns pin, mounts, cgroups."""
    from agentbox.runtime.recovery import recover

    sb = _create(agentbox_home, network={"mode": "allowlist", "allow": ["allowed.test"]})
    directory = agentbox_home / "sandboxes" / sb.id
    sentry = sb.info().init_pid
    runtime.store.delete(sb.id)  # what a crash mid-destroy leaves
    recover(runtime)
    assert not directory.exists()
    assert sb.id not in Path("/proc/self/mountinfo").read_text()
    assert (
        not Path(f"/proc/{sentry}").exists()
        or b"runsc" not in Path(f"/proc/{sentry}/cmdline").read_bytes()
    )


def test_an_unknown_tier_is_refused(agentbox_home: Path) -> None:
    from agentbox.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="isolation"):
        Sandbox.create(isolation="kata", home=agentbox_home)


def test_a_missing_runsc_is_a_typed_error_naming_the_fix(
    agentbox_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentbox.errors import HostUnsupported

    monkeypatch.setattr(gvisor, "CANDIDATES", ())
    monkeypatch.setattr(gvisor, "_found", None)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(HostUnsupported, match="apt-get install -y runsc"):
        gvisor.find_runsc()


def test_a_snapshot_with_memory_is_a_typed_error_on_the_namespaces_tier(
    agentbox_home: Path,
) -> None:
    """The namespaces tier's processes live in the host kernel, which cannot save them:
    refused, typed, naming the tier that could."""
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    plain = Sandbox.create(network="none", memory="256MiB", home=agentbox_home)
    try:
        done = subprocess.run([AGENTBOX, "snapshot", "create", "--memory", plain.id], env=env,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode != 0 and "tier_unsupported" in done.stderr, done.stderr
        assert "needs isolation gvisor" in done.stderr, done.stderr
        assert "without --memory" in done.stderr, done.stderr
    finally:
        plain.kill()


_COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"


def _count(sb: Sandbox) -> int:
    return int(sb.commands.run("cat /tmp/count").stdout.strip() or 0)


def test_a_snapshot_with_memory_resumes_a_running_process_from_its_count(
    agentbox_home: Path, runtime: Runtime
) -> None:
    """snapshot create --memory (runsc checkpoint) keeps a process counting in memory: the
    source carries on, and a restore (after the source is gone: its slot's uid is the
    processes') goes on counting from where the checkpoint was, not from 0."""
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    source = _create(agentbox_home)
    restored = None
    try:
        source.commands.start(_COUNTER)
        wait_for(lambda: _count(source) >= 5, what="the counter to count")
        busy = GvisorHost(agentbox_home, source.id, runtime.get(source.id).slot)
        marker = busy.exec_dir / "c-running.json"  # a one-shot command in flight
        marker.touch()
        refused = subprocess.run([AGENTBOX, "snapshot", "create", "--memory", source.id],
                                 env=env, capture_output=True, text=True)  # fmt: skip
        marker.unlink()
        assert refused.returncode != 0 and "a command is running" in refused.stderr
        before = _count(source)
        done = subprocess.run([AGENTBOX, "snapshot", "create", "--memory", "--json", source.id],
                              env=env, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        assert info["memory"]["size"] > 0 and info["memory"]["sha256"]
        # The source was restored in place: alive, its agent answering, still counting.
        at_source = _count(source)
        wait_for(lambda: _count(source) > at_source, what="the source to count on")
        source.kill()
        restored_id = subprocess.run([AGENTBOX, "snapshot", "restore", info["id"]], env=env,
                                     capture_output=True, text=True)  # fmt: skip
        assert restored_id.returncode == 0, restored_id.stderr
        restored = Sandbox.connect(restored_id.stdout.strip(), home=agentbox_home)
        # /tmp is not in a snapshot's files: the count is the process's memory (a fresh
        # process would start from 1).
        first = wait_for(lambda: _count(restored), what="the restored process to count")
        assert first > before
        wait_for(lambda: _count(restored) > first, what="the restored process to count on")
        assert "while true" in _processes(restored)
    finally:
        for sb in (source, restored):
            if sb is not None:
                with contextlib.suppress(SandboxNotFound):
                    sb.kill()


def test_a_memory_snapshot_of_an_idle_sandbox_waits_for_the_agent_not_its_socket(
    agentbox_home: Path, runtime: Runtime
) -> None:
    """The agent says it closed its listener by its name (``runsc ps``), not by a refused
    connect: gVisor keeps the host socket listening, with no one to accept, until it
    drops the path's cached dentry, which an idle sandbox never does (the quiesce hung on
    a full backlog). Twice in a row, the source answering between and after: the agent
    listens again and takes its name back."""
    source = _create(agentbox_home)
    try:
        host = GvisorHost(agentbox_home, source.id, runtime.get(source.id).slot)
        for _ in range(2):
            info = runtime.snapshot(source.id, memory=True)
            assert info.memory is not None and info.memory["size"] > 0
            assert host.agent_name() == "agent"  # listening again, under its own name
            assert source.commands.run("echo still here").stdout == "still here\n"
    finally:
        source.kill()


def test_a_low_pids_limit_leaves_room_for_runsc_itself(agentbox_home: Path) -> None:
    """The host cgroup holds the Sentry's and Gofer's threads too: with exactly ``pids``
    there, a sandbox with pids=64 ended at its first pipeline (the Sentry could not
    make a thread). A burst that uses up the limit and the headroom can still end the
    sandbox, never more (tests/security/test_gvisor_kernel.py, the fork bomb)."""
    sb = _create(agentbox_home, pids=64)
    try:
        for _ in range(3):
            r = sb.commands.run("echo a | head -1; seq 20 | sort -rn | head -1")
            assert (r.exit_code, r.stdout) == (0, "a\n20\n"), r
    finally:
        sb.kill()
