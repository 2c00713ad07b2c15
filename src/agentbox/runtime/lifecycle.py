"""Idleness, and the lifecycle events every transition leaves.

**Activity** — what restarts a sandbox's idle clock:

* any call on the sandbox through the runtime: a tool call, an API request, an SDK call
  (``Runtime.running`` notes it);
* a foreground command in progress, streamed or not: the agent is waiting on its result
  (seen as a populated command cgroup leaf, whoever started it);
* CPU use above a floor: more than ``cpu_floor`` of one core (default 5 %) on average
  since the previous check, so a long test run, a build or a training loop keeps its
  sandbox even when nobody calls it.

Not activity: an open connection or stream on which nothing happens (an MCP session, an
events stream, a following client), a sleeping background process, a paused sandbox.

The clock is the mtime of ``sandboxes/<id>/activity`` (shared by every process using the
home). :class:`IdleWatcher` runs in the gateway: when a running sandbox has been idle for
its ``idle_timeout`` it applies ``on_idle`` (``pause``, ``stop`` or ``destroy``), and it
notices sandboxes that ended on their own (lifetime, OOM, crash) and OOM kills inside.

**Events** — one per transition, in the ``events`` table of ``state.db`` (so a pause by
the CLI reaches a gateway's stream): ``created``, ``paused``, ``resumed``, ``stopped``,
``started``, ``destroyed``, and ``oom`` (a process was OOM-killed; no transition). Each
has a reason: ``operator`` (someone asked), ``idle``, ``lifetime``, ``oom``, ``error``
(it ended without being asked), ``activity`` (a call resumed a paused sandbox),
``pool`` (the warm pool made or replaced one; a claim is a ``created`` with ``from_pool``),
or ``task`` (the batch task it ran ended: ``tasks.on_end``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from agentbox.config.specs import SandboxSpec
from agentbox.errors import AgentboxError
from agentbox.runtime.commands import FOREGROUND_LEAF

if TYPE_CHECKING:
    from agentbox.runtime.runtime import Runtime
    from agentbox.runtime.store import SandboxRecord

log = logging.getLogger(__name__)

EVENT_TYPES = ("created", "pooled", "paused", "resumed", "stopped", "started", "destroyed", "oom")
REASONS = ("operator", "idle", "lifetime", "oom", "error", "activity", "pool", "task")
DEFAULT_CPU_FLOOR = 0.05  # of one core
_DEFAULT_IDLE = SandboxSpec.model_fields["idle_timeout"].default
_DEFAULT_ON_IDLE = SandboxSpec.model_fields["on_idle"].default


class IdleWatcher:
    """Applies idle timeouts and notes sandboxes that ended or lost a process to OOM.

    ``check`` is one pass; ``run`` repeats it every ``interval`` seconds until stopped.
    """

    def __init__(
        self, runtime: Runtime, cpu_floor: float = DEFAULT_CPU_FLOOR, interval: float = 10.0
    ) -> None:
        self.runtime = runtime
        self.cpu_floor = cpu_floor
        self.interval = interval
        self._cpu: dict[str, tuple[float, int]] = {}  # id -> (monotonic, usage µs)
        self._ooms: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="idle-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # one bad pass must not end idle enforcement
                log.exception("idle check failed")

    def check(self) -> list[str]:
        """One pass over the home's sandboxes; returns the ids acted upon."""
        acted = self.runtime.sweep_expired(check_alive=True)  # ended: lifetime/oom/error
        live = set()
        for record in self.runtime.store.list():
            if record.state != "running":
                continue
            live.add(record.id)
            self._note_oom(record)
            if self._busy(record):
                self.runtime.touch(record.id, force=True)
            elif self._idle_for(record) >= _idle_timeout(record) > 0:
                with contextlib.suppress(AgentboxError):  # gone meanwhile: nothing to do
                    self._apply(record)
                    acted.append(record.id)
        for gone in set(self._cpu) - live:
            self._cpu.pop(gone, None)
            self._ooms.pop(gone, None)
        return acted

    def _busy(self, record: SandboxRecord) -> bool:
        cgroup = self.runtime.layout.sandbox(record.id)
        usage = cgroup.cpu_usage_us()
        now = time.monotonic()
        previous = self._cpu.get(record.id)
        self._cpu[record.id] = (now, usage)
        if cgroup.populated_leaves(FOREGROUND_LEAF):
            return True
        if record.isolation == "gvisor":  # no leaves: a running command has its exec file
            execs = self.runtime.home / "sandboxes" / record.id / "exec"
            if any(execs.glob(f"{FOREGROUND_LEAF}*.json")):
                return True
        if previous is None:
            return False
        elapsed = now - previous[0]
        return elapsed > 0 and (usage - previous[1]) / 1e6 >= self.cpu_floor * elapsed

    def _idle_for(self, record: SandboxRecord) -> float:
        marker = self.runtime.home / "sandboxes" / record.id / "activity"
        try:
            last = marker.stat().st_mtime
        except FileNotFoundError:
            last = record.created_at
        return time.time() - last

    def _apply(self, record: SandboxRecord) -> None:
        action = record.spec.get("on_idle", _DEFAULT_ON_IDLE)
        log.info("sandbox %s idle for %.0f s: %s", record.id, self._idle_for(record), action)
        if action == "destroy":
            self.runtime.destroy(record.id, reason="idle", actor="agentbox")
        elif action == "stop":
            self.runtime.stop(record.id, reason="idle", actor="agentbox")
        else:
            self.runtime.pause(record.id, reason="idle", actor="agentbox")

    def _note_oom(self, record: SandboxRecord) -> None:
        kills = self.runtime.layout.sandbox(record.id).oom_kills()
        seen = self._ooms.get(record.id, 0)
        self._ooms[record.id] = kills
        if kills > seen:
            self.runtime.event(record.id, "oom", "oom", "agentbox", oom_kills=kills)


def _idle_timeout(record: SandboxRecord) -> float:
    return float(record.spec.get("idle_timeout", _DEFAULT_IDLE) or 0)
