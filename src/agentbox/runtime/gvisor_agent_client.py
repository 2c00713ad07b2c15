"""The host side of a gVisor-tier sandbox's exec agent (``isolation/gvisor_agent.c``).

One command is one connection to the agent's socket (a host unix socket the agent made
with runsc ``--host-uds=create``, in a directory only root may change once the sandbox
is up): the request, then output frames and the status. The agent runs inside the
sandbox as the sandbox user, so every reply is untrusted input here: a frame's type and
length are checked before anything is read into memory, output goes to the caller's
bounded captures, and a broken reply is a typed error, never a guess. What code in the
sandbox can do at worst is lie about its own sandbox's command (its status, its output),
which it could already print; it cannot reach the host through this channel.

Wire format: see the agent's header comment (frames ``[type u8][len u32 LE][data]``).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentbox.errors import InvalidRequest, SandboxError
from agentbox.runtime.output import BoundedCapture

SOCKET_NAME = "agent.sock"
IN_SANDBOX_DIR = "/.agentbox/exec"  # where the host's agent directory is bound
MAX_STDIN = 1 << 20  # more goes through runsc exec, which streams it
MAX_CHUNK = 65536  # the agent sends at most this much output per frame
MAX_MESSAGE = 4096
KILL_GRACE_S = 5.0  # after a kill, the wait for the agent's status
_HEAD = struct.Struct("<BI")
EXITED, TIMED_OUT = "exited", "timed_out"


class AgentUnavailable(Exception):
    """No agent answers (an older sandbox, one restored from a checkpoint): the caller
    runs the command the slow way, with ``runsc exec``."""


def _frame(kind: bytes, data: bytes = b"") -> bytes:
    return _HEAD.pack(kind[0], len(data)) + data


def request(argv: Sequence[str], env: Mapping[str, str], cwd: str, stdin: bytes | None) -> bytes:
    parts = [_frame(b"A", a.encode()) for a in argv]
    parts += [_frame(b"E", f"{k}={v}".encode()) for k, v in env.items()]
    parts.append(_frame(b"C", cwd.encode()))
    if stdin:
        parts.append(_frame(b"I", stdin))
    parts.append(_frame(b"G"))
    return b"".join(parts)


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(str(path))
    except OSError as e:
        sock.close()
        raise AgentUnavailable(str(e)) from None
    return sock


def _malformed(what: str) -> SandboxError:
    return SandboxError(
        f"the sandbox's exec agent sent a malformed reply ({what}); the command's result "
        "is unknown: run it again, or recreate the sandbox"
    )


class _Reader:
    """Frames from the agent, fed by whatever recv returned; sizes checked first."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def frames(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self.buffer += chunk
        out = []
        while len(self.buffer) >= _HEAD.size:
            kind, length = _HEAD.unpack_from(self.buffer)
            limit = {ord("O"): MAX_CHUNK, ord("R"): MAX_CHUNK, ord("F"): MAX_MESSAGE,
                     ord("X"): 4}.get(kind)  # fmt: skip
            if limit is None:
                raise _malformed(f"unknown frame type {kind}")
            if length > limit or (kind == ord("X") and length != 4):
                raise _malformed(f"a frame of {length} bytes")
            if len(self.buffer) < _HEAD.size + length:
                break
            out.append((kind, bytes(self.buffer[_HEAD.size : _HEAD.size + length])))
            del self.buffer[: _HEAD.size + length]
        return out


class AgentCall:
    """One command through the agent. ``kill`` may be called from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self.killed = False

    def kill(self) -> None:
        with self._lock:
            if self.killed:
                return
            self.killed = True
            # An error: the agent is gone or done, nothing left to kill.
            with contextlib.suppress(OSError):
                self.sock.sendall(_frame(b"K"))

    def run(
        self, payload: bytes, timeout: float | None, out: BoundedCapture, err: BoundedCapture
    ) -> tuple[int, str]:
        """Send the request and pump replies; the status (a code, or minus a signal)
        and how the command ended."""
        try:
            with self._lock:  # a kill from another thread waits: no frame cut in two
                self.sock.sendall(payload)
        except OSError as e:
            raise SandboxError(f"could not send the command to the sandbox: {e}") from None
        reader = _Reader()
        outcome = EXITED
        deadline = None if timeout is None else time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    if outcome == EXITED:  # first the kill, then a grace for its status
                        outcome = TIMED_OUT
                        self.kill()
                        deadline = now + KILL_GRACE_S
                    else:
                        return -9, outcome  # the agent does not answer: hang up
                wait = None if deadline is None else max(0.0, deadline - now)
                if not sel.select(wait):
                    continue
                try:
                    chunk = self.sock.recv(1 << 16)
                except OSError as e:
                    raise SandboxError(f"lost the command's connection: {e}") from None
                if not chunk:
                    if self.killed:
                        return -9, outcome
                    raise SandboxError(
                        "the sandbox's exec agent hung up before the command's status "
                        "(the sandbox stopped?); check `agentbox sandbox ls`"
                    )
                for kind, data in reader.frames(chunk):
                    if kind == ord("O"):
                        out.feed(data)
                    elif kind == ord("R"):
                        err.feed(data)
                    elif kind == ord("F"):
                        raise _launch_error(data.decode(errors="replace"))
                    else:
                        return struct.unpack("<i", data)[0], outcome
        finally:
            sel.close()


def _launch_error(message: str) -> Exception:
    if message.startswith("cwd "):
        return InvalidRequest(f"{message}; pass a cwd that exists in the sandbox (e.g. /workspace)")
    return SandboxError(f"could not start the command in the sandbox: {message}")


def kill_all(path: Path) -> None:
    """Every command the agent runs now dies (a task's cancellation); quiet when no
    agent answers (its sandbox runs commands with runsc exec)."""
    try:
        sock = connect(path)
    except AgentUnavailable:
        return
    with sock:
        sock.settimeout(10)
        with contextlib.suppress(OSError):
            sock.sendall(_frame(b"Z") + _frame(b"G"))
            sock.recv(16)  # its 'X': the workers were signalled
