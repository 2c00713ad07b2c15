"""The running sandboxes one ``Runtime`` has looked up, each watched through a pidfd of its
init: the hot path's cache (a hit skips SQLite and /proc)."""

from __future__ import annotations

import os
import select
import threading

from agentbox.isolation.cgroups import SandboxCgroup
from agentbox.runtime.host import SandboxHost, process_start_time
from agentbox.runtime.store import SandboxRecord

Running = tuple[SandboxRecord, SandboxHost, SandboxCgroup]


class LiveSandboxes:
    """Running sandboxes this process has looked up, each watched through a pidfd of its
    init. The fd turns readable when init exits, so an entry never outlives its sandbox
    and cannot be fooled by pid reuse; a hit skips SQLite and /proc on the hot path.
    Whoever changes a sandbox's state in this process calls :meth:`forget`; another
    process can only end a sandbox by killing its init, which the pidfd sees."""

    LIMIT = 256  # fds held at most; a miss only costs the slow path

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Running, int]] = {}
        self._lock = threading.Lock()

    def get(self, sandbox_id: str) -> Running | None:
        with self._lock:  # the poll and a concurrent close must not interleave
            entry = self._entries.get(sandbox_id)
            if entry is None:
                return None
            if not select.select([entry[1]], [], [], 0)[0]:
                return entry[0]
            self._drop(sandbox_id)
            return None

    def add(self, running: Running) -> None:
        record = running[0]
        if record.init_pid is None:
            return
        try:
            pidfd = os.pidfd_open(record.init_pid)
        except OSError:
            return
        # The pid may have been reused between the caller's check and pidfd_open.
        if process_start_time(record.init_pid) != record.init_start_time:
            os.close(pidfd)
            return
        with self._lock:
            self._drop(record.id)
            if len(self._entries) >= self.LIMIT:
                self._drop(next(iter(self._entries)))
            self._entries[record.id] = (running, pidfd)

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._drop(sandbox_id)

    def _drop(self, sandbox_id: str) -> None:
        entry = self._entries.pop(sandbox_id, None)
        if entry is not None:
            os.close(entry[1])
