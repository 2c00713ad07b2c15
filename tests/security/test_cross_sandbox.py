"""Attack 3b — one sandbox reaching another on the same host.

Covers (on each isolation tier): two live sandboxes run as different host uids; from B,
A's processes are invisible and cannot be signalled even by their host pid (on gvisor:
A's Sentry's); A's workspace is invisible by name, by its
host path (which leaks through /proc/self/mountinfo) and through B's file API; A's TCP
listener on 127.0.0.1 and its abstract unix socket are unreachable (separate network
namespaces); A's SysV shared memory is invisible (separate IPC namespaces).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from secprobe import host_uid, run_python

from agentbox import Sandbox
from agentbox.errors import AgentboxError
from agentbox.runtime.runtime import Runtime
from hostres import pids_with_cmdline, wait_for

SERVER = r"""
import ctypes, socket, sys, time
key = int(sys.argv[1])
tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", 8765)); tcp.listen(8)
unix = socket.socket(socket.AF_UNIX); unix.bind("\0" + sys.argv[2]); unix.listen(8)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget(key, 4096, 0o1000 | 0o666) >= 0
print("ready", flush=True)
time.sleep(float(sys.argv[3]))
"""


@pytest.fixture(scope="module")
def pair(runtime: Runtime, agentbox_home: Path, tier: str) -> Iterator[tuple[Sandbox, Sandbox]]:
    """Two sandboxes on each isolation tier."""
    a = Sandbox.create(memory="128MiB", disk="32MiB", home=agentbox_home, isolation=tier)
    try:
        b = Sandbox.create(memory="128MiB", disk="32MiB", home=agentbox_home, isolation=tier)
        try:
            yield a, b
        finally:
            b.kill()
    finally:
        a.kill()


@pytest.fixture(scope="module")
def a_state(pair: tuple[Sandbox, Sandbox]) -> dict[str, str]:
    a, _ = pair
    state = {
        "secret": "A-SECRET-" + secrets.token_hex(8),
        "name": "a-only-" + secrets.token_hex(6),
        "sock": "a-sock-" + secrets.token_hex(6),
        "key": str(0x5B000000 + secrets.randbelow(0xFFFFFF)),
        "sleep": f"{2000 + secrets.randbelow(100_000)}.5",
    }
    a.files.write(f"/workspace/{state['name']}", state["secret"].encode())
    server = a.commands.start(
        ["python3", "-c", SERVER, state["key"], state["sock"], state["sleep"]]
    )
    wait_for(lambda: "ready" in server.read().text, 15, "A's servers")
    if a.info().isolation == "gvisor":  # A's processes live in its Sentry: aim at that
        pid = a.info().init_pid
    else:
        pid = wait_for(
            lambda: pids_with_cmdline(
                f"python3 -c {SERVER} {state['key']} {state['sock']} {state['sleep']}",
                host_uid(a),
            ),
            10,
            "A's server on the host",
        )[0]
    state["host_pid"] = str(pid)
    mountinfo = a.commands.run("cat /proc/self/mountinfo").stdout
    state["mountinfo"] = mountinfo
    return state


def test_sandboxes_have_distinct_host_uids(pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    assert host_uid(a) != host_uid(b)


def test_other_sandboxes_processes_are_invisible_and_unsignallable(
    pair: tuple[Sandbox, Sandbox], a_state: dict[str, str]
) -> None:
    _, b = pair
    # Every command line B's /proc shows (not ps: it needs /proc/self, which a gvisor
    # command in its own PID namespace lacks); the control: B sees its own listing.
    listing = 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline; echo; done'
    r = b.commands.run(listing)
    assert "/proc/[0-9]*" in r.stdout and a_state["sock"] not in r.stdout, r.stdout
    pid = a_state["host_pid"]
    r = b.commands.run(f"kill -9 {pid}; kill -0 {pid}")
    assert r.exit_code != 0
    assert Path(f"/proc/{pid}").exists(), "B killed A's process by its host pid"


def test_other_sandboxes_files_are_invisible(
    pair: tuple[Sandbox, Sandbox], a_state: dict[str, str], agentbox_home: Path
) -> None:
    a, b = pair
    name = a_state["name"]
    control = f"/tmp/{name}-control"  # B's own: proves the search itself works
    b.commands.run(["touch", control])
    # Not /usr: the host's, read-only, shared by design; walking it on the gvisor tier ran
    # past the command's 60 s, and the search then found nothing because it was cut short.
    r = b.commands.run(
        f"find / \\( -path /proc -o -path /usr \\) -prune -o -name '{name}*' -print 2>/dev/null",
        timeout=120,
    )
    b.commands.run(["rm", "-f", control])
    assert not r.timed_out
    assert r.stdout.split() == [control], f"B found A's file by name: {r.stdout}"
    a_host_workspace = agentbox_home / "sandboxes" / a.id / "disk" / "workspace"
    for path in (
        f"{a_host_workspace}/{name}",
        f"/proc/1/root{a_host_workspace}/{name}",
        f"../../../../sandboxes/{a.id}/disk/workspace/{name}",
    ):
        r = b.commands.run(["cat", path])
        assert a_state["secret"] not in r.stdout, f"B read A's file via {path}"
        with pytest.raises(AgentboxError):
            data = b.files.read(path)
            pytest.fail(f"B's file API read {path}: {data!r}")


def test_other_sandboxes_network_is_unreachable(
    pair: tuple[Sandbox, Sandbox], a_state: dict[str, str]
) -> None:
    _, b = pair
    probe = (
        "import json, socket\n"
        "t = socket.socket(); t.settimeout(2)\n"
        "u = socket.socket(socket.AF_UNIX)\n"
        f"addr = '\\0{a_state['sock']}'\n"
        "print(json.dumps([t.connect_ex(('127.0.0.1', 8765)), u.connect_ex(addr)]))"
    )
    tcp, unix = run_python(b, probe)
    assert tcp != 0, "B connected to A's loopback listener"
    assert unix != 0, "B connected to A's abstract unix socket"
    # Control: A itself reaches both.
    a, _ = pair
    assert run_python(a, probe) == [0, 0]


def test_other_sandboxes_ipc_is_invisible(
    pair: tuple[Sandbox, Sandbox], a_state: dict[str, str]
) -> None:
    _, b = pair
    probe = (
        "import ctypes, json; libc = ctypes.CDLL(None, use_errno=True);"
        f"print(json.dumps([libc.shmget({a_state['key']}, 0, 0), ctypes.get_errno()]))"
    )
    assert run_python(b, probe) == [-1, 2]  # ENOENT: no such segment, not another refusal
    assert a_state["key"] not in b.commands.run("cat /proc/sysvipc/shm").stdout
