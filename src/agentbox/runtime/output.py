"""Bounded capture of a stream: the head and the tail are kept, the middle is counted.

A capture may also keep the whole stream (up to a hard maximum) in a spool, so that a
caller can save it where the agent can page it when the kept part was cut.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

TYPE_CHECKING = False  # typing is loaded already, but this module never needs it
if TYPE_CHECKING:
    import selectors  # its callers' selector (a result over the home's socket needs none)
    import tempfile

OutputCallback = Callable[[str, bytes], None]
# (stream name, its chunks) -> the sandbox path the full stream was written to.
OutputSaver = Callable[[str, Iterable[bytes]], str]
_SPOOL_IN_MEMORY = 1 << 20  # beyond this the spool is a host temp file (bounded by keep)


def read_ready(fd: int) -> bytes | None:
    """Read what a selector found readable on a non-blocking pipe or pty: the bytes, b""
    at its end (EOF, or EIO on a pty whose last slave closed), None if nothing was there
    after all."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def read_events(
    sel: selectors.BaseSelector, events: Iterable[tuple[selectors.SelectorKey, int]], exit_fd: int
) -> tuple[float | None, list[tuple[int, bytes]]]:
    """Handle what ``sel.select`` returned while pumping a command's output until its
    ``exit_fd`` (a pidfd) fires: the time it fired, if it did now (it is unregistered),
    and each stream's chunk as ``(fd, bytes)``, b"" once it ended (it is unregistered)."""
    exited: float | None = None
    chunks: list[tuple[int, bytes]] = []
    for key, _ in events:
        fd = int(key.fd)
        if fd == exit_fd:
            sel.unregister(exit_fd)
            exited = time.monotonic()
            continue
        chunk = read_ready(fd)
        if chunk is None:
            continue
        if not chunk:
            sel.unregister(fd)
        chunks.append((fd, chunk))
    return exited, chunks


class BoundedCapture:
    """Keeps at most ``limit`` bytes: the first half and the last half of what was fed,
    cut at line ends when a line end is near. ``keep`` > 0 also spools the first ``keep``
    bytes of the whole stream for :meth:`saved_chunks`."""

    def __init__(
        self, limit: int, name: str = "", listener: OutputCallback | None = None, keep: int = 0
    ) -> None:
        self.name = name
        self.listener = listener
        self.limit = max(limit, 0)
        self._head_limit = self.limit // 2
        self._tail_limit = self.limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self.lines = 0
        self.keep = max(keep, 0)
        self._spool: tempfile.SpooledTemporaryFile[bytes] | None = None
        if self.keep:  # closed by close()
            import tempfile  # here: only a kept stream spools (no one-shot command)

            self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115
        self._spooled = 0

    def feed(self, data: bytes) -> None:
        if self.listener is not None:
            self.listener(self.name, data)
        self.total += len(data)
        self.lines += data.count(b"\n")
        if self._spool is not None and self._spooled < self.keep:
            part = data[: self.keep - self._spooled]
            self._spool.write(part)
            self._spooled += len(part)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data and self._tail_limit:
            self._tail += data
            if len(self._tail) > 2 * self._tail_limit:  # trim in batches, not per read
                del self._tail[: len(self._tail) - self._tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    @property
    def saved_complete(self) -> bool:
        """Whether the spool holds the whole stream (else its first ``keep`` bytes)."""
        return self.total <= self.keep

    def saved_chunks(self) -> Iterator[bytes]:
        """The spooled bytes, from the start, in chunks."""
        if self._spool is None:
            return
        self._spool.seek(0)
        while chunk := self._spool.read(1 << 20):
            yield chunk

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def value(self, note: str = "") -> bytes:
        """The kept bytes; when truncated, a marker line says what was cut (and ``note``)."""
        tail = bytes(self._tail[-self._tail_limit :]) if self._tail_limit else b""
        if not self.truncated:
            return bytes(self._head) + tail
        head = bytes(self._head)
        # Cut at line ends when one is in the outer half: whole lines read better.
        end = head.rfind(b"\n")
        if end >= len(head) // 2:
            head = head[: end + 1]
        start = tail.find(b"\n")
        if 0 <= start < len(tail) // 2:
            tail = tail[start + 1 :]
        dropped = self.total - len(head) - len(tail)
        dropped_lines = self.lines - head.count(b"\n") - tail.count(b"\n")
        what = self.name or "output"
        marker = f"[agentbox: {dropped} bytes ({dropped_lines} lines) of {what} cut here"
        marker += f"; {note}]" if note else "]"
        sep = b"" if head.endswith(b"\n") or not head else b"\n"
        return head + sep + marker.encode() + b"\n" + tail


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one command. ``exit_code`` comes from waitpid on the host."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    exit_code: int
    timed_out: bool
    truncated: bool
    duration_ms: float
    signal: int | None = None
    stdout_total: int = 0
    stderr_total: int = 0
    # Sandbox paths holding the full streams when they were cut (and could be saved).
    stdout_file: str | None = None
    stderr_file: str | None = None
    # The command blocked reading its stdin: what it last printed, and (when it was kept
    # running as a background process) its id; exit_code is then -1.
    waiting_for_input: bool = False
    prompt: str | None = None
    process_id: str | None = None

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, object]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "duration_ms": round(self.duration_ms, 3),
            "signal": self.signal,
            "stdout_bytes_total": self.stdout_total,
            "stderr_bytes_total": self.stderr_total,
            "stdout_file": self.stdout_file,
            "stderr_file": self.stderr_file,
            "waiting_for_input": self.waiting_for_input,
            "prompt": self.prompt,
            "process_id": self.process_id,
        }
