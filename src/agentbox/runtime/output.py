"""Bounded capture of a stream: the head and the tail are kept, the middle is counted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OutputCallback = Callable[[str, bytes], None]


class BoundedCapture:
    """Keeps at most ``limit`` bytes: the first half and the last half of what was fed."""

    def __init__(self, limit: int, name: str = "", listener: OutputCallback | None = None) -> None:
        self.name = name
        self.listener = listener
        self.limit = max(limit, 0)
        self._head_limit = self.limit // 2
        self._tail_limit = self.limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        if self.listener is not None:
            self.listener(self.name, data)
        self.total += len(data)
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

    def value(self) -> bytes:
        """The kept bytes; when truncated, a marker line says how many bytes were dropped."""
        tail = bytes(self._tail[-self._tail_limit :]) if self._tail_limit else b""
        if not self.truncated:
            return bytes(self._head) + tail
        dropped = self.total - len(self._head) - len(tail)
        marker = f"\n[agentbox: {dropped} bytes truncated]\n".encode()
        return bytes(self._head) + marker + tail


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
        }
