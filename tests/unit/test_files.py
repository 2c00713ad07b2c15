"""SandboxFiles: functional behaviour, and attacks on a fake sandbox root.

The fake sandbox is a directory tree under a world-traversable temp dir, next to a "host"
directory holding a secret that the sandbox user (SANDBOX_UID) *could* write if a path
ever resolved outside the root: so every attack test fails if its protection is removed
(``test_control_*`` proves the secret is reachable without the confinement).
"""

from __future__ import annotations

import errno
import functools
import io
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import pytest

from agentbox.errors import (
    AgentboxError,
    Conflict,
    EditMismatch,
    FileExists,
    FileNotFound,
    InvalidRequest,
    LimitExceeded,
    PathEscape,
    PermissionDenied,
    SandboxNotRunning,
)
from agentbox.isolation import syscalls
from agentbox.runtime.files import FileInfo, SandboxFiles, sandbox_credentials

SANDBOX_UID = 100777
SANDBOX_GID = 100778
EXTRA_GID = 100779  # a group the daemon is in and the sandbox user is not
SECRET = b"TOP SECRET host data\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, setfsuid)")


@dataclass
class Env:
    base: Path  # host directory holding both the sandbox root and the host's data
    root: Path  # the sandbox's "/"
    host_dir: Path  # outside the root; writable by the sandbox uid (worst case)
    secret: Path
    files: SandboxFiles

    @property
    def ws(self) -> Path:
        return self.root / "workspace"


def _own(path: Path, mode: int, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)
    if not path.is_symlink():
        path.chmod(mode)


class _Guarded:
    """SandboxFiles with an allow-all guard on every call that takes one, so that every
    test also runs through the walk that names paths for the gateway's file policy: it
    must resolve (and stay inside the root) exactly as the kernel does. Records each
    judged path: each must be a canonical sandbox path."""

    def __init__(self, files: SandboxFiles) -> None:
        self._files = files
        self.judged: list[tuple[str, str]] = []

    def _guard(self, path: str, access: str) -> None:
        assert path.startswith("/") and posixpath.normpath(path) == path, path
        self.judged.append((path, access))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._files, name)
        if name in GUARDED_CALLS:
            return functools.partial(attr, guard=self._guard)
        return attr


GUARDED_CALLS = ("read", "read_sized", "write", "edit", "list", "stat", "move", "remove", "mkdir",
                 "upload_tar", "download_tar")  # fmt: skip


@pytest.fixture(params=["kernel", "guarded"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    # Not tmp_path: pytest's base dir is 0700 root, which would stop an escaped path by
    # plain DAC and hide a missing protection. This one is traversable by the sandbox uid.
    base = Path(tempfile.mkdtemp(prefix="agentbox-files-"))
    try:
        base.chmod(0o755)
        root = base / "root"
        for d in ("", "workspace", "etc", "tmp"):
            (root / d).mkdir(exist_ok=True)
        root.chmod(0o755)  # root-owned like a real rootfs
        _own(root / "workspace", 0o755)
        (root / "etc").chmod(0o755)
        (root / "tmp").chmod(0o1777)
        (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
        (root / "etc" / "passwd").chmod(0o644)
        (root / "etc" / "shadow").write_text("root:!:1::::::\n")
        (root / "etc" / "shadow").chmod(0o600)
        host_dir = base / "host"
        host_dir.mkdir()
        _own(host_dir, 0o777)
        secret = host_dir / "secret.txt"
        secret.write_bytes(SECRET)
        _own(secret, 0o666)
        files = SandboxFiles(str(root), SANDBOX_UID, SANDBOX_GID)
        if request.param == "guarded":
            files = cast(SandboxFiles, _Guarded(files))
        yield Env(base, root, host_dir, secret, files)
    finally:
        shutil.rmtree(base)


def _outside_root(env: Env) -> dict[str, tuple[int, bytes | None]]:
    """Every entry under base except the sandbox root: (mode, content of files)."""
    seen: dict[str, tuple[int, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(env.base):
        if Path(dirpath) == env.base:
            dirnames.remove("root")
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            seen[str(p)] = (st.st_mode, p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return seen


def _assert_host_untouched(env: Env) -> None:
    assert env.secret.read_bytes() == SECRET
    assert env.secret.stat().st_nlink == 1
    assert sorted(p.name for p in env.host_dir.iterdir()) == ["secret.txt"]


_CRED_FIELDS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _status() -> dict[str, str]:
    """This thread's credentials as the kernel reports them."""
    lines = Path("/proc/thread-self/status").read_text().splitlines()
    fields = {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return {k: fields[k] for k in _CRED_FIELDS}


@pytest.fixture
def extra_group() -> Iterator[int]:
    """Put the test process (every thread) in EXTRA_GID, like a daemon in group 0."""
    old = os.getgroups()
    os.setgroups([EXTRA_GID])
    try:
        yield EXTRA_GID
    finally:
        os.setgroups(old)


def _tar(*entries: tuple[str, bytes, bytes | str, int]) -> io.BytesIO:
    """A tar of (name, type, data or linkname, mode) entries, written as given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload, mode in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mode = mode
            if isinstance(payload, str):
                info.linkname = payload
                tar.addfile(info)
            else:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    buf.seek(0)
    return buf


# -- functional ---------------------------------------------------------------------------


def test_write_read_roundtrip_owned_by_sandbox_user(env: Env) -> None:
    info = env.files.write("/workspace/a.txt", b"hello \xff\xfe world")  # not UTF-8: fine
    assert (
        info == FileInfo("/workspace/a.txt", "a.txt", "file", 14, 0o644, info.mtime, None)
        and info.to_dict()["type"] == "file"
    )
    assert env.files.read("/workspace/a.txt") == b"hello \xff\xfe world"
    st = (env.ws / "a.txt").stat()
    assert (st.st_uid, st.st_gid) == (SANDBOX_UID, SANDBOX_GID)


def test_relative_paths_are_relative_to_cwd(env: Env) -> None:
    env.files.write("rel/b.txt", b"x")
    assert (env.ws / "rel" / "b.txt").read_bytes() == b"x"
    other = SandboxFiles(str(env.root), SANDBOX_UID, SANDBOX_GID, cwd="/tmp")
    other.write("c.txt", b"y")
    assert (env.root / "tmp" / "c.txt").read_bytes() == b"y"


def test_read_offset_and_length(env: Env) -> None:
    env.files.write("/workspace/n.txt", b"0123456789")
    assert env.files.read("/workspace/n.txt", offset=3, length=4) == b"3456"
    assert env.files.read("/workspace/n.txt", offset=8) == b"89"
    assert env.files.read("/workspace/n.txt", offset=20) == b""
    with pytest.raises(InvalidRequest):
        env.files.read("/workspace/n.txt", offset=-1)


def test_read_is_capped_and_read_stream_is_not(env: Env) -> None:
    small = SandboxFiles(str(env.root), SANDBOX_UID, SANDBOX_GID, max_read_bytes=1000)
    small.write("/workspace/big", b"x" * 2500)
    with pytest.raises(LimitExceeded, match="read_stream"):
        small.read("/workspace/big")
    with pytest.raises(LimitExceeded):
        small.read("/workspace/big", length=1001)
    assert small.read("/workspace/big", offset=2000, length=1000) == b"x" * 500
    assert [len(c) for c in small.read_stream("/workspace/big", chunk_size=1000)] == [
        1000,
        1000,
        500,
    ]


def test_read_stream_chunks_and_early_close(env: Env) -> None:
    data = os.urandom(3 * (1 << 20) + 5)
    (env.ws / "blob").write_bytes(data)
    assert b"".join(env.files.read_stream("/workspace/blob")) == data
    stream = env.files.read_stream("/workspace/blob", chunk_size=1 << 20)
    assert len(next(stream)) == 1 << 20
    assert isinstance(stream, Generator)
    stream.close()
    # Errors come at the call, not at the first next().
    with pytest.raises(FileNotFound):
        env.files.read_stream("/workspace/missing")


def test_write_iterable_streams_chunk_by_chunk(env: Env) -> None:
    target = env.ws / "streamed"
    sizes_seen: list[int] = []

    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            yield b"z" * (1 << 20)
            sizes_seen.append(target.stat().st_size)  # already on disk: nothing buffered

    info = env.files.write("/workspace/streamed", chunks())
    assert sizes_seen == [1 << 20, 2 << 20, 3 << 20, 4 << 20]
    assert info.size == 4 << 20


def test_write_modes_and_perms(env: Env) -> None:
    f = env.files
    f.write("/workspace/m.txt", b"one")
    f.write("/workspace/m.txt", b"two", mode="append")
    assert f.read("/workspace/m.txt") == b"onetwo"
    f.write("/workspace/m.txt", b"3")
    assert f.read("/workspace/m.txt") == b"3"
    with pytest.raises(FileExists, match=r"/workspace/m\.txt"):
        f.write("/workspace/m.txt", b"x", mode="create")
    assert f.write("/workspace/new.txt", b"x", mode="create").mode == 0o644
    old_umask = os.umask(0o077)
    try:  # perms are exact whatever the daemon's umask; existing files keep their mode
        assert f.write("/workspace/p.sh", b"#!/bin/sh\n", perms=0o755).mode == 0o755
        assert f.write("/workspace/p.sh", b"#!/bin/sh\n", perms=0o600).mode == 0o755
        assert f.write("/workspace/ap.log", b"a", mode="append", perms=0o640).mode == 0o640
    finally:
        os.umask(old_umask)
    with pytest.raises(InvalidRequest):
        f.write("/workspace/x", b"", perms=0o4755)
    with pytest.raises(InvalidRequest):
        f.write("/workspace/x", b"", mode="truncate")  # type: ignore[arg-type]


def test_write_make_parents(env: Env) -> None:
    with pytest.raises(FileNotFound, match=r"files\.list"):
        env.files.write("/workspace/a/b/c.txt", b"x", make_parents=False)
    env.files.write("/workspace/a/b/c.txt", b"x")
    st = (env.ws / "a" / "b").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (SANDBOX_UID, 0o755)
    env.files.write("/workspace/file", b"x")
    with pytest.raises(InvalidRequest, match="not a directory"):
        env.files.write("/workspace/file/sub.txt", b"x")


def test_write_rejects_non_bytes_and_non_regular(env: Env) -> None:
    with pytest.raises(InvalidRequest, match="encode"):
        env.files.write("/workspace/s", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="bytes chunks"):
        env.files.write("/workspace/s", [b"ok", "no"])  # type: ignore[list-item]
    with pytest.raises(InvalidRequest, match="directory"):
        env.files.write("/workspace", b"x")
    os.mkfifo(env.ws / "fifo")
    _own(env.ws / "fifo", 0o666)
    with pytest.raises(InvalidRequest):  # must not block waiting for a reader
        env.files.write("/workspace/fifo", b"x")
    with pytest.raises(InvalidRequest, match="regular file"):
        env.files.read("/workspace/fifo")


def test_write_follows_symlink_inside_root(env: Env) -> None:
    # Documented choice: a final symlink is followed like the shell's `>`, inside the root.
    env.files.write("/workspace/real.txt", b"old")
    (env.ws / "link").symlink_to("/workspace/real.txt")
    env.files.write("/workspace/link", b"new")
    assert (env.ws / "real.txt").read_bytes() == b"new"
    assert (env.ws / "link").is_symlink()


def test_list_depth_types_and_order(env: Env) -> None:
    f = env.files
    f.write("/workspace/p/b.txt", b"bb")
    f.write("/workspace/p/a/deep/x.txt", b"x")
    (env.ws / "p" / "ln").symlink_to("b.txt")
    top = f.list("/workspace/p")
    assert [(i.name, i.type) for i in top] == [("a", "dir"), ("b.txt", "file"), ("ln", "symlink")]
    assert top[2].symlink_target == "b.txt" and top[1].size == 2
    assert top[1].path == "/workspace/p/b.txt"
    assert [i.path for i in f.list("/workspace/p", depth=2)] == [
        "/workspace/p/a",
        "/workspace/p/a/deep",
        "/workspace/p/b.txt",
        "/workspace/p/ln",
    ]
    assert "/workspace/p/a/deep/x.txt" in [i.path for i in f.list("p", depth=3)]
    with pytest.raises(InvalidRequest):
        f.list("/workspace/p", depth=0)
    with pytest.raises(InvalidRequest, match="not a directory"):
        f.list("/workspace/p/b.txt")


def test_stat_and_exists(env: Env) -> None:
    env.files.write("/workspace/s.txt", b"abc")
    (env.ws / "dangling").symlink_to("/nowhere")
    info = env.files.stat("/workspace/s.txt")
    assert (info.type, info.size, info.name) == ("file", 3, "s.txt")
    link = env.files.stat("/workspace/dangling")
    assert (link.type, link.symlink_target) == ("symlink", "/nowhere")
    assert env.files.stat("/").type == "dir"
    assert env.files.exists("/workspace/dangling")
    assert not env.files.exists("/workspace/nope")
    assert not env.files.exists("/workspace/s.txt/child")
    with pytest.raises(FileNotFound):
        env.files.stat("/workspace/nope")


def test_mkdir(env: Env) -> None:
    info = env.files.mkdir("/workspace/x/y/z")
    assert info.type == "dir" and (env.ws / "x" / "y" / "z").is_dir()
    env.files.mkdir("/workspace/x/y/z")  # exist_ok by default
    with pytest.raises(FileExists):
        env.files.mkdir("/workspace/x/y/z", exist_ok=False)
    with pytest.raises(FileNotFound):
        env.files.mkdir("/workspace/q/r", parents=False)
    env.files.write("/workspace/f", b"")
    with pytest.raises(FileExists):
        env.files.mkdir("/workspace/f")


def test_move(env: Env) -> None:
    f = env.files
    f.write("/workspace/a", b"A")
    f.write("/workspace/b", b"B")
    with pytest.raises(FileExists, match="/workspace/b"):
        f.move("/workspace/a", "/workspace/b")
    assert f.read("/workspace/b") == b"B"
    assert f.move("/workspace/a", "/workspace/b", overwrite=True).size == 1
    assert f.read("/workspace/b") == b"A" and not f.exists("/workspace/a")
    with pytest.raises(FileNotFound, match="cannot move /workspace/a"):
        f.move("/workspace/a", "/workspace/c")
    with pytest.raises(FileNotFound, match="/workspace/nodir"):
        f.move("/workspace/b", "/workspace/nodir/c")
    (env.ws / "ln").symlink_to("/workspace/b")
    assert f.move("/workspace/ln", "/workspace/ln2").type == "symlink"  # the link itself
    f.mkdir("/workspace/d")
    with pytest.raises(InvalidRequest):
        f.move("/workspace/d", "/workspace/d/inside")
    with pytest.raises(InvalidRequest):
        f.move("/", "/workspace/root")


def test_remove(env: Env) -> None:
    f = env.files
    f.write("/workspace/t/a/b/c.txt", b"x")
    f.write("/workspace/t/top.txt", b"x")
    f.remove("/workspace/t/top.txt")
    with pytest.raises(Conflict, match="recursive=True"):
        f.remove("/workspace/t")
    f.remove("/workspace/t", recursive=True)
    assert not (env.ws / "t").exists()
    f.mkdir("/workspace/empty")
    f.remove("/workspace/empty")
    with pytest.raises(FileNotFound):
        f.remove("/workspace/empty")
    with pytest.raises(InvalidRequest):
        f.remove("/", recursive=True)


def test_edit_counts(env: Env) -> None:
    f = env.files
    f.write("/workspace/e.py", b"x = 1\ny = 1\nz = 2\n")
    assert f.edit("/workspace/e.py", "z = 2", "z = 3") == 1
    with pytest.raises(EditMismatch, match=r"expected 1 .* found 2") as exc:
        f.edit("/workspace/e.py", "= 1", "= 0")
    hint = {"action": "fs_edit_count", "args": {"count": 2}, "text": "to replace every one, {call}"}
    assert exc.value.details == {"path": "/workspace/e.py", "expected": 1, "found": 2, "hint": hint}
    assert "pass `count=2` to `sb.files.edit`" in exc.value.message  # the SDK's spelling
    assert f.read("/workspace/e.py") == b"x = 1\ny = 1\nz = 3\n"  # untouched on mismatch
    with pytest.raises(EditMismatch, match="found 0"):
        f.edit("/workspace/e.py", "absent", "x")
    assert f.edit("/workspace/e.py", "= 1", "= 10", count=2) == 2
    assert f.edit("/workspace/e.py", "= 10", "= é", count=None) == 2
    assert f.edit("/workspace/e.py", "absent", "x", count=None) == 0
    assert f.read("/workspace/e.py").decode() == "x = é\ny = é\nz = 3\n"
    assert f.edit("/workspace/e.py", "x = é\ny = é\n", "") == 1  # shrinking truncates
    assert f.read("/workspace/e.py") == b"z = 3\n"
    with pytest.raises(InvalidRequest):
        f.edit("/workspace/e.py", "", "x")
    with pytest.raises(InvalidRequest):
        f.edit("/workspace/e.py", "z", "y", count=0)


def test_edit_refuses_non_utf8(env: Env) -> None:
    env.files.write("/workspace/bin", b"abc\xffdef")
    with pytest.raises(InvalidRequest, match="not UTF-8"):
        env.files.edit("/workspace/bin", "abc", "x")
    assert env.files.read("/workspace/bin") == b"abc\xffdef"


def test_tar_round_trip_with_symlinks(env: Env) -> None:
    f = env.files
    f.write("/workspace/proj/src/main.py", b"print(1)\n")
    f.write("/workspace/proj/run.sh", b"#!/bin/sh\n", perms=0o755)
    f.write("/workspace/proj/bin.dat", bytes(range(256)) * 100)
    f.mkdir("/workspace/proj/empty")
    (env.ws / "proj" / "rel").symlink_to("src/main.py")
    (env.ws / "proj" / "abs").symlink_to("/etc/passwd")
    buf = io.BytesIO()
    assert f.download_tar("/workspace/proj", buf, include_unsafe=True) == 8  # abs: out of tree
    buf.seek(0)
    assert f.upload_tar("/workspace/restore", buf) == 8
    out = env.ws / "restore" / "proj"
    assert (out / "src" / "main.py").read_bytes() == b"print(1)\n"
    assert (out / "bin.dat").read_bytes() == bytes(range(256)) * 100
    assert stat.S_IMODE((out / "run.sh").stat().st_mode) == 0o755
    assert (out / "empty").is_dir()
    assert os.readlink(out / "rel") == "src/main.py"
    assert os.readlink(out / "abs") == "/etc/passwd"
    assert all(p.lstat().st_uid == SANDBOX_UID for p in out.rglob("*"))
    one = io.BytesIO()
    assert f.download_tar("/workspace/proj/run.sh", one) == 1
    one.seek(0)
    with tarfile.open(fileobj=one) as tar:
        assert tar.getnames() == ["run.sh"]


def test_download_tar_streams_in_small_writes(env: Env) -> None:
    (env.ws / "big").write_bytes(os.urandom(4 << 20))

    class Recorder:
        def __init__(self) -> None:
            self.writes: list[int] = []

        def write(self, data: bytes) -> int:
            self.writes.append(len(data))
            return len(data)

    rec = Recorder()
    env.files.download_tar("/workspace/big", cast(IO[bytes], rec))
    assert sum(rec.writes) > 4 << 20
    assert max(rec.writes) <= 64 << 10  # never the whole archive in one buffer


def test_upload_tar_rejects_garbage(env: Env) -> None:
    with pytest.raises(InvalidRequest, match="tar"):
        env.files.upload_tar("/workspace/x", io.BytesIO(b"not a tar" * 100))


def test_missing_root_is_sandbox_not_running(env: Env) -> None:
    gone = SandboxFiles(str(env.base / "nope"), SANDBOX_UID, SANDBOX_GID)
    with pytest.raises(SandboxNotRunning) as exc:
        gone.read("/workspace/a")
    assert str(env.base) not in str(exc.value)


# -- security: paths ----------------------------------------------------------------------


def test_control_secret_reachable_without_root_confinement(env: Env) -> None:
    # With the host's "/" as root the sandbox user reaches the secret: the attacks below
    # are stopped by the confinement, not by permissions of the test's directories.
    unconfined = SandboxFiles("/", SANDBOX_UID, SANDBOX_GID)
    assert unconfined.read(str(env.secret)) == SECRET


def test_dotdot_paths_stay_in_root(env: Env) -> None:
    f = env.files
    climb = "/".join([".."] * 12) + str(env.secret)
    with pytest.raises(FileNotFound):
        f.read(climb)
    with pytest.raises(FileNotFound):
        f.read("/workspace/../../../host/secret.txt")
    with pytest.raises(PermissionDenied, match="/host"):  # <root>/host: "/" is root's
        f.write("../../../../host/secret.txt", b"pwned")
    f.write("../../../../../workspace/dd.txt", b"in root")
    assert (env.ws / "dd.txt").read_bytes() == b"in root"
    _assert_host_untouched(env)


def test_absolute_symlink_to_host_file(env: Env) -> None:
    (env.ws / "passwd").symlink_to(env.secret)  # like a link to /etc/passwd
    with pytest.raises(FileNotFound):
        env.files.read("/workspace/passwd")
    with pytest.raises(FileNotFound):
        env.files.write("/workspace/passwd", b"pwned")
    with pytest.raises(FileNotFound):
        env.files.edit("/workspace/passwd", "TOP", "pwned")
    _assert_host_untouched(env)


def test_relative_symlink_climbing_up(env: Env) -> None:
    (env.ws / "up").symlink_to("../../../../../../../..")
    via = "/workspace/up" + str(env.secret)
    with pytest.raises(FileNotFound):
        env.files.read(via)
    with pytest.raises(FileNotFound):
        env.files.write(via, b"pwned", make_parents=False)
    # ".." through the link is clamped at the root: this is the sandbox's own /etc.
    assert env.files.read("/workspace/up/etc/passwd").startswith(b"root:")
    _assert_host_untouched(env)


def test_symlink_to_host_directory(env: Env) -> None:
    (env.ws / "hostdir").symlink_to(env.host_dir)
    f = env.files
    with pytest.raises(FileNotFound):
        f.list("/workspace/hostdir")
    with pytest.raises(FileNotFound):
        f.read("/workspace/hostdir/secret.txt")
    with pytest.raises(AgentboxError):
        f.write("/workspace/hostdir/secret.txt", b"pwned")
    with pytest.raises(AgentboxError):
        f.write("/workspace/hostdir/new.txt", b"pwned")
    with pytest.raises(AgentboxError):
        f.mkdir("/workspace/hostdir/newdir")
    with pytest.raises(FileNotFound):
        f.remove("/workspace/hostdir/secret.txt")
    with pytest.raises(FileNotFound):
        f.move("/workspace/hostdir/secret.txt", "/workspace/stolen")
    f.write("/workspace/mine", b"x")
    with pytest.raises(FileNotFound):
        f.move("/workspace/mine", "/workspace/hostdir/mine")
    assert [i.name for i in f.list("/workspace", depth=3)] == ["hostdir", "mine"]  # not entered
    f.remove("/workspace/hostdir")  # the link itself
    _assert_host_untouched(env)


def test_recursive_remove_never_follows_symlinks(env: Env) -> None:
    env.files.write("/workspace/tree/keep/x", b"x")
    (env.ws / "tree" / "keep" / "host").symlink_to(env.host_dir)
    (env.ws / "tree" / "up").symlink_to("../../..")
    env.files.remove("/workspace/tree", recursive=True)
    assert not (env.ws / "tree").exists()
    assert (env.root / "etc" / "passwd").exists()
    _assert_host_untouched(env)


def test_symlink_swapped_in_a_race_stays_in_root(env: Env) -> None:
    d = env.ws / "d"
    d.mkdir()
    _own(d, 0o755)
    alt = env.ws / "d_alt"
    alt.symlink_to(env.host_dir)
    before = _outside_root(env)
    writer_done = threading.Event()

    def flip() -> None:
        for _ in range(1_000_000):  # bounded; stops as soon as the writer is done
            if writer_done.is_set():
                return
            # Atomically exchange the directory and the symlink to the host directory.
            syscalls.renameat2(-100, str(d), -100, str(alt), syscalls.RENAME_EXCHANGE)

    flipper = threading.Thread(target=flip)
    flipper.start()
    written = refused = 0
    try:
        for attempt in range(20000):
            if attempt >= 2000 and written and refused:
                break
            try:
                env.files.write("/workspace/d/secret.txt", b"pwned", make_parents=False)
                written += 1
            except AgentboxError:
                refused += 1
    finally:
        writer_done.set()
        flipper.join()
    assert written and refused  # both sides of the race were hit
    assert _outside_root(env) == before
    _assert_host_untouched(env)


@pytest.fixture
def swapped_walk(env: Env, monkeypatch: pytest.MonkeyPatch) -> Path:
    """/workspace/w/sub is a directory until the walker has lstat-ed it; at that exact
    moment the sandbox swaps in a symlink to the host directory (deterministic race)."""
    w = env.ws / "w"
    (w / "sub").mkdir(parents=True)
    (w / "sub" / "decoy.txt").write_bytes(b"decoy")
    (w / "sub_alt").symlink_to(env.host_dir)
    for p in (w, w / "sub", w / "sub" / "decoy.txt", w / "sub_alt"):
        _own(p, 0o755)
    real_stat = os.stat
    swapped = threading.Event()

    def racing_stat(path: str, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> Any:
        st = real_stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if path == "sub" and dir_fd is not None and not swapped.is_set():
            swapped.set()
            syscalls.renameat2(
                -100, str(w / "sub"), -100, str(w / "sub_alt"), syscalls.RENAME_EXCHANGE
            )
        return st

    monkeypatch.setattr(os, "stat", racing_stat)
    return w


def test_walks_never_follow_a_symlink_swapped_in_mid_walk(env: Env, swapped_walk: Path) -> None:
    listed = [i.path for i in env.files.list("/workspace/w", depth=3)]
    assert not any(p.endswith("secret.txt") for p in listed)
    assert (swapped_walk / "sub").is_symlink()  # the swap did happen


def test_recursive_remove_never_follows_a_symlink_swapped_in(env: Env, swapped_walk: Path) -> None:
    with pytest.raises(Conflict, match="changed while it was being walked"):
        env.files.remove("/workspace/w", recursive=True)
    _assert_host_untouched(env)


def test_download_never_follows_a_symlink_swapped_in(env: Env, swapped_walk: Path) -> None:
    buf = io.BytesIO()
    with pytest.raises(Conflict, match="/workspace/w/sub changed"):
        env.files.download_tar("/workspace/w", buf)
    assert SECRET not in buf.getvalue()


def test_magic_links_are_refused() -> None:
    # /proc/self/root jumps to the daemon's root whatever the resolution root; the kernel
    # refuses it under RESOLVE_NO_MAGICLINKS. Root "/" so that /proc is inside it.
    host = SandboxFiles("/", SANDBOX_UID, SANDBOX_GID)
    with pytest.raises(InvalidRequest, match="magic link") as exc:
        host.read("/proc/self/root/etc/hostname")
    assert exc.value.details["errno"] == "ELOOP"


def test_bad_paths(env: Env) -> None:
    with pytest.raises(InvalidRequest, match="NUL"):
        env.files.read("/workspace/a\0b")
    with pytest.raises(InvalidRequest, match="empty"):
        env.files.read("")
    with pytest.raises(InvalidRequest):
        env.files.write("/workspace/\udcff\ud800", b"")
    with pytest.raises(InvalidRequest):
        SandboxFiles(str(env.root), 0, 0)  # never host root


def test_messages_name_sandbox_paths_never_host_paths(env: Env) -> None:
    errors: list[AgentboxError] = []
    for call in (
        lambda: env.files.read("/workspace/missing"),
        lambda: env.files.write("/etc/passwd", b""),
        lambda: env.files.list("/workspace/missing/deeper", depth=2),
        lambda: env.files.remove("/etc"),
    ):
        with pytest.raises(AgentboxError) as exc:
            call()
        errors.append(exc.value)
    for err in errors:
        assert str(env.base) not in err.message and "/proc/" not in err.message
        assert err.details["path"] in err.message
    assert "files.list('/workspace')" in errors[0].message


# -- security: credentials ----------------------------------------------------------------


def test_root_owned_files_and_dirs_are_refused(env: Env) -> None:
    f = env.files
    with pytest.raises(PermissionDenied, match="/etc/new"):
        f.write("/etc/new", b"x")
    with pytest.raises(PermissionDenied):
        f.write("/etc/passwd", b"x")
    with pytest.raises(PermissionDenied):
        f.write("/etc/passwd", b"x", mode="append")
    with pytest.raises(PermissionDenied):
        f.read("/etc/shadow")
    with pytest.raises(PermissionDenied):
        f.edit("/etc/passwd", "root", "toor")
    with pytest.raises(PermissionDenied):
        f.remove("/etc/passwd")
    with pytest.raises(PermissionDenied):
        f.mkdir("/etc/sub")
    with pytest.raises(PermissionDenied):
        f.move("/etc/passwd", "/workspace/passwd")
    with pytest.raises(PermissionDenied):
        f.upload_tar("/etc", _tar(("evil", tarfile.REGTYPE, b"x", 0o644)))
    assert (env.root / "etc" / "passwd").read_text().startswith("root:")
    assert sorted(p.name for p in (env.root / "etc").iterdir()) == ["passwd", "shadow"]
    assert f.read("/etc/passwd").startswith(b"root:")  # world-readable is readable


def test_supplementary_groups_of_the_daemon_do_not_apply(env: Env, extra_group: int) -> None:
    shared = env.ws / "group-writable.txt"
    shared.write_bytes(b"daemon group data")
    _own(shared, 0o660, uid=0, gid=extra_group)
    with pytest.raises(PermissionDenied):
        env.files.write("/workspace/group-writable.txt", b"x")
    with pytest.raises(PermissionDenied):
        env.files.read("/workspace/group-writable.txt")
    assert shared.read_bytes() == b"daemon group data"


def test_credentials_are_dropped_per_thread_and_restored(extra_group: int) -> None:
    before = _status()
    assert before["CapEff"] != "0000000000000000" and before["Groups"] == str(extra_group)
    with sandbox_credentials(SANDBOX_UID, SANDBOX_GID):
        inside = _status()
    assert inside["Uid"].split()[3] == str(SANDBOX_UID)  # fsuid
    assert inside["Gid"].split()[3] == str(SANDBOX_GID)  # fsgid
    assert inside["Groups"] == ""
    assert inside["CapEff"] == "0000000000000000"
    assert _status() == before
    with pytest.raises(RuntimeError), sandbox_credentials(SANDBOX_UID, SANDBOX_GID):
        raise RuntimeError("boom")
    assert _status() == before


def test_failed_operation_restores_credentials(env: Env) -> None:
    before = _status()
    with pytest.raises(PermissionDenied):
        env.files.write("/etc/x", b"")
    assert _status() == before


# -- security: tar ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("../escape.txt", PathEscape),
        ("a/../../escape.txt", PathEscape),
        ("/abs.txt", PathEscape),
    ],
)
def test_tar_refuses_escaping_names(env: Env, name: str, error: type[AgentboxError]) -> None:
    archive = _tar(("ok.txt", tarfile.REGTYPE, b"ok", 0o644), (name, tarfile.REGTYPE, b"x", 0o644))
    with pytest.raises(error, match="tar entry"):
        env.files.upload_tar("/workspace/up", archive)
    assert (env.ws / "up" / "ok.txt").read_bytes() == b"ok"  # entries before it stay
    assert not list(env.root.rglob("escape.txt")) and not list(env.root.rglob("abs.txt"))


def test_tar_refuses_absolute_host_name(env: Env) -> None:
    with pytest.raises(PathEscape):
        env.files.upload_tar("/", _tar((str(env.secret), tarfile.REGTYPE, b"pwned", 0o644)))
    _assert_host_untouched(env)


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_tar_refuses_devices_and_fifos(env: Env, kind: bytes) -> None:
    with pytest.raises(InvalidRequest, match="only hold files"):
        env.files.upload_tar("/workspace/up", _tar(("node", kind, b"", 0o666)))
    assert not (env.ws / "up" / "node").exists()


def test_tar_strips_setuid_and_setgid(env: Env) -> None:
    archive = _tar(
        ("bin", tarfile.DIRTYPE, b"", 0o2775),
        ("bin/suid", tarfile.REGTYPE, b"#!/bin/sh\n", 0o4755),
        ("bin/sgid", tarfile.REGTYPE, b"#!/bin/sh\n", 0o2711),
    )
    assert env.files.upload_tar("/workspace", archive) == 3
    assert stat.S_IMODE((env.ws / "bin").stat().st_mode) == 0o775
    assert stat.S_IMODE((env.ws / "bin" / "suid").stat().st_mode) == 0o755
    assert stat.S_IMODE((env.ws / "bin" / "sgid").stat().st_mode) == 0o711


def test_tar_hard_links(env: Env) -> None:
    inside = _tar(("a.txt", tarfile.REGTYPE, b"A", 0o644), ("b.txt", tarfile.LNKTYPE, "a.txt", 0))
    assert env.files.upload_tar("/workspace/h", inside) == 2
    assert (env.ws / "h" / "a.txt").stat().st_ino == (env.ws / "h" / "b.txt").stat().st_ino
    # Through a symlink (from the same archive) to the host's directory: resolved in root.
    via_link = _tar(
        ("hostdir", tarfile.SYMTYPE, str(env.host_dir), 0o777),
        ("stolen", tarfile.LNKTYPE, "hostdir/secret.txt", 0),
    )
    with pytest.raises(FileNotFound):
        env.files.upload_tar("/workspace/h2", via_link)
    with pytest.raises(PathEscape, match="hard link target"):
        env.files.upload_tar("/workspace/h3", _tar(("s", tarfile.LNKTYPE, "../../host/x", 0)))
    with pytest.raises(PathEscape):
        env.files.upload_tar("/workspace/h4", _tar(("s", tarfile.LNKTYPE, str(env.secret), 0)))
    _assert_host_untouched(env)


def test_tar_file_through_symlink_entry_stays_in_root(env: Env) -> None:
    archive = _tar(
        ("esc", tarfile.SYMTYPE, str(env.host_dir), 0o777),
        ("esc/secret.txt", tarfile.REGTYPE, b"pwned", 0o644),
    )
    with pytest.raises(AgentboxError):
        env.files.upload_tar("/workspace/t", archive)
    _assert_host_untouched(env)
    # Symlinks are allowed and resolved inside the sandbox when used.
    ok = _tar(
        ("ws", tarfile.SYMTYPE, "/workspace", 0o777),
        ("ws/via-link.txt", tarfile.REGTYPE, b"ok", 0o644),
    )
    assert env.files.upload_tar("/workspace/t2", ok) == 2
    assert (env.ws / "via-link.txt").read_bytes() == b"ok"


def test_tar_replaces_existing_symlink_instead_of_writing_through(env: Env) -> None:
    env.files.mkdir("/workspace/t")
    (env.ws / "t" / "f").symlink_to("/workspace/target")
    env.files.write("/workspace/target", b"keep")
    env.files.upload_tar("/workspace/t", _tar(("f", tarfile.REGTYPE, b"new", 0o644)))
    assert not (env.ws / "t" / "f").is_symlink()
    assert (env.ws / "t" / "f").read_bytes() == b"new"
    assert (env.ws / "target").read_bytes() == b"keep"


def test_download_tar_stores_symlinks_never_follows_them(env: Env) -> None:
    env.files.write("/workspace/d/file", b"mine")
    (env.ws / "d" / "hostdir").symlink_to(env.host_dir)
    (env.ws / "d" / "up").symlink_to("../../..")
    buf = io.BytesIO()
    assert env.files.download_tar("/workspace/d", buf, include_unsafe=True) == 4
    assert SECRET not in buf.getvalue()
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["d", "d/file", "d/hostdir", "d/up"]
    assert members["d/hostdir"].issym() and members["d/hostdir"].linkname == str(env.host_dir)
    link_only = io.BytesIO()
    assert env.files.download_tar("/workspace/d/hostdir", link_only, include_unsafe=True) == 1
    assert SECRET not in link_only.getvalue()


def test_download_tar_of_unreadable_file_is_refused(env: Env) -> None:
    with pytest.raises(PermissionDenied, match="/etc/shadow"):
        env.files.download_tar("/etc", io.BytesIO())


def test_errno_mapping_covers_quota(env: Env) -> None:
    err = env.files._error(OSError(errno.EDQUOT, "quota"), "write", "/workspace/x")
    assert isinstance(err, LimitExceeded) and "/workspace/x" in err.message
    err = env.files._error(OSError(errno.EROFS, "ro"), "write", "/usr/x")
    assert isinstance(err, PermissionDenied) and "read-only" in err.message


# -- guards: the canonical path judged is the one acted on --------------------------------


class Refused(Exception):
    pass


def _repo(env: Env) -> SandboxFiles:
    """A repository and links into it; a SandboxFiles with no guard of its own."""
    files = SandboxFiles(str(env.root), SANDBOX_UID, SANDBOX_GID)
    files.write("/workspace/.git/config", b"cfg")
    files.write("/workspace/.git/hooks/pre-commit", b"hook")
    files.write("/workspace/docs/a.txt", b"a")
    files.mkdir("/workspace/sub")
    for name, target in [
        ("g", "../.git"),
        ("abs", "/workspace/.git/config"),
        ("up", ".."),
        ("loop", "loop"),
        ("docs", "../docs"),
        ("far", "../../../../etc"),
    ]:
        os.symlink(target, env.ws / "sub" / name)
        os.chown(env.ws / "sub" / name, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)
    return files


def test_guard_sees_the_canonical_path_of_every_call(env: Env) -> None:
    files = _repo(env)
    judged: list[tuple[str, str]] = []

    def guard(path: str, access: str) -> None:
        judged.append((path, access))

    files.write("sub/g/hooks/pre-commit", b"x", guard=guard)
    files.write("sub/abs", b"x", guard=guard)  # a final symlink: its target
    files.write("sub/up/.git/config", b"x", guard=guard)  # a link to ".."
    files.edit("sub/g/config", "x", "y", guard=guard)
    files.read("sub/far/passwd", guard=guard)  # clamped at the root, as RESOLVE_IN_ROOT
    files.move("sub/docs/a.txt", "sub/g/hooks/a", guard=guard)
    files.remove("sub/g/hooks/a", guard=guard)
    files.mkdir("sub/g/hooks/x/y", guard=guard)
    files.stat("sub/g", guard=guard)  # the link itself
    files.list("sub/up/docs", guard=guard)
    assert judged == [
        ("/workspace/.git/hooks/pre-commit", "write"),
        ("/workspace/.git/config", "write"),
        ("/workspace/.git/config", "write"),
        ("/workspace/.git/config", "write"),
        ("/etc/passwd", "read"),
        ("/workspace/docs/a.txt", "write"),
        ("/workspace/.git/hooks/a", "write"),
        ("/workspace/.git/hooks/a", "write"),
        ("/workspace/.git/hooks/x", "create_dir"),
        ("/workspace/.git/hooks/x/y", "write"),
        ("/workspace/sub/g", "read"),
        ("/workspace/docs", "read"),
    ]
    with pytest.raises(InvalidRequest, match="symbolic links"):
        files.write("sub/loop", b"x", guard=guard)


def test_guard_judges_upload_entries_links_and_their_targets(env: Env) -> None:
    files = _repo(env)
    judged: list[tuple[str, str]] = []

    def guard(path: str, access: str) -> None:
        judged.append((path, access))

    data = _tar(
        ("in/h", tarfile.SYMTYPE, "../sub/g/hooks", 0o777),  # a link: its target now
        ("in/h/post", tarfile.REGTYPE, b"x", 0o644),  # written through the link above
        ("in/n", tarfile.SYMTYPE, "../sub/g/missing/dir/x", 0o777),  # as far as it exists
        ("in/hl", tarfile.LNKTYPE, "sub/abs", 0o644),  # a hard link to a symlink
    )
    assert files.upload_tar("/workspace", data, guard=guard) == 4
    assert judged == [
        ("/workspace/in", "create_dir"),
        ("/workspace/in/h", "write"),
        ("/workspace/.git/hooks", "symlink_to"),
        ("/workspace/.git/hooks/post", "write"),
        ("/workspace/in/n", "write"),
        ("/workspace/.git/missing/dir/x", "symlink_to"),
        ("/workspace/in/hl", "write"),
        ("/workspace/sub/abs", "hardlink_to"),
        ("/workspace/.git/config", "symlink_to"),
    ]


def test_a_refusing_guard_changes_nothing(env: Env) -> None:
    files = _repo(env)

    def guard(path: str, access: str) -> None:
        if path.startswith("/workspace/.git/"):
            raise Refused(path)

    before = sorted(str(p) for p in env.ws.rglob("*"))
    for call in (
        lambda: files.write("sub/g/hooks/new/deeper/x", b"x", guard=guard),
        lambda: files.write("sub/abs", b"x", guard=guard),
        lambda: files.move("sub/g/config", "stolen", guard=guard),
        lambda: files.upload_tar("/workspace/sub/g/hooks", _tar(("x", tarfile.REGTYPE, b"x", 0o644)),
                                 guard=guard),
        lambda: files.upload_tar("/workspace", _tar(("l", tarfile.SYMTYPE, "sub/abs", 0o777)),
                                 guard=guard),
    ):  # fmt: skip
        with pytest.raises(Refused):
            call()
    assert sorted(str(p) for p in env.ws.rglob("*")) == before
    assert (env.ws / ".git" / "config").read_bytes() == b"cfg"


def test_a_link_swapped_after_the_judgement_does_not_redirect_the_call(env: Env) -> None:
    """The worst race, made deterministic: the guard itself swaps the link it just judged
    the path through. The call still acts on what was judged (the walk's fd)."""
    files = _repo(env)
    judged: list[str] = []

    def swap(path: str, access: str) -> None:
        judged.append(path)
        flipped = env.ws / "sub" / "flipped"
        flipped.symlink_to("../.git/hooks")
        os.rename(flipped, env.ws / "sub" / "docs")  # atomic, as a racing shell would

    files.write("sub/docs/f", b"x", guard=swap)
    assert judged == ["/workspace/docs/f"]
    assert (env.ws / "docs" / "f").read_bytes() == b"x"
    assert not (env.ws / ".git" / "hooks" / "f").exists()


def test_xattrs_of_an_entry_and_through_a_symlink_in_root(env: Env) -> None:
    env.files.write("/workspace/f", b"x")
    env.files.set_xattrs("/workspace/f", "user.t.", {"a": b"1", "b": b"2"})
    assert env.files.xattrs("/workspace/f", "user.t.") == {"a": b"1", "b": b"2"}
    env.files.set_xattrs("/workspace/f", "user.t.", {"b": b"3"})  # a is removed
    assert env.files.xattrs("/workspace/f", "user.t.") == {"b": b"3"}
    (env.ws / "link").symlink_to("/workspace/f")  # followed in root, as write does
    env.files.set_xattrs("/workspace/link", "user.t.", {"c": b"4"})
    assert env.files.xattrs("/workspace/f", "user.t.") == {"c": b"4"}
    assert env.files.xattrs("/workspace/link", "user.t.") == {}  # the link's own: none


def test_xattrs_never_reach_a_host_file_through_a_symlink(env: Env) -> None:
    (env.ws / "abs").symlink_to(env.secret)
    (env.ws / "up").symlink_to("../../../../../../../.." + str(env.secret))
    for link in ("/workspace/abs", "/workspace/up"):
        with pytest.raises(FileNotFound):
            env.files.set_xattrs(link, "user.t.", {"pwned": b"1"})
    assert os.listxattr(env.secret) == []
    # control: with the host's "/" as root the same call reaches it (the links did not)
    unconfined = SandboxFiles("/", SANDBOX_UID, SANDBOX_GID)
    unconfined.set_xattrs(str(env.secret), "user.t.", {"control": b"1"})
    assert os.listxattr(env.secret) == ["user.t.control"]
    unconfined.set_xattrs(str(env.secret), "user.t.", {})
    _assert_host_untouched(env)
