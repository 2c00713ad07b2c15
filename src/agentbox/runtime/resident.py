"""The host side of a sandbox's resident launcher (``agentbox-nsexec resident``, see
isolation/nsexec.c): one connection per command on a unix socket in the sandbox's host
directory, which only host root reaches (no sandbox mount shows that directory, the
socket is 0600 and the launcher checks its peer is root of the host's user namespace).

The launcher is host code that sandbox code cannot see or signal; it clones each command
into its cgroup leaf with ``agentbox-nsexec enter``'s own confinement and waits for it
(its wait status comes back here), so a command costs one clone instead of the exec of
the launcher, two forks, seven setns and the cgroup moves. When no launcher answers
(none started yet, the sandbox stopped and started again, the launcher killed), the
caller starts the command the old way, and starts a launcher for the next one.

Standard modules only, none heavy: the CLI's light exec path (``runtime.quick_exec``)
uses it too.
"""

from __future__ import annotations

import _socket
import errno
import os

from agentbox.runtime.enter_argv import SANDBOX_GID, SANDBOX_UID

TYPE_CHECKING = False  # typing is not loaded on the light path
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

LEAF = "launcher"  # its cgroup leaf: not a command's ("c..." / "p...")
_SUN_PATH_MAX = 107
_MAX_ARG_STRLEN = 131072  # the kernel's MAX_ARG_STRLEN, with the NUL
_KILLED = -9  # what the old launcher reported when its middle process was killed
_arg_max: int | None = None  # sysconf(SC_ARG_MAX), read once


def socket_path(sandbox_dir: str, nsexec: str) -> str:
    """Named by the launcher binary's digest: a launcher left by an older agentbox in a
    sandbox that outlived an upgrade is never asked to speak a newer request."""
    return os.path.join(sandbox_dir, f"launcher-{os.path.basename(nsexec).rsplit('-', 1)[-1]}.sock")


def start_argv(
    nsexec: str,
    sandbox_dir: str,
    leaf_dir: str,
    v1_dirs: Sequence[str],
    init_pid: int,
    seccomp: str,
) -> list[str]:
    """The argv that starts the sandbox's launcher (it returns once it listens)."""
    out = [nsexec, "resident", "--socket", socket_path(sandbox_dir, nsexec), "--leaf", leaf_dir]
    for d in v1_dirs:
        out += ["--cgroup", d]
    out += ["--ns-pid", str(init_pid), "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    return [*out, "--seccomp", seccomp]


def start(argv: list[str]) -> None:
    """Start a launcher with ``start_argv``'s ``argv``, for the next commands (best
    effort: without one, commands take the old path). Its cgroup leaf is made here."""
    leaf_dir = argv[argv.index("--leaf") + 1]
    try:
        os.mkdir(leaf_dir)
    except FileExistsError:
        pass
    except OSError:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            {},
            file_actions=[(os.POSIX_SPAWN_DUP2, null, fd) for fd in (0, 1, 2)],
        )
        os.waitpid(pid, 0)  # its first half exits as soon as the socket listens
    except OSError:
        pass
    finally:
        os.close(null)


class Started:
    """A command the launcher started: its pidfd (readable once it ended) and the
    connection its wait status arrives on."""

    def __init__(self, sock: _socket.socket, pidfd: int | None, status: int | None) -> None:
        self.sock = sock
        self.pidfd = pidfd
        self.returncode = status

    def exit_fd(self) -> int:
        """A new fd that polls readable once the command ended (the caller closes it)."""
        if self.pidfd is not None:
            return os.dup(self.pidfd)
        return os.eventfd(1, os.EFD_CLOEXEC)  # it never started: ended already

    def wait(self) -> int:
        """The command's exit code as ``Popen.returncode`` gives it (-N: signal N)."""
        if self.returncode is None:
            data = b""
            while len(data) < 5:
                chunk = self.sock.recv(5 - len(data))
                if not chunk:
                    break
                data += chunk
            # No status: the launcher was killed, and the command with it (its
            # PDEATHSIG), as the old launcher reported its middle process killed.
            ok = len(data) == 5 and data[:1] == b"S"
            self.returncode = _exit_code(data[1:]) if ok else _KILLED
            self.close()
        return self.returncode

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        self.sock.close()


def launch(
    path: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    ctty: bool,
    stdio: tuple[int, int, int],
    leaf_dir: str,
) -> Started | None:
    """Start ``argv`` through the launcher at ``path`` with ``stdio`` (fds: ours are not
    closed) in cgroup leaf ``leaf_dir``; None when no launcher takes it (the caller uses
    the old path)."""
    args = [os.fsencode(a) for a in argv]
    variables = [os.fsencode(f"{k}={v}") for k, v in env.items()]
    _check_exec_size([*args, *variables])
    body = [b"A" + a + b"\0" for a in args] + [b"E" + v + b"\0" for v in variables]
    body.append(b"C" + os.fsencode(cwd) + b"\0")
    if ctty:
        body.append(b"T\0")
    payload = b"".join(body)
    sock = _connect(path)
    if sock is None:
        return None
    try:
        leaf = os.open(leaf_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fds = b"".join(fd.to_bytes(4, "little", signed=True) for fd in (*stdio, leaf))
            head = len(payload).to_bytes(4, "little")
            sent = sock.sendmsg([head, payload], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            if sent < len(head) + len(payload):  # (sendall of nothing still sends: EPIPE
                # once a quick command ended and the launcher closed the connection)
                sock.sendall(memoryview(head + payload)[sent:])
        finally:
            os.close(leaf)
        return _started(sock)
    except OSError:
        sock.close()
        return None


def _check_exec_size(strings: list[bytes]) -> None:
    """Refuse what execve would (E2BIG), here, as the old path's exec of the launcher did:
    a string of 128 KiB or more, or argv and environment over ARG_MAX."""
    global _arg_max
    if _arg_max is None:  # a quarter of the stack limit: a prlimit64 per call otherwise
        _arg_max = os.sysconf("SC_ARG_MAX")
    sizes = [len(s) + 1 for s in strings]  # with the NUL, as the kernel counts
    if any(n > _MAX_ARG_STRLEN for n in sizes) or sum(sizes) + 8 * len(sizes) > _arg_max:
        raise OSError(errno.E2BIG, os.strerror(errno.E2BIG))


def _started(sock: _socket.socket) -> Started | None:
    kind, ancillary, _, _ = sock.recvmsg(1, _socket.CMSG_SPACE(4))
    fds = [
        int.from_bytes(data[i : i + 4], "little", signed=True)
        for level, type_, data in ancillary
        if level == _socket.SOL_SOCKET and type_ == _socket.SCM_RIGHTS
        for i in range(0, len(data) - 3, 4)
    ]
    for fd in fds:
        os.set_inheritable(fd, False)
    if kind == b"P" and len(fds) == 1:
        return Started(sock, fds[0], None)
    for fd in fds:
        os.close(fd)
    if kind == b"S":  # not started (e.g. the pids limit): as the old launcher, status 125
        status = b""
        while len(status) < 4 and (chunk := sock.recv(4 - len(status))):
            status += chunk
        if len(status) == 4:
            sock.close()
            return Started(sock, None, _exit_code(status))
    sock.close()
    return None  # it went away before answering: the old path


def _exit_code(status: bytes) -> int:
    return os.waitstatus_to_exitcode(int.from_bytes(status, "little", signed=True))


def _connect(path: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    dfd = -1
    try:
        address = path
        if len(os.fsencode(path)) > _SUN_PATH_MAX:  # through its directory's fd
            dfd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            address = f"/proc/self/fd/{dfd}/{os.path.basename(path)}"
        sock.connect(address)
    except OSError:  # none yet (ENOENT), or it is gone (ECONNREFUSED)
        sock.close()
        return None
    finally:
        if dfd >= 0:
            os.close(dfd)
    return sock
