"""Background processes with handles that outlive the process that started them.

Each process has a directory on the sandbox's disk, *outside* the sandbox's view
(``disk/procs/ID``): ``stdout`` and ``stderr`` (the command writes them through inherited
fds), ``stdin`` (a FIFO, only when asked for), ``meta.json`` and ``exit``, which the
host-side launcher writes after ``waitpid`` — nothing in the sandbox can forge it.
The launcher also holds the FIFO's write end while the command runs (``--hold-stdin``):
``close_stdin`` asks it to let go (SIGUSR1), and the command reads EOF.

A process started with a terminal (``pty``) has a pty instead of pipes; see
``terminals``: its output (one stream) goes to ``stdout``, its input to the terminal.

A foreground command found waiting for input can be *adopted*: it keeps running, a relay
thread of this daemon copies its pipes to those files (and the FIFO to its stdin) and
writes ``exit`` after ``waitpid``. The relay lives as long as this process: a daemon
restart closes the command's pipes, so it ends (and its exit is not recorded).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import secrets
import selectors
import shutil
import signal as signals
import stat
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox.errors import InvalidRequest, ProcessNotFound
from agentbox.fsutil import stdin_bytes
from agentbox.hints import Hint
from agentbox.runtime import terminals
from agentbox.runtime.commands import (
    INPUT_QUIET_S,
    CommandRunner,
    LiveCommand,
    Process,
    exit_fd,
    launch_error,
    normalise_argv,
)
from agentbox.runtime.files import sandbox_credentials
from agentbox.runtime.prompts import StreamId, prompt_text, stream_id, waiting_for_input
from agentbox.runtime.requests import coerce
from agentbox.runtime.requests_extra import StartRequest

_SIGNALS = {s.name: s for s in signals.Signals}


@dataclass(frozen=True)
class ProcessInfo:
    id: str
    argv: list[str]
    started_at: float
    running: bool
    exit_code: int | None
    # Blocked reading its stdin with no output for a while (and what it printed last).
    waiting_for_input: bool = False
    prompt: str | None = None
    # Runs on a terminal (pty): one output stream (stdout), input typed into the terminal.
    terminal: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "argv": self.argv,
            "started_at": self.started_at,
            "running": self.running,
            "exit_code": self.exit_code,
            "waiting_for_input": self.waiting_for_input,
            "prompt": self.prompt,
            "terminal": self.terminal,
        }


@dataclass(frozen=True)
class ProcessOutput:
    data: bytes
    next_offset: int

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class ProcessTable:
    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner
        self.root = runner.host.procs

    def _dir(self, process_id: str) -> Path:
        if not process_id.startswith("p-") or not process_id[2:].isalnum():
            raise InvalidRequest(f"{process_id!r} is not a process id (they look like p-1a2b3c)")
        path = self.root / process_id
        if not path.is_dir():
            raise ProcessNotFound(
                f"no background process {process_id} in this sandbox",
                hint=Hint("process_list", {}, "{call} to list them"),
            )
        return path

    def start(self, request: StartRequest | str | Sequence[str], **fields: Any) -> ProcessInfo:
        """Start ``command`` in the background. ``stdin``: keep its stdin open for
        ``write_stdin`` (and ``close_stdin``). ``pty=(cols, rows)``: run it on a terminal
        of that size (its input then goes to the terminal; ``stdin`` is not needed)."""
        request = coerce(StartRequest, request, fields)
        pty = self._terminal(request.pty)
        argv = normalise_argv(request.command)
        environment = self.runner.environment(request.env)
        process_id = "p-" + secrets.token_hex(6)
        pdir = self.root / process_id
        leaf = self.runner.new_leaf("p")
        try:
            if pty is not None:
                started = self._launch_terminal(pdir, argv, environment, leaf, request.cwd, pty)
            else:
                started = self._launch(pdir, argv, environment, leaf, request.cwd, request.stdin)
        except OSError as e:
            self._discard_leaf(leaf)
            shutil.rmtree(pdir, ignore_errors=True)
            raise launch_error(e) from None
        self._until_started(pdir, leaf)
        return ProcessInfo(process_id, argv, started, True, None, terminal=pty is not None)

    # What a tier does its own way (GvisorProcessTable overrides these) ----------------
    def _terminal(self, pty: tuple[int, int] | None) -> tuple[int, int] | None:
        """The terminal size to start on (checked), or None for pipes."""
        return None if pty is None else terminals.check_size(*pty)

    def _discard_leaf(self, leaf: str) -> None:
        """Undo ``new_leaf`` for a command that never launched."""
        self.runner.cgroup.remove_leaf(leaf)

    def _until_started(self, pdir: Path, leaf: str) -> None:
        self._wait_running(pdir, self.runner.cgroup.unified / leaf)

    @staticmethod
    def _wait_running(pdir: Path, leaf: Path, timeout: float = 10.0) -> None:
        """Until the command runs as the sandbox user in its leaf (or has ended): the
        launcher detaches first, and a signal sent before that would find no process
        (SIGKILL then removed the leaf under the launcher: it reported 125)."""
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while time.monotonic() < deadline and _read_exit(pdir / "exit") is None:
            try:
                pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
            except FileNotFoundError:
                return
            if any(not _is_launcher(pid) for pid in pids):
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def _launch(
        self, pdir: Path, argv: list[str], environment: dict[str, str], leaf: str,
        cwd: str | None, stdin: bool,
    ) -> float:  # fmt: skip
        pdir.mkdir(mode=0o700)
        exit_file = pdir / "exit"
        started = time.time()
        meta = {"argv": argv, "started_at": started, "leaf": leaf, "cwd": cwd}
        if stdin:
            meta["stdin"] = "held"  # the launcher holds the write end: close_stdin works
        (pdir / "meta.json").write_text(json.dumps(meta))
        fifo = pdir / "stdin"
        launcher = self.runner.launcher_argv(
            argv, leaf, cwd, exit_file=str(exit_file), setsid=True, detach=True,
            hold_stdin=str(fifo) if stdin else None,
        )  # fmt: skip
        if stdin:
            os.mkfifo(fifo, 0o600)
            # The read end alone (non-blocking open: no writer yet), blocking for the
            # command; the launcher opens the write end and holds it until close_stdin.
            stdin_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.set_blocking(stdin_fd, True)
        else:
            stdin_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        # The launcher detaches (--detach): its waiting half outlives this process, and
        # the exit file, not our child status, records how the command ended.
        run_detached(launcher, environment, pdir, stdin_fd, "the launcher failed")
        return started

    def _launch_terminal(
        self, pdir: Path, argv: list[str], environment: dict[str, str], leaf: str,
        cwd: str | None, size: tuple[int, int],
    ) -> float:  # fmt: skip
        """The command on a new pty of the sandbox; the launcher stays our child, and the
        relay thread that holds the master records its exit after the last output."""
        pdir.mkdir(mode=0o700)
        started = time.time()
        meta = {
            "argv": argv, "started_at": started, "leaf": leaf, "cwd": cwd,
            "terminal": True, "relay_pid": os.getpid(),
        }  # fmt: skip
        (pdir / "meta.json").write_text(json.dumps(meta))
        for name in ("stdout", "stderr"):  # stderr stays empty: a terminal has one stream
            os.close(os.open(pdir / name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        launcher, launch_env = self._terminal_launcher(argv, leaf, cwd, environment)
        master, slave = self.runner.open_pty()
        try:
            terminals.set_size(master, *size)
            proc = subprocess.Popen(
                launcher, stdin=slave, stdout=slave, stderr=slave, env=launch_env,
                close_fds=True, start_new_session=True,
            )  # fmt: skip
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        terminals.attach(pdir, proc, master, (self.runner.host.host_uid, self.runner.host.host_gid))
        return started

    def _terminal_launcher(
        self, argv: list[str], leaf: str, cwd: str | None, environment: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """What runs the command on the terminal given as its stdio, and its environment."""
        return self.runner.launcher_argv(argv, leaf, cwd, setsid=True, ctty=True), environment

    def list(self) -> list[ProcessInfo]:
        if not self.root.exists():
            return []
        return [self.get(p.name) for p in sorted(self.root.iterdir()) if p.name.startswith("p-")]

    def get(self, process_id: str) -> ProcessInfo:
        pdir = self._dir(process_id)
        meta = json.loads((pdir / "meta.json").read_text())
        code = _read_exit(pdir / "exit")
        running = code is None
        if running and not _alive(meta.get("relay_pid")):
            # Adopted by a daemon that is gone: its exit will never be recorded.
            running = self.runner.cgroup.populated(self.runner.cgroup.unified / meta["leaf"])
        terminal = bool(meta.get("terminal"))
        info = ProcessInfo(
            process_id, meta["argv"], meta["started_at"], running, code, terminal=terminal
        )
        if running and not terminal and self._waiting(pdir, meta):
            recent = b"".join(_tail(pdir / name, 4096) for name in ("stderr", "stdout"))
            info = dataclasses.replace(info, waiting_for_input=True, prompt=prompt_text(recent))
        return info

    def _waiting(self, pdir: Path, meta: dict[str, object]) -> bool:
        """Blocked reading its stdin (the FIFO, or an adopted command's pipe), and quiet."""
        known = meta.get("stdin_id")
        fifo = pdir / "stdin"
        if isinstance(known, list):
            stdin: StreamId = (int(known[0]), int(known[1]))
        elif fifo.exists():
            st = fifo.stat()
            stdin = (st.st_dev, st.st_ino)
        else:
            return False  # /dev/null: reads never block
        outputs = [pdir / "stdout", pdir / "stderr"]
        last = max((p.stat().st_mtime for p in outputs if p.exists()), default=0.0)
        if time.time() - last < INPUT_QUIET_S:
            return False
        return waiting_for_input(self.runner.cgroup.unified / str(meta["leaf"]), stdin)

    def adopt(self, live: LiveCommand) -> str:
        """Keep a foreground command that waits for input running as a background process
        (in a leaf of its own, so it no longer counts as a running command); returns its id."""
        assert live.proc.stdin is not None
        process_id = "p-" + secrets.token_hex(6)
        pdir = self.root / process_id
        pdir.mkdir(mode=0o700)
        leaf = self.runner.new_leaf("p")
        _move_processes(self.runner.cgroup.unified, live.leaf, leaf)
        self.runner.cgroup.remove_leaf_dir(live.leaf)
        quiet_since = time.time() - INPUT_QUIET_S  # it was found quiet that long
        for capture in (live.out, live.err):
            (pdir / capture.name).write_bytes(capture.value())
            os.utime(pdir / capture.name, (quiet_since, quiet_since))  # "last output" for get
        os.mkfifo(pdir / "stdin", 0o600)
        fifo = os.open(pdir / "stdin", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        meta = {
            "argv": live.argv,
            "started_at": time.time(),
            "leaf": leaf,
            "cwd": live.cwd,
            "stdin_id": list(stream_id(live.proc.stdin.fileno())),
            "relay_pid": os.getpid(),
        }
        (pdir / "meta.json").write_text(json.dumps(meta))
        ids = (self.runner.host.host_uid, self.runner.host.host_gid)
        relay = threading.Thread(
            target=_relay, args=(live.proc, pdir, fifo, ids), name=f"relay-{process_id}",
            daemon=True,
        )  # fmt: skip
        relay.start()
        return process_id

    def read_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, limit: int = 1 << 20
    ) -> ProcessOutput:
        if stream not in ("stdout", "stderr"):
            raise InvalidRequest("stream must be 'stdout' or 'stderr'")
        if offset < 0 or limit <= 0:
            raise InvalidRequest("offset must be >= 0 and limit > 0")
        path = self._dir(process_id) / stream
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(limit)
        return ProcessOutput(data, offset + len(data))

    def write_stdin(self, process_id: str, data: bytes | str) -> int:
        """Send ``data`` to the process's stdin (or type it into its terminal)."""
        pdir = self._dir(process_id)
        if _meta(pdir).get("terminal"):
            return terminals.write(pdir, stdin_bytes(data, "data"))
        fifo = pdir / "stdin"
        if (pdir / "stdin.closed").exists():
            raise InvalidRequest(
                f"the stdin of process {process_id} was closed (it read EOF); start a new "
                "process to send more"
            )
        if not fifo.exists() or not stat.S_ISFIFO(fifo.stat().st_mode):
            raise InvalidRequest(
                f"process {process_id} was started without stdin",
                hint=Hint("process_start_stdin", {}, "{call} to answer it next time"),
            )
        payload = stdin_bytes(data, "data")
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return os.write(fd, payload)
        finally:
            os.close(fd)

    def close_stdin(self, process_id: str) -> None:
        """Close the process's stdin: once it has read what was sent, it reads EOF."""
        pdir = self._dir(process_id)
        meta = _meta(pdir)
        if meta.get("terminal"):
            raise InvalidRequest(
                f"process {process_id} runs on a terminal, which has no stdin to close; "
                'send Ctrl-D ("\u0004") as input to end a line-reading program'
            )
        if meta.get("stdin") != "held":
            raise InvalidRequest(
                f"process {process_id} has no stdin that can be closed (it was started "
                "without stdin, or adopted from a foreground command)",
                hint=Hint("process_start_stdin", {}, "{call} to be able to close it"),
            )
        (pdir / "stdin.closed").touch()  # first: no write may follow the EOF
        if _read_exit(pdir / "exit") is not None:
            return
        launcher = self._stdin_holder(pdir, meta)
        if launcher is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(launcher, signals.SIGUSR1)

    def _stdin_holder(self, pdir: Path, meta: dict[str, object]) -> int | None:
        """The launcher holding the command's stdin: the parent of the command's parent
        (the middle launcher), checked to be root's and launched for this FIFO."""
        leaf = self.runner.cgroup.unified / str(meta["leaf"])
        try:
            pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return None
        fifo = os.fsencode(pdir / "stdin")
        for pid in pids:
            middle = _parent(pid)
            if _is_launcher(pid) or not _is_launcher(middle):
                continue
            launcher = _parent(middle)
            try:
                argv = Path(f"/proc/{launcher}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if _is_launcher(launcher) and b"--hold-stdin" in argv and fifo in argv:
                return launcher
        return None

    def resize(self, process_id: str, cols: int, rows: int) -> None:
        """Set the terminal's size; the program on it gets SIGWINCH."""
        pdir = self._dir(process_id)
        if not _meta(pdir).get("terminal"):
            raise InvalidRequest(
                f"process {process_id} has no terminal to resize; start it with pty=(cols, rows)"
            )
        terminals.resize(pdir, cols, rows)

    def signal(self, process_id: str, sig: int | str = "SIGTERM") -> bool:
        """Signal the command (the launcher's child); SIGKILL takes its whole tree.
        Returns whether it was delivered (not when the process had already ended)."""
        pdir = self._dir(process_id)
        signum = _signal_number(sig)
        meta = json.loads((pdir / "meta.json").read_text())
        if _read_exit(pdir / "exit") is not None:
            return False
        if signum == signals.SIGKILL:
            alive = self.runner.cgroup.populated(self.runner.cgroup.unified / meta["leaf"])
            self.runner.cgroup.remove_leaf(meta["leaf"])
            await_recorded_end(pdir, meta)
            return alive
        # The command is the one process of its leaf whose parent is outside the sandbox's
        # pid namespace (the launcher); signal the leaf's processes that are not launchers.
        leaf = self.runner.cgroup.unified / meta["leaf"]
        try:
            pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return False
        delivered = False
        for pid in pids:
            if _is_launcher(pid):
                continue
            if _parent(pid) in pids and not _is_launcher(_parent(pid)):
                continue  # a descendant; the command itself gets the signal
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
                delivered = True
        return delivered

    def wait(self, process_id: str, timeout: float | None = None) -> ProcessInfo:
        pdir = self._dir(process_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while _read_exit(pdir / "exit") is None:
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.get(process_id)


KILL_SETTLE_S = 5.0  # a SIGKILLed tree's end reaches its status file in milliseconds


def await_recorded_end(pdir: Path, meta: Mapping[str, object]) -> None:
    """After a SIGKILL has ended the command's tree: wait (bounded) until its end is
    recorded, by the waiter or a terminal's relay a moment later, so that the caller
    sees it ended at once (``get``: not running; a second kill: not signalled). Under
    load the record lagged the kill: E2B's ``pty.kill`` said True twice in a row."""
    deadline = time.monotonic() + KILL_SETTLE_S
    while _read_exit(pdir / "exit") is None and time.monotonic() < deadline:
        if not _alive(meta.get("relay_pid")):
            return  # no relay left to record it: get() reports it ended from its leaf
        time.sleep(0.002)


def _meta(pdir: Path) -> dict[str, object]:
    meta: dict[str, object] = json.loads((pdir / "meta.json").read_text())
    return meta


def _read_exit(path: Path) -> int | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    if not text.endswith("\n"):  # not yet written in full
        return None
    return int(text)


def _parent(pid: int) -> int:
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0
    return int(stat_line[stat_line.rfind(")") + 2 :].split()[1])


def _is_launcher(pid: int) -> bool:
    """Launchers run as host root; everything the sandbox runs has its unprivileged uid."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == 0
    except OSError:
        return False


def _signal_number(sig: int | str) -> int:
    if isinstance(sig, int):
        return int(signals.Signals(sig))
    name = sig.upper() if sig.upper().startswith("SIG") else "SIG" + sig.upper()
    if name not in _SIGNALS:
        raise InvalidRequest(f"unknown signal {sig!r}; use a name like SIGTERM or a number")
    return int(_SIGNALS[name])


def _alive(pid: object) -> bool:
    """Whether the daemon relaying an adopted command still runs (true when none does)."""
    if not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(path: Path, size: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read()
    except FileNotFoundError:
        return b""


def _move_processes(unified: Path, old: str, new: str) -> None:
    """Move every process of cgroup leaf ``old`` to ``new`` (repeated: one may fork)."""
    for _ in range(10):
        pids = (unified / old / "cgroup.procs").read_text().split()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                (unified / new / "cgroup.procs").write_text(pid)


def _relay(proc: Process, pdir: Path, fifo: int, ids: tuple[int, int]) -> None:
    """Copy an adopted command's output to its files and the FIFO to its stdin until it
    exits; then record its exit like the launcher does (128 + signal when killed).

    The copying runs with the sandbox user's credentials (``ids``), as the command's own
    writes to a background process's files would: no capability lets it past the disk's
    reserved blocks."""
    assert proc.stdout is not None and proc.stderr is not None
    sinks = {  # opened as root: the directory is the daemon's
        proc.stdout.fileno(): os.open(pdir / "stdout", os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC),
        proc.stderr.fileno(): os.open(pdir / "stderr", os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC),
    }
    with sandbox_credentials(*ids):
        _copy(proc, sinks, fifo)
    status = proc.wait()
    code = 128 - status if status < 0 else status
    (pdir / "exit.tmp").write_text(f"{code}\n")
    (pdir / "exit.tmp").rename(pdir / "exit")


def _copy(proc: Process, sinks: dict[int, int], fifo: int) -> None:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin = proc.stdin.fileno()
    os.set_blocking(stdin, False)
    pending = b""
    pidfd = exit_fd(proc)
    sel = selectors.DefaultSelector()
    try:
        for fd in (*sinks, fifo, pidfd):
            sel.register(fd, selectors.EVENT_READ)
        exited_at: float | None = None
        while not (exited_at and (not sinks or time.monotonic() - exited_at > 0.05)):
            for key, _ in sel.select(0.05 if exited_at else None):
                fd = int(key.fd)
                if fd == pidfd:
                    sel.unregister(pidfd)
                    exited_at = time.monotonic()
                elif fd == stdin:  # room again in the command's stdin
                    pending = _push(stdin, pending)
                    if not pending:
                        sel.unregister(stdin)
                elif fd == fifo:
                    with contextlib.suppress(BlockingIOError):
                        had = bool(pending)
                        pending = _push(stdin, pending + os.read(fifo, 65536))
                        if pending and not had:
                            sel.register(stdin, selectors.EVENT_WRITE)
                else:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if chunk:
                        os.write(sinks[fd], chunk)
                    else:
                        sel.unregister(fd)
                        os.close(sinks.pop(fd))
    finally:
        sel.close()
        for fd in (pidfd, fifo, *sinks.values()):
            os.close(fd)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                pipe.close()


def _push(fd: int, data: bytes) -> bytes:
    """Write what fits into a non-blocking pipe; returns the rest (dropped if it closed)."""
    try:
        return data[os.write(fd, data) :] if data else b""
    except BlockingIOError:
        return data
    except BrokenPipeError:
        return b""


def run_detached(
    argv: list[str], env: dict[str, str], pdir: Path, stdin_fd: int, failed: str
) -> None:
    """Run ``argv``, which detaches the background command and returns, with ``stdin_fd``
    (closed after) as its stdin and the process directory's output files as stdout and
    stderr; OSError(EIO, ``failed``) when it exits non-zero (before the command forked)."""
    try:
        out_fd = os.open(pdir / "stdout", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        err_fd = os.open(pdir / "stderr", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        os.close(stdin_fd)
        raise
    try:
        launched = subprocess.run(
            argv, stdin=stdin_fd, stdout=out_fd, stderr=err_fd, env=env,
            close_fds=True, start_new_session=True, check=False,
        )  # fmt: skip
        if launched.returncode != 0:
            raise OSError(errno.EIO, failed)
    finally:
        for fd in (stdin_fd, out_fd, err_fd):
            os.close(fd)
