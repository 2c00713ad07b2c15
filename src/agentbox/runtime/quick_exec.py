"""One command in a running sandbox with nothing but light standard modules: the path
behind the plain ``agentbox sandbox exec ID -- ARGV``.

A CLI call is a whole process, and importing the runtime (typing, dataclasses, pathlib,
subprocess, hashlib, ...) cost several times the command itself. This module does the
same work as ``Runtime.commands(ID).run(ARGV)`` for the common case only: a sandbox of the
default tier, in the local SQLite store, running (not paused), its init alive, the launcher
and seccomp program already built. For anything else :func:`prepare` returns None and the
caller takes the full path, which resumes, explains or refuses as usual. The command is
confined by the same ``agentbox-nsexec enter`` argv (``runtime.enter_argv``, shared with
``CommandRunner``); tests/integration/test_quick_exec.py checks both build the same one.
When the sandbox's resident launcher answers (``runtime.resident``), the command goes
through it instead, as ``CommandRunner`` sends it; the first command without one starts it.
"""

from __future__ import annotations

import os
import select
import sys

from agentbox import endpoint
from agentbox.network import sandbox_env
from agentbox.runtime import enter_argv, resident

TYPE_CHECKING = False  # typing itself is a tenth of this path's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import ModuleType

_REGISTRY = "/run/agentbox/net-homes.json"  # network.plane.REGISTRY
_DRAIN_AFTER_EXIT_S = 0.05  # commands._DRAIN_AFTER_EXIT_S
_V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")  # cgroups._V1_CONTROLLERS
_RECORD = (
    "SELECT state, init_pid, init_start_time,"
    " COALESCE(json_extract(spec, '$.isolation'), 'namespaces'),"
    " CASE json_type(spec, '$.network') WHEN 'text' THEN json_extract(spec, '$.network')"
    " WHEN 'object' THEN json_extract(spec, '$.network.mode') ELSE 'none' END,"
    " (SELECT COUNT(*) FROM json_each(spec, '$.network.credentials'))"
    " FROM sandboxes WHERE id = ?"
)
_ENV = (
    "SELECT key, value, type FROM sandboxes, json_each(sandboxes.spec, '$.env')"
    " WHERE sandboxes.id = ?"
)


def _sqlite_core() -> ModuleType:
    """sqlite3's C core (the package adds datetime adapters we never use), imported
    without functools: _sqlite3 takes ``functools.lru_cache`` as it loads, for each
    connection's statement cache, and functools (with collections, operator, reprlib,
    keyword) is a seventh of this path's CPU. Each connection here runs each statement
    once, so a cache that keeps nothing is the same. (A later full-path connection in
    this process gets no statement cache either: slower by a lookup, no different.)"""
    if "functools" in sys.modules:
        import _sqlite3

        return _sqlite3
    stub = type(sys)("functools")
    stub.lru_cache = lambda maxsize: lambda connection: connection  # type: ignore[attr-defined]
    sys.modules["functools"] = stub
    try:
        import _sqlite3
    finally:
        if sys.modules.get("functools") is stub:
            del sys.modules["functools"]
    return _sqlite3


if TYPE_CHECKING:
    import _sqlite3 as sqlite3
else:
    sqlite3 = _sqlite_core()


class Prepared:
    """A command ready to start: the launcher argv, its environment, the cgroup leaf; the
    command itself and the sandbox's resident launcher (its socket, how to start it)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        leaf_dir: str,
        command: list[str],
        socket: str,
        resident_argv: list[str],
    ) -> None:
        self.argv = argv
        self.env = env
        self.leaf_dir = leaf_dir
        self.command = command
        self.socket = socket
        self.resident_argv = resident_argv


def prepare(sandbox_id: str, argv: Sequence[str], leaf: str) -> Prepared | None:
    """The launch of ``argv`` as foreground leaf ``leaf``, or None when this sandbox needs
    the full runtime (another tier or store, not running, paused, anything unexpected).
    A gateway named by ``AGENTBOX_URL`` is asked instead; the home's own gateway is not:
    like ``sandbox shell``, this runs on the host as root, beside it."""
    if endpoint.named_url() or not argv or not argv[0]:
        return None
    where = endpoint.home()
    db_path = os.path.join(where, "state.db")
    if not os.path.exists(db_path):
        return None  # no store here (first use) or another kind of store
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return None
    try:
        row = db.execute(_RECORD, (sandbox_id,)).fetchone()
        env_rows = db.execute(_ENV, (sandbox_id,)).fetchall()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    if row is None:
        return None
    state, init_pid, start_time, isolation, network, credentials = row
    if state != "running" or isolation != "namespaces" or init_pid is None:
        return None
    sandbox_dir = os.path.join(where, "sandboxes", sandbox_id)
    if os.path.exists(os.path.join(sandbox_dir, "paused")):
        return None  # the full path resumes it
    if _start_time(init_pid) != start_time:
        return None  # its init is gone: the full path says so
    extra: dict[str, str] = {}
    if network != "none":
        proxy = _proxy_env(where)
        if proxy is None:
            return None
        extra.update(proxy)
        if credentials:
            extra.update(sandbox_env.ca_env())
    for key, value, kind in env_rows:
        if kind != "text":
            return None
        extra[key] = value
    paths = _launch_paths(os.path.join(where, "lib"))
    cgroups = _cgroup_dirs(sandbox_id)
    if paths is None or cgroups is None:
        return None
    unified, v1 = cgroups
    env = enter_argv.base_env(sandbox_id)  # a sandbox's hostname is its id
    env.update(extra)
    leaf_dir = os.path.join(unified, leaf)
    launcher = enter_argv.launcher_argv(
        paths[0], leaf_dir, v1, init_pid, paths[1], None, list(argv)
    )
    resident_argv = resident.start_argv(
        paths[0], sandbox_dir, os.path.join(unified, resident.LEAF), v1, init_pid, paths[1]
    )
    with _suppressed(FileNotFoundError):
        os.utime(os.path.join(sandbox_dir, "activity"))  # the idle clock restarts
    socket = resident.socket_path(sandbox_dir, paths[0])
    return Prepared(launcher, env, leaf_dir, list(argv), socket, resident_argv)


def run(
    prepared: Prepared, stdin: bytes | None, write: Callable[[int, bytes], None]
) -> tuple[int, bytes]:
    """Start the command and copy its output to ``write(1 or 2, chunk)`` as it comes;
    returns the launcher's wait status and the start of its stderr (for a launch error).
    Stops at the launcher's exit (pidfd) after draining what is buffered: a background
    child may hold the pipes open (as ``CommandRunner._pump``)."""
    os.mkdir(prepared.leaf_dir)
    try:
        return _spawn_and_pump(prepared, stdin, write)
    finally:
        with _suppressed(OSError):
            os.rmdir(prepared.leaf_dir)  # EBUSY while background children live: kept


def _spawn_and_pump(
    prepared: Prepared, stdin: bytes | None, write: Callable[[int, bytes], None]
) -> tuple[int, bytes]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1)
    pid = -1
    try:
        stdio = (in_r, out_w, err_w)
        started = resident.launch(
            prepared.socket, prepared.command, prepared.env, enter_argv.WORKSPACE, False,
            stdio, prepared.leaf_dir,
        )  # fmt: skip
        if started is None:
            pid = os.posix_spawn(
                prepared.argv[0],
                prepared.argv,
                prepared.env,
                # Every fd is CLOEXEC (PEP 446); the launcher also closes all but 0-2.
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, i) for i, fd in enumerate(stdio)],
            )
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    pidfd = started.exit_fd() if started is not None else os.pidfd_open(pid)
    if stdin:
        _feed(in_w, stdin)
    err_head = bytearray()
    poller = select.poll()
    open_fds = {out_r: 1, err_r: 2}
    for fd in open_fds:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    exited = False
    try:
        while open_fds:
            events = poller.poll(_DRAIN_AFTER_EXIT_S * 1000 if exited else None)
            if exited and not events:
                break  # drained what was buffered; a background child holds the pipes
            for fd, _ in events:
                if fd == pidfd:
                    poller.unregister(pidfd)
                    exited = True
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    poller.unregister(fd)
                    del open_fds[fd]
                    continue
                if open_fds[fd] == 2 and len(err_head) < 4096:
                    err_head += chunk[: 4096 - len(err_head)]
                write(open_fds[fd], chunk)
    finally:
        for fd in (out_r, err_r, pidfd):
            os.close(fd)
    if started is not None:
        return started.wait(), bytes(err_head)
    _, status = os.waitpid(pid, 0)
    # No launcher answered: start one for the next command (after this one's output).
    resident.start(prepared.resident_argv)
    return os.waitstatus_to_exitcode(status), bytes(err_head)


def _feed(fd: int, data: bytes) -> None:
    """Write stdin, then close it; a command that does not read it must not block us."""
    import time  # stdin given: a rare path

    os.set_blocking(fd, False)
    view = memoryview(data)
    deadline = time.monotonic() + 5.0
    try:
        while view and time.monotonic() < deadline:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                time.sleep(0.001)
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _start_time(pid: int) -> int | None:
    """As ``host.process_start_time``, but None for a process that ended and is not reaped
    yet (a zombie: a stopped sandbox's init until the host's PID 1 reaps it, on these VMs
    about once a second), which has no namespaces left to enter: the full path answers
    then (it reads the record: "stopped, resume it")."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X", b"x"):  # ended, not reaped: nothing to enter
        return None
    return int(fields[19])


def _launch_paths(lib: str) -> tuple[str, str] | None:
    """The launcher binary and the compiled seccomp program, named as
    ``launcher.nsexec_path`` and ``seccomp.compiled_filter_path`` name them (the hash of
    their inputs); None if either is not built yet (the full path builds it)."""
    from _sha256 import sha256  # type: ignore[import-not-found]  # hashlib: OpenSSL, ms

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    isolation = os.path.join(package, "isolation")
    source = b"".join(_read(os.path.join(isolation, n)) for n in ("nsexec.c", "closefds.h"))
    source_digest = sha256(source + b"\0static").hexdigest()
    nsexec = os.path.join(lib, f"agentbox-nsexec-{source_digest[:16]}")
    inputs = b"\0".join(
        [
            _read(os.path.join(isolation, "seccomp_profile.json")),
            _read(os.path.join(isolation, "seccomp.py")),
            os.uname().machine.encode(),
        ]
    )
    seccomp = os.path.join(lib, f"seccomp-{sha256(inputs).hexdigest()[:16]}.bpf")
    if not (os.path.exists(nsexec) and os.path.exists(seccomp)):
        return None
    return nsexec, seccomp


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _cgroup_dirs(sandbox_id: str) -> tuple[str, list[str]] | None:
    """The sandbox's v2 directory and its v1 ones (hybrid hosts), as ``CgroupLayout``
    finds them in /proc/self/mounts."""
    v2 = None
    v1: dict[str, str] = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 4:
                continue
            if fields[2] == "cgroup2":
                v2 = fields[1]
            elif fields[2] == "cgroup":
                options = fields[3].split(",")
                for ctrl in _V1_CONTROLLERS:
                    if ctrl in options:
                        v1[ctrl] = fields[1]
    if v2 is None:
        return None
    try:
        with open(os.path.join(v2, "cgroup.controllers")) as f:
            controllers = f.read().split()
    except FileNotFoundError:
        controllers = []
    unified = os.path.join(v2, "agentbox", sandbox_id)
    if {"memory", "pids", "cpu"} <= set(controllers):
        return unified, []
    if any(c not in v1 for c in ("memory", "pids", "cpu")):
        return None
    return unified, [os.path.join(p, "agentbox", sandbox_id) for p in v1.values()]


def _proxy_env(where: str) -> dict[str, str] | None:
    """The egress proxy variables of this home's network number (``plane.HomeNet``), read
    from the host's registry; None if the home has none yet."""
    try:
        text = _read(_REGISTRY).decode()
    except OSError:
        return None
    # The registry is JSON; SQLite reads it (importing json costs more than this call).
    db = sqlite3.connect(":memory:")
    try:
        row = db.execute(
            "SELECT value FROM json_each(?) WHERE key = ?",
            (text, os.path.realpath(where)),
        ).fetchone()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    if row is None or not isinstance(row[0], int):
        return None
    return sandbox_env.proxy_env(sandbox_env.proxy_address(row[0]))


class _suppressed:
    """``contextlib.suppress`` (contextlib is not among this path's imports)."""

    def __init__(self, kind: type[BaseException]) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, self.kind)
