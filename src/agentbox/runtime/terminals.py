"""Background processes on a terminal: a pty of the sandbox's own devpts.

The slave end is the command's stdin, stdout and stderr and its controlling tty (the
launcher's ``--setsid --ctty``); it is made by the sandbox's ``/dev/pts/ptmx``, so
``tty`` names a ``/dev/pts/N`` inside the sandbox. The master end never enters the
sandbox: this daemon holds it (``O_CLOEXEC``, so no other launch inherits it), writes
the input to it, sets its size (``TIOCSWINSZ``: the kernel sends SIGWINCH to the
terminal's foreground process group) and a relay thread copies its output to the
process's ``stdout`` file. TIOCSTI (typing into a terminal) is refused by the sandbox's
seccomp filter, so the command cannot push input into anything, its own pty included.

The relay writes the exit code after the last output, so a reader that sees the exit
has every byte. A terminal lives as long as this daemon: when it exits, the master
closes and the session gets SIGHUP (as a terminal whose window closed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

from agentbox.errors import InvalidRequest, LimitExceeded, ProcessNotFound
from agentbox.runtime.files import sandbox_credentials
from agentbox.runtime.output import read_events

MAX_SIDE = 10_000  # columns or rows
_DRAIN_S = 0.05  # quiet time after the exit before the output counts as complete
_DRAIN_MAX_S = 1.0  # a background child that keeps writing does not hold the relay
_WRITE_WAIT_S = 5.0


class _Master:
    """The master fd; ``lock`` keeps it open while a caller uses it (a closed number
    could be reused by another open before the write)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.lock = fd, threading.Lock()


_lock = threading.Lock()
_masters: dict[str, _Master] = {}  # process directory -> master, while the command runs


def check_size(cols: int, rows: int) -> tuple[int, int]:
    for name, value in (("cols", cols), ("rows", rows)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIDE:
            raise InvalidRequest(f"pty {name} must be an integer from 1 to {MAX_SIDE}")
    return cols, rows


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def attach(pdir: Path, proc: subprocess.Popen[bytes], master: int, ids: tuple[int, int]) -> None:
    """Hold ``master`` for the command ``proc`` launched; relay its output until it ends."""
    os.set_blocking(master, False)
    held = _Master(master)
    with _lock:
        _masters[str(pdir)] = held
    relay = threading.Thread(
        target=_relay, args=(pdir, proc, held, ids), name=f"pty-{pdir.name}", daemon=True
    )
    relay.start()


def _master(pdir: Path) -> _Master:
    with _lock:
        held = _masters.get(str(pdir))
    if held is None:
        raise ProcessNotFound(
            f"the terminal of process {pdir.name} has ended, or is held by another agentbox "
            "process (a terminal lives as long as the daemon that started it)"
        )
    return held


def write(pdir: Path, data: bytes) -> int:
    """Type ``data`` into the terminal (waiting a little while the program catches up)."""
    held = _master(pdir)
    with held.lock:
        if held.fd < 0:
            raise ProcessNotFound(f"the terminal of process {pdir.name} has ended")
        return _write(held.fd, pdir, data)


def _write(fd: int, pdir: Path, data: bytes) -> int:
    view, written = memoryview(data), 0
    deadline = time.monotonic() + _WRITE_WAIT_S
    sel = selectors.DefaultSelector()
    try:
        sel.register(fd, selectors.EVENT_WRITE)
        while written < len(data):
            try:
                written += os.write(fd, view[written:])
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LimitExceeded(
                        f"the terminal of process {pdir.name} took {written} of {len(data)} "
                        "bytes: its program is not reading input; send the rest later"
                    ) from None
                sel.select(left)
            except OSError:  # EIO: the terminal closed while we wrote
                raise ProcessNotFound(f"the terminal of process {pdir.name} has ended") from None
    finally:
        sel.close()
    return written


def resize(pdir: Path, cols: int, rows: int) -> None:
    check_size(cols, rows)
    held = _master(pdir)
    with held.lock:
        if held.fd < 0:
            raise ProcessNotFound(f"the terminal of process {pdir.name} has ended")
        set_size(held.fd, cols, rows)


def _relay(pdir: Path, proc: subprocess.Popen[bytes], held: _Master, ids: tuple[int, int]) -> None:
    """Copy the terminal's output to ``stdout`` until the command ends, then record its
    exit like the launcher does (128 + signal when killed). The copying runs with the
    sandbox user's credentials: the sandbox's disk quota holds."""
    try:
        sink = os.open(pdir / "stdout", os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError:  # the sandbox (and its disk) already went
        sink = -1
    try:
        with sandbox_credentials(*ids):
            _copy(proc, held.fd, sink)
    finally:
        with _lock:
            _masters.pop(str(pdir), None)
        with held.lock:
            os.close(held.fd)
            held.fd = -1
        if sink >= 0:
            os.close(sink)
    status = proc.wait()
    code = 128 - status if status < 0 else status
    with contextlib.suppress(OSError):  # the process directory went with its sandbox
        (pdir / "exit.tmp").write_text(f"{code}\n")
        (pdir / "exit.tmp").rename(pdir / "exit")


def _copy(proc: subprocess.Popen[bytes], master: int, sink: int) -> None:
    pidfd = os.pidfd_open(proc.pid)
    sel = selectors.DefaultSelector()
    try:
        sel.register(master, selectors.EVENT_READ)
        sel.register(pidfd, selectors.EVENT_READ)
        exited_at: float | None = None
        reading = True
        while True:
            if exited_at is not None and (
                not reading or time.monotonic() - exited_at > _DRAIN_MAX_S
            ):
                return
            events = sel.select(_DRAIN_S if exited_at is not None else None)
            if not events and exited_at is not None:
                return  # quiet since the exit: all output is in
            exited, chunks = read_events(sel, events, pidfd)
            exited_at = exited if exited is not None else exited_at
            for _, chunk in chunks:
                if not chunk:
                    reading = False
                elif sink >= 0:
                    with contextlib.suppress(OSError):  # a full disk drops output
                        os.write(sink, chunk)
    finally:
        sel.close()
        os.close(pidfd)
