"""Finishing destroyed sandboxes after their caller was answered (a long-lived gateway).

A destroy kills every process of the sandbox first (its cgroup); what is left is host
bookkeeping that no caller waits on in a gateway: two unmounts (each a journal commit of
the sandbox's disk, flushed through its loop device: 2-3 ms with nothing written, tens of
ms after writes), the disk image, the network link's end, the record. The gateway answers
once the processes are dead and this finishes the rest on one thread of its own, in
order. Until it has, the sandbox is "destroying": this process reports it as gone
(Runtime.get, list, exists), and its slot, uid and link name stay taken, so nothing new
can collide with what is being removed. A gateway stopping waits for them (``drain``);
one killed meanwhile leaves "destroying" records that recovery finishes at the next start.

In-process SDK scripts and the CLI finish a destroy before it returns: their process may
exit right after, and their callers expect the host clean.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from agentbox.errors import AgentboxError

log = logging.getLogger(__name__)


class Teardowns:
    """Host-side ends of destroyed sandboxes, finished in submission order."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def pending(self, sandbox_id: str) -> bool:
        """Whether ``sandbox_id`` was destroyed and its host side is still being removed."""
        with self._lock:
            return sandbox_id in self._pending

    def pending_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._pending)

    def submit(self, sandbox_id: str, finish: Callable[[], None]) -> None:
        with self._lock:
            if self._executor is None:  # a thread only once something is destroyed
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="agentbox-teardown")
            self._pending.add(sandbox_id)
            self._executor.submit(self._run, sandbox_id, finish)

    def _run(self, sandbox_id: str, finish: Callable[[], None]) -> None:
        try:
            finish()
        except (OSError, AgentboxError) as e:  # its record is in state "error" (finish)
            log.warning("sandbox %s: host-side removal failed: %s", sandbox_id, e)
        except Exception:  # a bug: never lose the thread over it
            log.exception("sandbox %s: host-side removal failed", sandbox_id)
        finally:
            with self._lock:
                self._pending.discard(sandbox_id)

    def drain(self) -> None:
        """Wait until every submitted sandbox is removed; later submits start a new thread."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
