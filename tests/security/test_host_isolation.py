"""Attack 3 — reaching host files, processes, IPC and network from inside a sandbox.

Covers: world-readable secret files planted in host /var/tmp, /tmp and /root are not found
by path (directly, via /proc/1/root, /proc/self/root), by name (``find /``) or by content
(``grep -r`` over everything but the read-only host /usr); host /etc is not visible
(/etc/shadow, /etc/hostname, /etc/passwd); /proc/1/root and /proc/self/root are the
sandbox's root; the init's and our own executables, the host /usr and the launcher binary
cannot be written (and are byte-identical on the host afterwards); the environment of the
init and of commands carries nothing from the host; host processes, SysV IPC, abstract
unix sockets and network interfaces are invisible; /dev holds no real devices, /sys is
absent and /proc's host-wide control files cannot be written.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from secprobe import HostSecret, dir_entries, run_python

from agentbox import Sandbox
from agentbox.isolation import initfs
from agentbox.runtime.host import SandboxHost
from agentbox.runtime.runtime import Runtime
from tierkit import sandbox_on


@pytest.fixture(scope="module", params=["namespaces", "gvisor"])
def shared_sandbox(
    request: pytest.FixtureRequest, runtime: Runtime, agentbox_home: Path
) -> Iterator[Sandbox]:
    """Every probe here runs on both isolation tiers (docs/design.md, Isolation tiers)."""
    with sandbox_on(runtime, agentbox_home, request.param, disk="128MiB") as sb:
        yield sb


def _host_paths(secret: HostSecret) -> list[str]:
    return [str(p) for p in secret.files]


def test_secret_paths_do_not_exist_inside(shared_sandbox: Sandbox, host_secret: HostSecret) -> None:
    for path in _host_paths(host_secret):
        for prefix in ("", "/proc/1/root", "/proc/self/root", "/proc/1/cwd/../.."):
            r = shared_sandbox.commands.run(["cat", prefix + path])
            assert r.exit_code != 0 and host_secret.value not in r.stdout, (
                f"host file {path} readable from inside as {prefix + path}"
            )
    assert dir_entries(shared_sandbox, str(host_secret.dir)) == "ENOENT"
    assert "usr" in dir_entries(shared_sandbox, "/")  # the control: a listing lists
    for parent in ("/var/tmp", "/tmp", "/root"):
        seen = dir_entries(shared_sandbox, parent)
        # The sandbox's own directory (or none, or not its to read): never the host's.
        assert seen in ("ENOENT", "EACCES") or host_secret.name not in seen, (
            f"host {parent} is visible inside: {seen}"
        )


def test_find_by_name_finds_nothing(shared_sandbox: Sandbox, host_secret: HostSecret) -> None:
    control = f"/workspace/{host_secret.name}-control"  # proves the search itself works
    shared_sandbox.commands.run(["touch", control])
    try:
        # Not /usr: the host's, read-only, shared by design (as in the grep below); on the
        # gvisor tier walking it took 95 s of the 120 s allowed.
        r = shared_sandbox.commands.run(
            f"find / \\( -path /proc -o -path /usr \\) -prune -o -name '*{host_secret.name}*' "
            "-print 2>/dev/null",
            timeout=120,
        )
    finally:
        shared_sandbox.commands.run(["rm", "-f", control])
    assert not r.timed_out
    assert r.stdout.split() == [control], f"found host files by name: {r.stdout}"


def test_grep_for_secret_content_finds_nothing(
    shared_sandbox: Sandbox, host_secret: HostSecret
) -> None:
    control = "/tmp/agentbox-grep-control"  # proves the search itself works
    shared_sandbox.commands.run(f"echo $S > {control}", env={"S": host_secret.value})
    try:
        # Every top-level directory but the host's read-only /usr (shared by design, and
        # the /bin, /lib symlinks into it), /proc (our own argv holds the needle) and /dev.
        r = shared_sandbox.commands.run(
            'grep -rlsF -D skip -- "$S" $(find / -mindepth 1 -maxdepth 1 ! -type l'
            " ! -name usr ! -name proc ! -name dev)",
            env={"S": host_secret.value},
            timeout=120,
        )
    finally:
        shared_sandbox.commands.run(["rm", "-f", control])
    assert not r.timed_out
    found = [line.lstrip("/") for line in r.stdout.split()]
    assert found == [control.lstrip("/")], f"the secret's bytes are visible in: {r.stdout}"


def test_host_etc_is_not_visible(shared_sandbox: Sandbox) -> None:
    r = shared_sandbox.commands.run("test -e /etc/shadow || test -e /etc/gshadow")
    assert r.exit_code != 0, "a shadow file exists inside the sandbox"
    inside_hostname = shared_sandbox.commands.run("cat /etc/hostname").stdout
    host_hostname = Path("/etc/hostname").read_text() if Path("/etc/hostname").exists() else ""
    assert inside_hostname != host_hostname or host_hostname.strip() == "agentbox"
    passwd = shared_sandbox.commands.run("cat /etc/passwd").stdout
    users = {line.split(":")[0] for line in passwd.splitlines() if line.strip()}
    assert users <= {"root", "user", "nobody"}, f"unexpected accounts inside: {users}"
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()}
    leaked = (host_users - {"root", "user", "nobody"}) & users
    assert not leaked


def test_proc_root_links_point_inside(shared_sandbox: Sandbox) -> None:
    # The init is not dumpable, so its links are closed to the agent (EACCES); a link that
    # can be followed must lead to the sandbox's own root.
    probe = (
        "import json, os\n"
        "def ids(p):\n"
        "    try: return '%d:%d' % (os.stat(p).st_dev, os.stat(p).st_ino)\n"
        "    except PermissionError: return 'denied'\n"
        "print(json.dumps({p: ids(p) for p in"
        " ['/', '/proc/self/root', '/proc/1/root', '/proc/1/root/..', '/proc/1/cwd/../..']}))"
    )
    ids: dict[str, str] = run_python(shared_sandbox, probe)
    followable = {v for v in ids.values() if v != "denied"}
    assert followable == {ids["/"]}, f"a root link leads elsewhere than /: {ids}"
    assert ids["/proc/self/root"] == ids["/"]
    listing = run_python(
        shared_sandbox, "import json, os; print(json.dumps(os.listdir('/proc/self/root/')))"
    )
    assert ".agentbox" in listing and "workspace" in listing
    assert "sandboxes" not in listing and "state.db" not in listing


@pytest.fixture
def protected_binaries(runtime: Runtime, shared_sandbox: Sandbox) -> Iterator[dict[Path, str]]:
    paths = [
        runtime.paths.nsexec,
        initfs.ensure(runtime.home, runtime.paths.nsexec),  # the copy bound as /.agentbox/init
        Path("/usr/bin/true"),
        Path(os.path.realpath("/usr/bin/python3")),
    ]
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    yield before
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert after == before, "a host binary was modified from inside a sandbox"


WRITE_PROBE = r"""
import errno, json, os
targets = ["/proc/self/exe", "/proc/1/exe", "/.agentbox/init", "/usr/bin/true",
           os.path.realpath("/usr/bin/python3"), "/usr/bin/agentbox-planted"]
out = {}
for t in targets:
    for how, flags in (("rw", os.O_RDWR), ("trunc", os.O_WRONLY | os.O_TRUNC),
                       ("creat", os.O_WRONLY | os.O_CREAT)):
        try:
            fd = os.open(t, flags, 0o755)
            os.write(fd, b"#!/bin/sh\necho pwned\n")
            os.close(fd)
            out[f"{t} {how}"] = "ok"
        except OSError as e:
            out[f"{t} {how}"] = errno.errorcode[e.errno]
for t in ["/usr/bin/true", "/.agentbox/init"]:
    for name, op in (("chmod", lambda p: os.chmod(p, 0o777)), ("unlink", os.unlink),
                     ("rename", lambda p: os.rename(p, p + ".x"))):
        try:
            op(t)
            out[f"{t} {name}"] = "ok"
        except OSError as e:
            out[f"{t} {name}"] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


def test_executables_and_host_usr_cannot_be_written(
    shared_sandbox: Sandbox, protected_binaries: dict[Path, str]
) -> None:
    out: dict[str, str] = run_python(shared_sandbox, WRITE_PROBE)
    worked = [k for k, v in out.items() if v == "ok"]
    assert not worked, f"writes that succeeded: {worked}"
    assert set(out.values()) <= {"EROFS", "EACCES", "ETXTBSY", "EPERM", "ENOENT"}, out


def test_no_host_environment_inside(
    runtime: Runtime, agentbox_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = "HOSTMARK" + secrets.token_hex(8)
    monkeypatch.setenv("AGENTBOX_SECURITY_MARKER", marker)
    sb = Sandbox.create(memory="128MiB", disk="32MiB", home=agentbox_home)
    try:
        r = sb.commands.run(
            "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; tr '\\0' ' ' < $p/cmdline;"
            " echo; done 2>/dev/null; env"
        )
        assert r.exit_code == 0
        for needle in (marker, str(agentbox_home), "PYTEST", "AGENTBOX_HOME", "VIRTUAL_ENV"):
            assert needle not in r.stdout, f"{needle!r} leaked into the sandbox"
        # The init is not dumpable, so from inside its environ is refused; read it from
        # the host (inside, an empty answer would pass without having read anything).
        inside = sb.commands.run("cat /proc/1/environ")
        assert inside.exit_code != 0 and "Permission denied" in inside.stderr, inside.stderr
        init_env = Path(f"/proc/{sb.info().init_pid}/environ").read_bytes().split(b"\0")
        assert {v.decode() for v in init_env if v} == {"PWD=/workspace"}, init_env
    finally:
        sb.kill()


def test_host_processes_are_invisible(shared_sandbox: Sandbox) -> None:
    probe = (
        "import json, os;"
        "st = {p: open(f'/proc/{p}/status').read() for p in os.listdir('/proc') if p.isdigit()};"
        "print(json.dumps({p: [l.split()[1:] for l in s.splitlines() if l.startswith('Uid:')][0]"
        " for p, s in st.items()}))"
    )
    uids: dict[str, list[str]] = run_python(shared_sandbox, probe)
    assert len(uids) < 20, f"too many processes visible inside: {sorted(uids)}"
    own = shared_sandbox.commands.run(["id", "-u"]).stdout.strip()  # 1000; gvisor: its host uid
    foreign = {p: u for p, u in uids.items() if u != [own] * 4}
    assert not foreign, f"processes of other users are visible inside: {foreign}"


def test_network_none_has_only_loopback(agentbox_home: Path) -> None:
    """Mode none (networked modes: test_network_egress.py)."""
    sandbox = Sandbox.create(memory="128MiB", disk="32MiB", network="none", home=agentbox_home)
    try:
        _only_loopback(sandbox)
    finally:
        sandbox.kill()


def _only_loopback(shared_sandbox: Sandbox) -> None:
    dev = shared_sandbox.commands.run("cat /proc/net/dev").stdout
    interfaces = {line.split(":")[0].strip() for line in dev.splitlines()[2:]}
    assert interfaces == {"lo"}, interfaces
    probe = (
        "import json, socket\nout = {}\n"
        "for host in ['1.1.1.1', '10.0.2.2', '169.254.169.254']:\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    out[host] = s.connect_ex((host, 80)); s.close()\n"
        "print(json.dumps(out))"
    )
    for host, code in run_python(shared_sandbox, probe).items():
        assert code != 0, f"connected to {host} from inside the sandbox"


def test_host_abstract_unix_socket_unreachable(shared_sandbox: Sandbox) -> None:
    name = "agentbox-sec-" + secrets.token_hex(6)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("\0" + name)
        server.listen(1)
        probe = (
            "import json, socket; s = socket.socket(socket.AF_UNIX);"
            f"print(json.dumps(s.connect_ex('\\0{name}')))"
        )
        code = run_python(shared_sandbox, probe)
        assert code != 0, "a host abstract unix socket accepted a connection from inside"
    finally:
        server.close()


def test_host_sysv_shared_memory_invisible(shared_sandbox: Sandbox) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5A000000 + secrets.randbelow(0xFFFFFF)
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT, world read/write
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        probe = (
            "import ctypes, json; libc = ctypes.CDLL(None, use_errno=True);"
            f"r = libc.shmget({key}, 0, 0); print(json.dumps([r, ctypes.get_errno()]))"
        )
        assert run_python(shared_sandbox, probe) == [-1, 2], "host shm segment reachable (ENOENT)"
        ipcs = shared_sandbox.commands.run("cat /proc/sysvipc/shm").stdout
        assert f"{key}" not in ipcs
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


# Every block device under /dev, at any depth (find -type b, in Python: see dir_entries).
_BLOCK_DEVICES = """
import json, os, stat
found = []
for root, dirs, files in os.walk("/dev"):
    for name in dirs + files:
        path = os.path.join(root, name)
        try:
            if stat.S_ISBLK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            pass
print(json.dumps(found))
"""


# A FUSE mount on /dev/fuse's fd: as the sandbox's user, then in a new user and mount
# namespace (where Linux would let an unprivileged user mount FUSE).
_FUSE_MOUNT = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/fuse", os.O_RDWR)
os.makedirs("/tmp/fuse-probe", exist_ok=True)
options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
def mount():
    r = libc.mount(b"probe", b"/tmp/fuse-probe", b"fuse", 0, options)
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
found = {"plain": mount()}
assert libc.unshare(0x10000000 | 0x00020000) == 0  # CLONE_NEWUSER | CLONE_NEWNS
found["userns"] = mount()
print(json.dumps(found))
"""


def test_dev_has_no_real_devices_and_sys_is_absent(shared_sandbox: Sandbox) -> None:
    entries = dir_entries(shared_sandbox, "/dev")
    assert isinstance(entries, list) and {"null", "zero", "urandom"} <= set(entries), entries
    allowed = {"core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
               "stdout", "tty", "urandom", "zero", "console"}  # fmt: skip
    gvisor = shared_sandbox.info().isolation == "gvisor"
    if gvisor:
        # The Sentry's own FUSE device (runsc makes it whatever its --fuse flag says): no
        # host device behind it, and no FUSE mount is allowed, in a user namespace or not.
        allowed.add("fuse")
        assert run_python(shared_sandbox, _FUSE_MOUNT) == {"plain": "EPERM", "userns": "EPERM"}
    assert set(entries) <= allowed, f"unexpected entries in /dev: {set(entries) - allowed}"
    blocks = run_python(shared_sandbox, _BLOCK_DEVICES)
    assert blocks == [], f"block devices in the sandbox: {blocks}"
    absent = ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/loop-control", "/sys"]
    if gvisor:
        # gVisor always mounts its own synthetic sysfs (read-only here): a few emulated
        # files (cpus, lo), no host device, firmware or block device.
        absent.remove("/sys")
        listed = shared_sandbox.commands.run("find /sys -mindepth 2").stdout.split()
        assert (
            listed
            and len(listed) < 40
            and not any(
                p.startswith(("/sys/block/", "/sys/firmware/", "/sys/bus/", "/sys/module/"))
                for p in listed
            )
        ), listed
        assert shared_sandbox.commands.run("touch /sys/x").exit_code != 0
    for path in absent:
        assert shared_sandbox.commands.run(["test", "-e", path]).exit_code != 0, path
    # /dev/core points at /proc/kcore, which must stay unreadable.
    assert shared_sandbox.commands.run("head -c1 /proc/kcore").exit_code != 0


@pytest.mark.parametrize(
    "path",
    [
        "/proc/sysrq-trigger",
        "/proc/sys/kernel/hostname",
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/vm/drop_caches",
        "/proc/sys/user/max_user_namespaces",
        "/proc/1/uid_map",
        "/proc/self/setgroups",
    ],
)
def test_host_wide_proc_files_cannot_be_written(shared_sandbox: Sandbox, path: str) -> None:
    before = subprocess.run(["cat", "/proc/sys/kernel/core_pattern"], capture_output=True).stdout
    r = shared_sandbox.commands.run(f"printf '%s\\n' 3 > {path}")
    assert r.exit_code != 0, f"{path} was writable from inside the sandbox"
    after = subprocess.run(["cat", "/proc/sys/kernel/core_pattern"], capture_output=True).stdout
    assert after == before


def test_no_host_filesystem_is_mounted_writable(shared_sandbox: Sandbox) -> None:
    """Writable mounts are the sandbox's own: its overlay, its loop disk, its tmpfs/proc/devpts,
    and the usual character devices; host filesystems (e.g. /usr) are read-only."""
    if shared_sandbox.info().isolation == "gvisor":
        pytest.skip(
            "gvisor: the mount table is the Sentry's own (one 9p root served by the Gofer "
            "from the sandbox's tree, which shows no per-mount flags); the read-only host "
            "/usr is a read-only bind on the host (test_executables_and_host_usr_cannot_be"
            "_written) and setuid is void under no_new_privs (tests/integration/"
            "test_gvisor_tier.py)"
        )
    devices = {f"/dev/{d}" for d in ("null", "zero", "full", "random", "urandom", "tty")}
    disk = shared_sandbox.commands.run("cat /proc/self/mountinfo").stdout.splitlines()
    for line in disk:
        fields = line.split()
        target, options = fields[4], fields[5].split(",")
        sep = fields.index("-")
        fstype, source = fields[sep + 1], fields[sep + 2]
        assert "nosuid" in options, f"mount without nosuid: {line}"
        if "ro" in options:
            continue
        own = fstype in ("overlay", "proc", "tmpfs", "devpts") or (
            fstype == "ext4" and source.startswith("/dev/loop")
        )
        assert own or (fstype == "devtmpfs" and target in devices), (
            f"a host filesystem is mounted writable inside: {line}"
        )
    assert any(" /.agentbox/init ro," in line for line in disk), "the launcher must be read-only"


def test_the_mount_table_names_no_host_path(shared_sandbox: Sandbox, agentbox_home: Path,
                                            runtime: Runtime) -> None:  # fmt: skip
    """/proc/self/mountinfo and /proc/mounts show no path of the host's agentbox home
    (where the overlay's layers and the launcher live), of the sandbox's own host-side
    directory, or of the launcher binary's install location."""
    record = runtime.get(shared_sandbox.id)
    host_dir = SandboxHost(runtime.home, record.id, record.slot).dir
    tables = shared_sandbox.commands.run(
        "cat /proc/self/mountinfo /proc/mounts /proc/1/mountinfo"
    ).stdout
    read = "9p" if record.isolation == "gvisor" else "lowerdir="  # the tables were read
    assert read in tables and ("/.agentbox/init" in tables or record.isolation == "gvisor")
    for leak in (str(agentbox_home), str(host_dir), str(runtime.paths.nsexec.parent),
                 "/sandboxes/", "/templates/"):  # fmt: skip
        assert leak not in tables, f"the sandbox's mount table shows {leak!r}:\n{tables}"
