"""Background processes with handles that outlive the process that started them.

Each process has a directory on the sandbox's disk, *outside* the sandbox's view
(``disk/procs/ID``): ``stdout`` and ``stderr`` (the command writes them through inherited
fds), ``stdin`` (a FIFO, only when asked for), ``meta.json`` and ``exit``, which the
host-side launcher writes after ``waitpid`` — nothing in the sandbox can forge it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import signal as signals
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentbox.errors import InvalidRequest, ProcessNotFound
from agentbox.fsutil import stdin_bytes
from agentbox.runtime.commands import CommandRunner, launch_error, normalise_argv

_SIGNALS = {s.name: s for s in signals.Signals}


@dataclass(frozen=True)
class ProcessInfo:
    id: str
    argv: list[str]
    started_at: float
    running: bool
    exit_code: int | None

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "argv": self.argv,
            "started_at": self.started_at,
            "running": self.running,
            "exit_code": self.exit_code,
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
                f"no background process {process_id} in this sandbox; list them with "
                "processes.list()"
            )
        return path

    def start(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
    ) -> ProcessInfo:
        argv = normalise_argv(command)
        environment = self.runner.environment(env)
        process_id = "p-" + secrets.token_hex(6)
        pdir = self.root / process_id
        leaf = self.runner.new_leaf("p")
        try:
            started = self._launch(pdir, argv, environment, leaf, cwd, stdin)
        except OSError as e:
            self.runner.cgroup.remove_leaf(leaf)
            shutil.rmtree(pdir, ignore_errors=True)
            raise launch_error(e) from None
        return ProcessInfo(process_id, argv, started, True, None)

    def _launch(
        self, pdir: Path, argv: list[str], environment: dict[str, str], leaf: str,
        cwd: str | None, stdin: bool,
    ) -> float:  # fmt: skip
        pdir.mkdir(mode=0o700)
        exit_file = pdir / "exit"
        started = time.time()
        (pdir / "meta.json").write_text(
            json.dumps({"argv": argv, "started_at": started, "leaf": leaf, "cwd": cwd})
        )
        launcher = self.runner.launcher_argv(
            argv, leaf, cwd, exit_file=str(exit_file), setsid=True, detach=True
        )
        if stdin:
            os.mkfifo(pdir / "stdin", 0o600)
            # O_RDWR: opening never blocks, and the reader sees no EOF between writers.
            stdin_fd = os.open(pdir / "stdin", os.O_RDWR | os.O_CLOEXEC)
        else:
            stdin_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        out_fd = os.open(pdir / "stdout", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        err_fd = os.open(pdir / "stderr", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        try:
            # The launcher detaches (--detach): its waiting half outlives this process,
            # and the exit file, not our child status, records how the command ended.
            launched = subprocess.run(
                launcher,
                stdin=stdin_fd,
                stdout=out_fd,
                stderr=err_fd,
                env=environment,
                close_fds=True,
                start_new_session=True,
                check=False,
            )
            if launched.returncode != 0:  # the detaching half failed before it forked
                raise OSError(errno.EIO, "the launcher failed")
        finally:
            for fd in (stdin_fd, out_fd, err_fd):
                os.close(fd)
        return started

    def list(self) -> list[ProcessInfo]:
        if not self.root.exists():
            return []
        return [self.get(p.name) for p in sorted(self.root.iterdir()) if p.name.startswith("p-")]

    def get(self, process_id: str) -> ProcessInfo:
        pdir = self._dir(process_id)
        meta = json.loads((pdir / "meta.json").read_text())
        code = _read_exit(pdir / "exit")
        return ProcessInfo(process_id, meta["argv"], meta["started_at"], code is None, code)

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
        fifo = self._dir(process_id) / "stdin"
        if not fifo.exists() or not stat.S_ISFIFO(fifo.stat().st_mode):
            raise InvalidRequest(
                f"process {process_id} was started without stdin; start it with stdin=True"
            )
        payload = stdin_bytes(data, "data")
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return os.write(fd, payload)
        finally:
            os.close(fd)

    def signal(self, process_id: str, sig: int | str = "SIGTERM") -> None:
        """Signal the command (the launcher's child); SIGKILL takes its whole tree."""
        pdir = self._dir(process_id)
        signum = _signal_number(sig)
        meta = json.loads((pdir / "meta.json").read_text())
        if signum == signals.SIGKILL:
            self.runner.cgroup.remove_leaf(meta["leaf"])
            return
        # The command is the one process of its leaf whose parent is outside the sandbox's
        # pid namespace (the launcher); signal the leaf's processes that are not launchers.
        leaf = self.runner.cgroup.unified / meta["leaf"]
        try:
            pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return
        for pid in pids:
            if _is_launcher(pid):
                continue
            if _parent(pid) in pids and not _is_launcher(_parent(pid)):
                continue  # a descendant; the command itself gets the signal
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

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
