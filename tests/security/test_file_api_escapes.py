"""Attack 5 — escaping through the host-side file API (``sb.files``) of a real sandbox.

The file API runs in the daemon, on the host, as root: every path trick the agent can
plant inside the sandbox is aimed at it. Covers: ``..`` in paths; absolute, relative and
``/proc`` magic-link symlinks planted by the shell and then read, written, edited,
listed, created under, moved into and removed through; hard links to host files; tar
uploads with ``..``, absolute names, link-then-write pairs, hard links out, device nodes
and setuid bits; tar downloads of symlinks; and a race that flips a directory with
symlinks to ``/`` and ``/tmp`` (atomic ``RENAME_EXCHANGE``) while the API writes and reads
through it. After each attack nothing was created or changed on the host. Also: the API
(a host thread) never blocks on objects the agent plants: fifos, and files on which the
agent holds a read or write lease while ignoring the lease-break signal.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from secprobe import HostSecret

from agentbox import Sandbox
from agentbox.errors import AgentboxError, FileNotFound
from agentbox.runtime.runtime import Runtime
from hostres import wait_for


@pytest.fixture(scope="module", params=["namespaces", "gvisor"])
def sb(request: pytest.FixtureRequest, runtime: Runtime, agentbox_home: Path) -> Iterator[Sandbox]:
    """Both isolation tiers: on gvisor the files API works on the host-side tree runsc
    serves, not on /proc/PID/root (runtime/gvisor_host.py)."""
    box = Sandbox.create(memory="256MiB", disk="128MiB", pids=128, isolation=request.param,
                         home=agentbox_home)  # fmt: skip
    try:
        yield box
    finally:
        box.kill()


@pytest.fixture
def name() -> Iterator[str]:
    """A fresh file name; afterwards it must exist nowhere on the host."""
    fresh = "agentbox-escape-" + secrets.token_hex(6)
    yield fresh
    found = host_copies(fresh)
    for path in found:
        path.unlink(missing_ok=True)
    assert not found, f"the attack created files on the host: {found}"


def host_copies(name: str) -> list[Path]:
    """Where a write that escaped the sandbox root would land on the host."""
    candidates = [Path("/"), Path("/tmp"), Path("/var/tmp"), Path("/root"), Path("/etc"),
                  Path.cwd(), Path(os.environ.get("AGENTBOX_HOME", "/nonexistent")),
                  Path("/workspace"), Path("/home/user")]  # fmt: skip
    return [d / name for d in candidates if (d / name).exists() or (d / name).is_symlink()]


def sh(sb: Sandbox, command: str) -> str:
    r = sb.commands.run(command)
    assert r.exit_code == 0, f"{command}: {r.stderr}"
    return r.stdout


def test_dotdot_paths_stay_in_root(sb: Sandbox, name: str) -> None:
    for path in (f"/workspace/../../../../../../tmp/{name}", f"../../../../../../../tmp/{name}"):
        sb.files.write(path, b"inside")
        assert sh(sb, f"cat /tmp/{name}") == "inside", "the write should land in the sandbox's /tmp"
    assert sb.files.read("/workspace/../../../../etc/passwd") == sh(sb, "cat /etc/passwd")
    assert sb.files.read("../../../../../../../etc/hostname") == sh(sb, "cat /etc/hostname")
    names = {i.name for i in sb.files.list("/workspace/../../../..")}
    assert ".agentbox" in names and "sandboxes" not in names and "disk.img" not in names


@pytest.mark.parametrize("kind", ["absolute", "relative", "proc-1-root", "proc-self-root"])
def test_planted_symlink_cannot_read_host_file(
    sb: Sandbox, host_secret: HostSecret, kind: str
) -> None:
    target = {
        "absolute": str(host_secret.file),
        "relative": "../../../../../../.." + str(host_secret.file),
        "proc-1-root": "/proc/1/root" + str(host_secret.file),
        "proc-self-root": "/proc/self/root" + str(host_secret.file),
    }[kind]
    link = f"/workspace/link-{kind}"
    sh(sb, f"ln -sfn '{target}' {link}")
    for path in (link, f"/workspace/../../..{link}"):
        with pytest.raises(AgentboxError) as err:
            data = sb.files.read(path)
            assert host_secret.value not in data, f"read the host secret through {target}"
        assert host_secret.value not in str(err.value.to_dict())
    with pytest.raises(AgentboxError):
        sb.files.edit(link, host_secret.value, "pwned")
    assert host_secret.file.read_text().strip() == host_secret.value


def test_symlink_to_shadow_reads_the_sandboxes_not_the_hosts(sb: Sandbox) -> None:
    sh(sb, "ln -sfn /etc/shadow /workspace/shadow; ln -sfn /etc/passwd /workspace/passwd")
    with pytest.raises(FileNotFound):
        sb.files.read("/workspace/shadow")
    assert sb.files.read("/workspace/passwd") == sh(sb, "cat /etc/passwd")


@pytest.mark.parametrize(
    "target",
    [
        "/tmp",
        "../../../../../../tmp",
        "/proc/1/root/tmp",
        "/proc/self/root/tmp",
        "/proc/1/cwd/../tmp",
    ],
)
def test_planted_symlink_cannot_redirect_writes_to_host(
    sb: Sandbox, name: str, target: str
) -> None:
    link = "/workspace/dirlink"
    sh(sb, f"rm -rf {link}; ln -sfn '{target}' {link}")
    file_link = "/workspace/filelink"
    sh(sb, f"rm -f {file_link}; ln -sfn '{target}/{name}' {file_link}")
    operations: dict[str, Callable[[], object]] = {
        "write via dir": lambda: sb.files.write(f"{link}/{name}", b"x"),
        "write via file": lambda: sb.files.write(file_link, b"x"),
        "append": lambda: sb.files.write(f"{link}/{name}", b"x", mode="append"),
        "mkdir": lambda: sb.files.mkdir(f"{link}/{name}-dir/sub"),
        "move": lambda: sb.files.move("/workspace/src", f"{link}/{name}-moved"),
        "tar": lambda: sb.files.upload_tar(f"{link}/{name}-tar", _tar([("f", b"x")])),
    }
    sh(sb, "echo src > /workspace/src")
    for what, op in operations.items():
        try:
            op()
        except AgentboxError:
            continue  # refused (e.g. a magic link): fine
        assert not [p for p in host_copies(name) if p.exists()], f"{what} via {target} escaped"
    for suffix in ("", "-dir", "-moved", "-tar"):
        assert not Path(f"/tmp/{name}{suffix}").exists(), f"host /tmp/{name}{suffix} was created"
    sh(sb, f"rm -rf /tmp/{name}* /workspace/src")


def test_remove_through_symlinks_never_touches_host(sb: Sandbox, host_secret: HostSecret) -> None:
    sh(
        sb,
        f"mkdir -p /workspace/rr; ln -sfn / /workspace/rr/root; "
        f"ln -sfn {host_secret.dir} /workspace/rr/secret; ln -sfn /tmp /workspace/tmplink",
    )
    with pytest.raises(FileNotFound):
        sb.files.remove(f"/workspace/tmplink/{host_secret.tmp_file.name}")
    with pytest.raises(AgentboxError):
        sb.files.remove(f"/workspace/rr/secret/{host_secret.file.name}")
    sb.files.remove("/workspace/rr", recursive=True)
    assert host_secret.file.exists() and host_secret.tmp_file.exists()
    assert sh(sb, "test -e /etc/passwd && test -d /workspace && echo ok").strip() == "ok"
    assert Path("/usr/bin/true").exists()


def test_hard_link_to_host_file_impossible(sb: Sandbox, host_secret: HostSecret) -> None:
    r = sb.commands.run(f"ln {host_secret.file} /workspace/hl-secret")
    assert r.exit_code != 0
    sb.commands.run("ln /etc/passwd /workspace/hl-passwd")  # may fail (EXDEV / protected)
    if sb.files.exists("/workspace/hl-passwd"):
        assert sb.files.read("/workspace/hl-passwd") == sh(sb, "cat /etc/passwd")
    assert host_secret.file.stat().st_nlink == 1


Entry = tuple[str, bytes] | tarfile.TarInfo


def _tar(entries: list[Entry]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])
                info.size = len(entry[1])
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(entry[1]))
    buf.seek(0)
    return buf


def _link(name: str, target: str, *, hard: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


def _special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.devmajor, info.devminor = 1, 3
    return info


@pytest.mark.parametrize(
    "attack",
    [
        "dotdot", "deep-dotdot", "absolute", "symlink-then-file-host-dir",
        "symlink-then-file-tmp", "relative-symlink-then-file", "magic-symlink-then-file",
        "hardlink-dotdot", "hardlink-absolute", "hardlink-via-symlink-dir",
    ],
)  # fmt: skip
def test_tar_upload_cannot_escape(
    sb: Sandbox, name: str, host_secret: HostSecret, attack: str
) -> None:
    attacks: dict[str, list[Entry]] = {
        "dotdot": [(f"../{name}", b"x")],
        "deep-dotdot": [(f"a/b/../../../../../../../tmp/{name}", b"x")],
        "absolute": [(f"/tmp/{name}", b"x")],
        "symlink-then-file-host-dir": [_link("s", str(host_secret.dir)), (f"s/{name}", b"x")],
        "symlink-then-file-tmp": [_link("t", "/tmp"), (f"t/{name}", b"x")],
        "relative-symlink-then-file": [_link("u", "../../../../../../../tmp"), (f"u/{name}", b"x")],
        "magic-symlink-then-file": [_link("m", "/proc/1/root/tmp"), (f"m/{name}", b"x")],
        "hardlink-dotdot": [_link(name, f"../../../../..{host_secret.file}", hard=True)],
        "hardlink-absolute": [_link(name, str(host_secret.file), hard=True)],
        "hardlink-via-symlink-dir": [
            _link("hs", str(host_secret.dir)),
            _link(name, "hs/secret.txt", hard=True),
        ],
    }
    entries = attacks[attack]
    dest = f"/workspace/up-{attack}"
    with contextlib.suppress(AgentboxError):  # refusing the archive (or an entry) is correct
        sb.files.upload_tar(dest, _tar(entries))
    assert not (host_secret.dir / name).exists()
    assert not Path(f"/tmp/{name}").exists()
    assert host_secret.file.stat().st_nlink == 1, "a hard link to the host file was made"
    if sb.files.exists(f"{dest}/{name}"):
        assert host_secret.value not in sb.files.read(f"{dest}/{name}")
    sh(sb, f"rm -rf /tmp/{name}")


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_tar_upload_refuses_special_files(sb: Sandbox, kind: bytes) -> None:
    with pytest.raises(AgentboxError):
        sb.files.upload_tar("/workspace/special", _tar([_special("dev", kind)]))
    assert not sb.files.exists("/workspace/special/dev")


def test_tar_upload_strips_setuid(sb: Sandbox) -> None:
    info = tarfile.TarInfo("suid")
    payload = b"#!/bin/sh\nid -u\n"
    info.size, info.mode = len(payload), 0o6755
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(payload))
    buf.seek(0)
    sb.files.upload_tar("/workspace/suid-dir", buf)
    assert sb.files.stat("/workspace/suid-dir/suid").mode & 0o7000 == 0
    # python's stat, not coreutils' (statx flags the gvisor tier's runsc refuses)
    mode = int(
        sh(sb, "python3 -c 'import os; print(oct(os.stat(\"/workspace/suid-dir/suid\").st_mode))'"),
        8,
    )
    assert mode & 0o7000 == 0


def test_tar_download_does_not_follow_symlinks(sb: Sandbox, host_secret: HostSecret) -> None:
    sh(
        sb,
        f"mkdir -p /workspace/dl && ln -sfn / /workspace/dl/root && "
        f"ln -sfn {host_secret.file} /workspace/dl/secret && echo hi > /workspace/dl/f",
    )
    # Asked for everything, symlinks are stored as symlinks, never followed ...
    buf = io.BytesIO()
    sb.files.download_tar("/workspace/dl", buf, include_unsafe=True)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"dl", "dl/root", "dl/secret", "dl/f"}, sorted(members)
        assert members["dl/root"].issym() and members["dl/secret"].issym()
    assert host_secret.value.encode() not in buf.getvalue()
    # ... and by default, links out of the tree are withheld (safe export).
    safe, withheld = io.BytesIO(), []
    sb.files.download_tar("/workspace/dl", safe, withheld=withheld)
    assert sorted(p for p, _ in withheld) == ["dl/root", "dl/secret"]
    assert host_secret.value.encode() not in safe.getvalue()


FLIPPER = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace/race")
os.mkdir("d"); os.symlink("/tmp", "e"); os.symlink("/", "f")
print("ready", flush=True)
n, end = 0, time.monotonic() + 60
while time.monotonic() < end and not os.path.exists("stop"):
    for other in (b"e", b"f"):  # d: dir -> link to /tmp -> link to / -> dir ...
        libc.syscall(316, -100, b"d", -100, other, 2)  # renameat2(RENAME_EXCHANGE)
    n += 1
print("flips", n, flush=True)
"""


def test_race_flipping_dir_and_symlink_cannot_redirect(
    sb: Sandbox, name: str, host_secret: HostSecret
) -> None:
    """While ``/workspace/race/d`` flips between a directory, a symlink to /tmp and one to /,
    the API writes ``d/NAME`` and reads ``d/var/tmp/SECRET``: resolved on the host, those
    would create host /tmp/NAME (world-writable) or read the world-readable host secret."""
    sh(sb, "rm -rf /workspace/race; mkdir /workspace/race")
    flipper = sb.commands.start(["python3", "-c", FLIPPER])
    wait_for(lambda: "ready" in flipper.read().text, 15, "the flipper to start")
    secret_rel = str(host_secret.file).lstrip("/")
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline:
            for op in ("write", "read"):
                try:
                    if op == "write":
                        sb.files.write(f"/workspace/race/d/{name}", b"raced")
                    else:
                        data = sb.files.read(f"/workspace/race/d/{secret_rel}")
                        assert host_secret.value not in data, "read the host secret in the race"
                    key = f"{op} ok"
                except AgentboxError as e:
                    key = f"{op} {type(e).__name__}"
                outcomes[key] = outcomes.get(key, 0) + 1
    finally:
        sh(sb, "touch /workspace/race/stop")
        flipper.wait(timeout=30)
    assert "flips" in flipper.read().text, flipper.read().text
    assert not Path(f"/tmp/{name}").exists(), f"race escaped to the host: {outcomes}"
    assert not Path(f"/{name}").exists(), f"race escaped to the host: {outcomes}"
    assert outcomes.get("write ok", 0) > 0, f"the race never let a write through: {outcomes}"
    landed = sh(  # `test -e`, not ls: coreutils' statx flags fail on the gvisor tier's runsc
        sb,
        f"for f in /workspace/race/*/{name} /tmp/{name} /workspace/race/{name}; "
        'do test -e "$f" && echo "$f"; done; true',
    )
    assert landed.strip(), "writes that succeeded must be somewhere inside the sandbox"
    sh(sb, f"rm -rf /workspace/race /tmp/{name}")


LEASE_HOLDER = r"""
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)  # never give the lease up voluntarily
path, kind = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY if kind == "read" else os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK if kind == "read" else fcntl.F_WRLCK)
print("leased", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("lease", ["read", "write"])
def test_file_api_never_blocks_on_agent_leases_or_fifos(sb: Sandbox, lease: str) -> None:
    path = f"/workspace/leased-{lease}"
    sh(sb, f"echo hello > {path}; rm -f /workspace/fifo; mkfifo /workspace/fifo")
    holder = sb.commands.start(["python3", "-c", LEASE_HOLDER, path, lease])
    try:
        if sb.info().isolation == "gvisor":
            # gVisor's Sentry refuses F_SETLEASE (EINVAL): no agent lease reaches a host
            # file. The FIFOs below must still not block the API.
            assert holder.wait(timeout=30).exit_code != 0
            assert "Invalid argument" in holder.read("stderr").text
        else:
            wait_for(lambda: "leased" in holder.read().text, 15, "the lease to be taken")
        calls: dict[str, Callable[[], object]] = {
            "read": lambda: sb.files.read(path),
            "write": lambda: sb.files.write(path, b"x"),
            "append": lambda: sb.files.write(path, b"x", mode="append"),
            "edit": lambda: sb.files.edit(path, "hello", "bye"),
            "download": lambda: sb.files.download_tar(path, io.BytesIO()),
            "upload-over": lambda: sb.files.upload_tar(
                "/workspace", _tar([(path.rsplit("/", 1)[1], b"y")])
            ),
            "fifo-read": lambda: sb.files.read("/workspace/fifo"),
            "fifo-write": lambda: sb.files.write("/workspace/fifo", b"x"),
            "fifo-download": lambda: sb.files.download_tar("/workspace/fifo", io.BytesIO()),
        }
        for what, call in calls.items():
            started = time.monotonic()
            with contextlib.suppress(AgentboxError):
                call()
            took = time.monotonic() - started
            assert took < 5, f"{what} blocked {took:.1f}s on an agent-held {lease} lease / fifo"
    finally:
        holder.kill()
