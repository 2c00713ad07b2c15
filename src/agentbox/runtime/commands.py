"""Run commands in a live sandbox with exactly the confinement of its first process.

Every command goes through ``agentbox-nsexec enter``: it joins a fresh per-command leaf
cgroup of the sandbox, every namespace of the sandbox's init, and applies the same uid,
capability, no_new_privs and seccomp settings before exec. The launcher is our child,
so the exit status we report comes from ``waitpid`` on the host. Or, when the sandbox's
resident launcher answers (``runtime.resident``; started with the sandbox, or by a
command that finds none), that launcher clones the command into the same leaf with the
same confinement and reports the status it got from ``waitpid`` (host code, out of the
sandbox's reach).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import posixpath
import selectors
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, ClassVar

from agentbox.digest import token_hex
from agentbox.errors import AgentboxError, InvalidRequest, LimitExceeded, SandboxError
from agentbox.fsutil import exec_text, required_text, stdin_bytes
from agentbox.isolation.cgroups import SandboxCgroup
from agentbox.runtime import enter_argv, resident
from agentbox.runtime.enter_argv import WORKSPACE as WORKSPACE
from agentbox.runtime.enter_argv import base_env
from agentbox.runtime.host import LaunchPaths, SandboxHost
from agentbox.runtime.output import (
    BoundedCapture,
    CommandResult,
    OutputCallback,
    OutputSaver,
    read_events,
)
from agentbox.runtime.prompts import StreamId, prompt_text, stream_id, waiting_for_input
from agentbox.runtime.requests import RunRequest, coerce

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from agentbox.runtime.enter_argv import EnterOptions

LAUNCH_FAILED = 125
_TIOCSPTLCK = 0x40045431
_TIOCGPTPEER = 0x5441
_LAUNCH_PREFIX = b"agentbox-nsexec: "
_DRAIN_AFTER_EXIT_S = 0.05
# How a foreground command ended; RUNNING is the exit code of one still running (adopted).
EXITED, TIMED_OUT, WAITING = "exited", "timed_out", "waiting"
RUNNING = -1
# A command is found waiting for input after this long without output, checked this often.
INPUT_QUIET_S = 0.5
INPUT_POLL_S = 0.2
_RECENT_BYTES = 4096
FOREGROUND_LEAF = "c"  # leaves of commands someone waits on; "p": background processes
DEFAULT_SHELL = "/bin/bash"


class Cancellation:
    """Cancels a foreground command from another thread (a client that gave up on the
    call): its cgroup leaf is killed, its whole tree with it, and ``run`` returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kill: Callable[[], None] | None = None
        self.cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._kill is not None:
                self._kill()

    def bind(self, kill: Callable[[], None] | None) -> None:
        """What ``cancel`` kills from now on (None: nothing; the command is over)."""
        with self._lock:
            self._kill = kill
            if kill is not None and self.cancelled:
                kill()


class ResidentProcess:
    """A command the sandbox's resident launcher started, with what the runner and the
    process table use of a ``Popen``: its pipes and ``wait``."""

    def __init__(
        self,
        started: resident.Started,
        stdin: IO[bytes] | None,
        stdout: IO[bytes] | None,
        stderr: IO[bytes] | None,
    ) -> None:
        self.started = started
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr

    def wait(self) -> int:
        return self.started.wait()


Process = subprocess.Popen[bytes] | ResidentProcess


def exit_fd(proc: Process) -> int:
    """A new fd that polls readable once ``proc`` ended (the caller closes it)."""
    if isinstance(proc, ResidentProcess):
        return proc.started.exit_fd()
    return os.pidfd_open(proc.pid)


@dataclass(frozen=True)
class LiveCommand:
    """A foreground command still running, its pipes open, handed over to an adopter."""

    proc: Process
    argv: list[str]
    cwd: str | None
    leaf: str
    out: BoundedCapture
    err: BoundedCapture


Adopter = Callable[[LiveCommand], str]  # keeps the command running; returns its process id


def launch_error(e: OSError) -> AgentboxError:
    """A typed error for an OSError raised while starting a command (never a host path)."""
    if e.errno == errno.E2BIG:
        return InvalidRequest(
            "the command line or environment is too large (each argument and variable must "
            "stay under 128 KiB); pass large data through stdin or a file instead"
        )
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return LimitExceeded(
            "the sandbox's disk is full; free space (e.g. rm files in /workspace or /tmp) and retry"
        )
    return SandboxError(f"could not start the command: {e.strerror}")


def launch_failure(status: int, stderr: bytes) -> AgentboxError | None:
    """The error for a launcher that could not start the command (it exits 125 and says
    why on stderr), or None when the command ran."""
    if status != LAUNCH_FAILED or not stderr.startswith(_LAUNCH_PREFIX):
        return None
    message = stderr[len(_LAUNCH_PREFIX) :].decode(errors="replace").strip()
    if message.startswith("cwd "):
        return InvalidRequest(f"{message}; pass a cwd that exists in the sandbox (e.g. /workspace)")
    return SandboxError(f"could not start the command in the sandbox: {message}")


def absolute_cwd(cwd: str | None) -> str | None:
    """A command's cwd checked, a relative one taken from /workspace (None: the default)."""
    if cwd is not None:
        required_text(cwd, "cwd", f"pass a directory, e.g. {WORKSPACE}")
    if cwd is not None and not cwd.startswith("/"):  # relative: to /workspace, as files
        cwd = posixpath.normpath(posixpath.join(WORKSPACE, cwd))
    return cwd


def shell_argv(command: str) -> list[str]:
    return [DEFAULT_SHELL, "-c", exec_text(command, "the command")]


def normalise_argv(command: str | Sequence[str]) -> list[str]:
    """A string runs through bash; a list is an argv run as is."""
    if isinstance(command, str):
        required_text(command, "the command", "pass a shell string or an argv list", blank=True)
        return shell_argv(command)
    argv = [str(a) for a in command]
    required_text(argv[0] if argv else "", "the argv's program", "pass at least its name")
    for i, arg in enumerate(argv):
        exec_text(arg, f"argument {i}")
    return argv


@dataclass(frozen=True)
class _Job:
    """A foreground command as launched: how to make the host argv and its environment
    (``launch``: only when no resident launcher takes it), the command's environment, the
    input to feed it, its limit in seconds and its cgroup leaf (what pipes and a pty share);
    the command itself and its cwd, for the resident launcher."""

    launch: Callable[[], tuple[list[str], dict[str, str]]]
    env: dict[str, str]
    stdin: bytes | None
    timeout: float | None
    leaf: str
    argv: list[str]
    cwd: str | None


class CommandRunner:
    # Whether foreground commands may go through the sandbox's resident launcher.
    uses_resident: ClassVar[bool] = True

    def __init__(
        self,
        paths: LaunchPaths,
        host: SandboxHost,
        cgroup: SandboxCgroup,
        init_pid: int,
        sandbox_env: Mapping[str, str],
    ) -> None:
        self.paths = paths
        self.host = host
        self.cgroup = cgroup
        self.init_pid = init_pid
        self.sandbox_env = dict(sandbox_env)

    # building blocks ------------------------------------------------------------------
    def environment(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = base_env(self.host.hostname)
        merged.update(self.sandbox_env)
        for key, value in (env or {}).items():
            if not key or "=" in key:
                raise InvalidRequest(f"invalid environment variable name: {key!r}")
            exec_text(key, "an environment variable name")
            merged[key] = exec_text(str(value), f"environment variable {key}")
        return merged

    def launcher_argv(
        self, argv: list[str], leaf: str, cwd: str | None, **options: Unpack[EnterOptions]
    ) -> list[str]:
        """``enter_argv.launcher_argv`` for this sandbox (``cwd`` checked, a relative one
        taken from /workspace); ``options`` as there."""
        return enter_argv.launcher_argv(
            str(self.paths.nsexec),
            self.cgroup.leaf_dir(leaf),
            self.cgroup.v1_dirs(),
            self.init_pid,
            str(self.paths.seccomp),
            absolute_cwd(cwd),
            argv,
            **options,
        )

    def browser_launch(
        self, chromium: str, leaf: str, cwd: str, env: dict[str, str]
    ) -> dict[str, Any]:
        """How ``browser.launch`` runs Chromium here: ``agentbox-nsexec enter`` keeping
        Playwright's DevTools pipe (fds 3 and 4, the only fds besides stdio), and the
        environment it hands on to Chromium."""
        argv = self.launcher_argv([chromium], leaf, cwd)
        return {"nsexec_argv": [argv[0], "enter", "--keep-fds", "2", *argv[2:-1]], "env": env}

    def end_leaf(self, leaf: str) -> None:
        """Kill a command's tree and drop what it left (the browser's, on close)."""
        self._finish_leaf(leaf, kill=True)

    def new_leaf(self, kind: str = FOREGROUND_LEAF) -> str:
        """A fresh cgroup leaf for one command; ``kind`` is the first letter of its name
        (foreground commands' leaves are how the idle watcher sees a command running)."""
        return self.cgroup.new_leaf(kind + token_hex(6))

    def command_launch(
        self, argv: list[str], leaf: str, cwd: str | None, env: dict[str, str], pty: bool
    ) -> tuple[list[str], dict[str, str]]:
        """The host command that runs ``argv`` in the sandbox, and its environment (the
        launcher hands its own environment to the command)."""
        return self.launcher_argv(argv, leaf, cwd, ctty=pty), env

    def kill_tree(self, leaf: str) -> None:
        """SIGKILL one command's whole process tree, ``setsid`` daemons included."""
        self.cgroup.kill_leaf(leaf)

    def kill_foreground(self) -> None:
        """Kill every foreground command running now (each one's tree), whoever started
        it; background processes live on (a task's cancellation)."""
        for leaf in self.cgroup.populated_leaves(FOREGROUND_LEAF):
            self.cgroup.kill_leaf(leaf)

    # foreground -----------------------------------------------------------------------
    def run(
        self,
        request: RunRequest | str | Sequence[str],
        *,
        on_output: OutputCallback | None = None,
        save: OutputSaver | None = None,
        save_max_bytes: int = 0,
        detect_input: bool = False,
        adopt: Adopter | None = None,
        cancel: Cancellation | None = None,
        **fields: Any,
    ) -> CommandResult:
        """Run to completion. On timeout the command's whole process tree is killed.
        ``request`` is a ``RunRequest``, or a command with the request's ``fields``.

        ``on_output(stream, chunk)`` sees every chunk as it arrives ("stdout"/"stderr"),
        uncapped, for callers that stream (the CLI, SSE); the result stays capped.
        With ``save``, a stream cut at the cap is saved whole (its first ``save_max_bytes``)
        by ``save(stream, chunks)``, and the result and the cut's marker name the path.
        With ``detect_input`` (pipes, no ``stdin``) the command's stdin is an open, empty
        pipe, and a command found waiting on it returns early (``waiting_for_input``):
        handed to ``adopt``, which keeps it running and returns its process id, or killed.
        ``cancel`` kills it (its cgroup leaf) from another thread while it runs.
        """
        request = coerce(RunRequest, request, fields)
        argv = normalise_argv(request.command)
        cwd, env, stdin, pty = request.cwd, request.env, request.stdin, request.pty
        timeout, max_output_bytes = request.timeout, request.max_output_bytes
        stdin_data = None if stdin is None else stdin_bytes(stdin)
        environment = self.environment(env)
        leaf = self.new_leaf()
        keep = save_max_bytes if save is not None else 0
        out = BoundedCapture(max_output_bytes, "stdout", on_output, keep)
        err = BoundedCapture(max_output_bytes, "stderr", on_output, keep)
        started = time.monotonic()
        if cancel is not None:
            cancel.bind(lambda: self.kill_tree(leaf))
        try:
            try:
                job = _Job(
                    lambda: self.command_launch(argv, leaf, cwd, environment, pty),
                    environment, stdin_data, timeout, leaf, argv, cwd,
                )  # fmt: skip
                if pty:
                    status, outcome = self._run_pty(job, out)
                    recent, process_id = b"", None
                else:
                    watch = detect_input and not stdin_data
                    proc, outcome, recent = self._run_pipes(job, out, err, watch)
                    status, process_id = self._settle(
                        proc, outcome, adopt, argv, cwd, leaf, out, err
                    )
            except OSError as e:
                self._finish_leaf(leaf, kill=True)
                raise launch_error(e) from None
            if process_id is None:
                self._finish_leaf(leaf, kill=outcome != EXITED)
            elapsed = time.monotonic() - started
            result = self._result(out, err, status, outcome == TIMED_OUT, elapsed, save)
            if outcome != WAITING:
                return result
            return dataclasses.replace(
                result,
                waiting_for_input=True,
                prompt=prompt_text(recent),
                process_id=process_id,
                exit_code=RUNNING if process_id else result.exit_code,
            )
        finally:
            if cancel is not None:  # an adopted command runs on: no longer ours to kill
                cancel.bind(None)
            out.close()
            err.close()

    def _settle(
        self,
        proc: Process,
        outcome: str,
        adopt: Adopter | None,
        argv: list[str],
        cwd: str | None,
        leaf: str,
        out: BoundedCapture,
        err: BoundedCapture,
    ) -> tuple[int, str | None]:
        """The launcher's status, or (a command waiting for input handed to ``adopt``) its
        new process id; a waiting command nobody adopts is killed."""
        if outcome == WAITING and adopt is not None:
            return 0, adopt(LiveCommand(proc, argv, cwd, leaf, out, err))
        if outcome == WAITING:
            self.kill_tree(leaf)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return proc.wait(), None

    def _run_pipes(
        self, job: _Job, out: BoundedCapture, err: BoundedCapture, watch: bool
    ) -> tuple[Process, str, bytes]:
        with_stdin = bool(job.stdin or watch)
        proc: Process | None = self._resident_pipes(job, with_stdin)
        if proc is None:
            launcher, env = job.launch()
            proc = subprocess.Popen(
                launcher,
                stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                close_fds=True,
            )
            self.start_resident()
        assert proc.stdout is not None and proc.stderr is not None
        streams: dict[IO[bytes], BoundedCapture] = {proc.stdout: out, proc.stderr: err}
        stdin_id = stream_id(proc.stdin.fileno()) if watch and proc.stdin is not None else None
        outcome, recent = self._pump(proc, streams, job.stdin, job.timeout, job.leaf, stdin_id)
        return proc, outcome, recent

    def _run_pty(self, job: _Job, out: BoundedCapture) -> tuple[int, str]:
        master, slave = self.open_pty()
        try:
            started = self._launch(job, (slave, slave, slave), ctty=True)
            proc: Process
            if started is not None:
                proc = ResidentProcess(started, None, None, None)
            else:
                launcher, env = job.launch()
                proc = subprocess.Popen(
                    launcher, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
                )
                self.start_resident()
        finally:
            os.close(slave)
        master_file = os.fdopen(master, "r+b", buffering=0)
        with master_file:
            if job.stdin:
                master_file.write(job.stdin)
            outcome, _ = self._pump(proc, {master_file: out}, None, job.timeout, job.leaf, None)
        return proc.wait(), outcome

    # the resident launcher ----------------------------------------------------------------
    def _launch(
        self, job: _Job, stdio: tuple[int, int, int], ctty: bool = False
    ) -> resident.Started | None:
        """Start the job through the resident launcher; None: none answers (old path)."""
        if not self.uses_resident:
            return None
        return resident.launch(
            resident.socket_path(str(self.host.dir), str(self.paths.nsexec)),
            job.argv,
            job.env,
            absolute_cwd(job.cwd) or WORKSPACE,
            ctty,
            stdio,
            self.cgroup.leaf_dir(job.leaf),
        )

    def _resident_pipes(self, job: _Job, with_stdin: bool) -> ResidentProcess | None:
        """The job started by the resident launcher with pipes, as ``_run_pipes``'s Popen
        would have them, or None (old path)."""
        if not self.uses_resident:
            return None
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        in_r, in_w = os.pipe() if with_stdin else (null, -1)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started = None
        try:
            started = self._launch(job, (in_r, out_w, err_w))
        finally:
            for fd in {null, in_r, out_w, err_w}:
                os.close(fd)
            if started is None:  # the old path, or an error (E2BIG): our ends go too
                for fd in (in_w, out_r, err_r):
                    if fd >= 0:
                        os.close(fd)
        if started is None:
            return None
        # Unbuffered: only their fds are used (read, written, polled), and a buffered file
        # costs an isatty ioctl and a seek each.
        stdin = os.fdopen(in_w, "wb", buffering=0) if in_w >= 0 else None
        out, err = os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0)
        return ResidentProcess(started, stdin, out, err)

    def start_resident(self) -> None:
        """Start the sandbox's resident launcher for the next commands (best effort)."""
        if not self.uses_resident:
            return
        resident.start(
            resident.start_argv(
                str(self.paths.nsexec),
                str(self.host.dir),
                self.cgroup.leaf_dir(resident.LEAF),
                self.cgroup.v1_dirs(),
                self.init_pid,
                str(self.paths.seccomp),
            )
        )

    def open_pty(self) -> tuple[int, int]:
        """A pty pair from the sandbox's own devpts, so ``tty`` and ``ttyname`` work inside."""
        # /dev/pts/ptmx, not /dev/ptmx: /dev is the agent's tmpfs, and an absolute symlink
        # planted there would resolve against the host's root (we open as host root).
        master = os.open(
            f"/proc/{self.init_pid}/root/dev/pts/ptmx",
            os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW,
        )
        try:
            fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))
            # TIOCGPTPEER opens the peer through the master: no path lookup to race.
            slave = fcntl.ioctl(master, _TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY)
        except OSError:
            os.close(master)
            raise
        return master, slave

    def _pump(
        self,
        proc: Process,
        streams: dict[IO[bytes], BoundedCapture],
        stdin: bytes | None,
        timeout: float | None,
        leaf: str,
        stdin_id: StreamId | None,
    ) -> tuple[str, bytes]:
        """Read output until the command exits, times out, or (``stdin_id``: its stdin)
        waits for input. Returns how it ended and the last output (for a prompt).

        A background child may keep a pipe open after the command ends, so we stop on the
        launcher's exit (pidfd), not on EOF, after draining what is already buffered.
        A command waiting for input keeps its pipes open: the caller takes them over.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pidfd = exit_fd(proc)
        # poll(2), not epoll: for four fds it is one syscall a wait, where an epoll set
        # costs its creation, a syscall per registration and its close, on every command.
        sel = selectors.PollSelector()
        by_fd = {stream.fileno(): stream for stream in streams}
        outcome = EXITED
        exited_at: float | None = None
        last_output = time.monotonic()
        recent = bytearray()
        try:
            for fd in by_fd:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            sel.register(pidfd, selectors.EVENT_READ)
            if stdin and proc.stdin is not None:
                self._feed_stdin(proc.stdin, stdin)
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    outcome = TIMED_OUT
                    deadline = None
                    self.kill_tree(leaf)  # the tree, setsid daemons included
                if exited_at is not None and (not by_fd or now - exited_at > _DRAIN_AFTER_EXIT_S):
                    break
                check_at = None
                if stdin_id is not None and exited_at is None and outcome == EXITED:
                    check_at = max(last_output + INPUT_QUIET_S, now)
                    if check_at == now and waiting_for_input(self.cgroup.unified / leaf, stdin_id):
                        outcome = WAITING
                        break
                    if check_at == now:
                        check_at = now + INPUT_POLL_S
                if exited_at is not None:
                    wait: float | None = _DRAIN_AFTER_EXIT_S
                else:
                    ends = [t for t in (deadline, check_at) if t is not None]
                    wait = max(0.0, min(ends) - now) if ends else None
                exited, chunks = read_events(sel, sel.select(wait), pidfd)
                exited_at = exited if exited is not None else exited_at
                for fd, chunk in chunks:
                    if chunk:
                        streams[by_fd[fd]].feed(chunk)
                        last_output = time.monotonic()
                        recent += chunk
                        del recent[:-_RECENT_BYTES]
                    else:
                        del by_fd[fd]
        finally:
            sel.close()
            os.close(pidfd)
            if outcome != WAITING:
                for stream in streams:
                    with contextlib.suppress(OSError):
                        stream.close()
        return outcome, bytes(recent)

    @staticmethod
    def _feed_stdin(pipe: IO[bytes], data: bytes) -> None:
        # Small inputs go in one write; a command that does not read its stdin must not
        # block us, so the pipe is non-blocking and the rest is dropped with EPIPE/EAGAIN.
        os.set_blocking(pipe.fileno(), False)
        view = memoryview(data)
        deadline = time.monotonic() + 5.0
        try:
            while view and time.monotonic() < deadline:
                try:
                    n = os.write(pipe.fileno(), view)
                    view = view[n:]
                except BlockingIOError:
                    time.sleep(0.001)
        except BrokenPipeError:
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    def finish_leaf(self, leaf: str) -> None:
        """A command run by the caller itself ended (``agentbox sandbox shell``)."""
        self._finish_leaf(leaf, kill=False)

    def _finish_leaf(self, leaf: str, kill: bool) -> None:
        """Drop the command's leaf cgroup; processes it left running keep it until they end."""
        node = self.cgroup.unified / leaf
        if kill:
            self.cgroup.remove_leaf(leaf)
            return
        with contextlib.suppress(OSError):
            node.rmdir()  # EBUSY while background children live: kept, swept on destroy

    @staticmethod
    def _result(
        out: BoundedCapture,
        err: BoundedCapture,
        status: int,
        timed_out: bool,
        elapsed: float,
        save: OutputSaver | None,
    ) -> CommandResult:
        stderr = err.value()
        failure = launch_failure(status, stderr)
        if failure is not None:
            raise failure
        signum = -status if status < 0 else None
        exit_code = 128 + signum if signum is not None else status
        (stdout, stdout_file), (stderr, stderr_file) = _saved(out, save), _saved(err, save)
        return CommandResult(
            stdout_bytes=stdout,
            stderr_bytes=stderr,
            exit_code=exit_code,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
            duration_ms=elapsed * 1000,
            signal=signum,
            stdout_total=out.total,
            stderr_total=err.total,
            stdout_file=stdout_file,
            stderr_file=stderr_file,
        )


def _saved(capture: BoundedCapture, save: OutputSaver | None) -> tuple[bytes, str | None]:
    """The capture's kept bytes, and where its full stream was saved when it was cut."""
    if save is None or not capture.truncated:
        return capture.value(), None
    try:
        path = save(capture.name, capture.saved_chunks())
    except AgentboxError as e:  # e.g. the sandbox's disk is full: the cut result stands
        return capture.value(f"the full {capture.name} could not be saved: {e.message}"), None
    if capture.saved_complete:
        note = f"the full {capture.name} is in {path} (read it by offset and length)"
    else:
        note = f"its first {capture.keep} bytes are in {path} (the saving cap)"
    return capture.value(note), path
