"""A node's heartbeat: every ``cluster.heartbeat_seconds`` it reconciles its sandboxes
with the registry, then writes its row (address, labels, capacity) as ready.

Reconcile, in this order (rows read before the local list, so a create that finishes
in between is never mistaken for a vanished sandbox):

* a local sandbox the registry holds as ``lost`` is destroyed: the cluster told its
  callers it is gone, and they may have restored it elsewhere (nothing runs twice);
* a row whose sandbox no longer exists here (it expired, or ended while the database
  was down) is dropped;
* a local sandbox without a row (made while the database was unreachable) is claimed.

A heartbeat that cannot reach PostgreSQL is skipped, not fatal: the thread tries again
at the next tick on a fresh connection, and the node keeps serving its sandboxes.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from agentbox.cluster.node_runtime import NodeRuntime
from agentbox.errors import AgentboxError
from agentbox.runtime.record import SandboxRecord

log = logging.getLogger(__name__)
# Records that are sandboxes a caller holds (not a warm pool's, nor half-made/removed).
_LIVE = ("running", "paused", "stopped", "exited")


def memory_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class Heartbeat:
    def __init__(
        self,
        runtime: NodeRuntime,
        address: str,
        labels: dict[str, str],
        interval: float,
        pool_sizes: dict[str, int] | None = None,
    ) -> None:
        self.runtime = runtime
        self.pool_sizes = pool_sizes or {}  # template -> the warm pool size it is kept at
        self.registry = runtime.registry
        self.node = runtime.node_id
        self.address = address
        self.labels = labels
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def capacity(self, records: list[SandboxRecord]) -> dict[str, Any]:
        templates = self.runtime.templates.list()
        return {
            "memory_free_bytes": memory_available(),
            "cpus": os.cpu_count() or 1,
            "load1": round(os.getloadavg()[0], 2),
            "sandboxes": sum(1 for r in records if r.state in _LIVE),
            "templates": [t.name for t in templates],
            "pools": self.pools(records, {t.name: t.digest for t in templates}),
        }

    def pools(self, records: list[SandboxRecord], digests: dict[str, str]) -> list[dict[str, Any]]:
        """The warm pools as a replica steers creates by them: per template, its size and
        the warm sandboxes a create can claim now (made from the template's current
        digest; a stale one is being replaced)."""
        ready: dict[str, list[str]] = {name: [] for name in self.pool_sizes}
        for record in records:
            if record.state == "pooled" and digests.get(record.template) == record.template_digest:
                ready.setdefault(record.template, []).append(record.id)
        return [
            {"template": name, "size": self.pool_sizes.get(name, 0), "ready": len(ids),
             "ids": ids}
            for name, ids in sorted(ready.items())
        ]  # fmt: skip

    def reconcile(self) -> dict[str, list[str]]:
        rows = self.registry.on_node(self.node)
        local = {r.id for r in self.runtime.store.list() if r.state in _LIVE}
        done: dict[str, list[str]] = {"destroyed": [], "dropped": [], "claimed": []}
        for sandbox, (state, _age) in rows.items():
            if state == "lost" and sandbox in local:
                try:
                    self.runtime.destroy(sandbox, reason="lost", actor="cluster")
                except AgentboxError as e:  # gone meanwhile: nothing left to stop
                    log.info("reconcile: %s: %s", sandbox, e)
                local.discard(sandbox)
                done["destroyed"].append(sandbox)
            elif state == "running" and sandbox not in local:
                self.registry.drop(sandbox, self.node)
                done["dropped"].append(sandbox)
        for sandbox in sorted(local - rows.keys()):
            self.registry.claim(sandbox, self.node)
            done["claimed"].append(sandbox)
        return done

    def beat(self) -> dict[str, list[str]]:
        """One reconcile and heartbeat; raises StateUnavailable without the database."""
        done = self.reconcile()
        capacity = self.capacity(self.runtime.store.list())
        self.registry.heartbeat(self.node, self.address, self.labels, capacity)
        if done["destroyed"] or done["dropped"]:
            log.warning("cluster reconcile on %s: %s", self.node, done)
        elif done["claimed"]:  # usually a create between its build and its row: harmless
            log.info("cluster reconcile on %s: %s", self.node, done)
        return done

    def _run(self) -> None:
        while True:
            try:
                self.beat()
            except AgentboxError as e:  # state_unavailable: the next tick reconnects
                log.warning("heartbeat of %s failed: %s", self.node, e)
            except Exception:  # a bug must not stop the heartbeat: the node would be lost
                log.exception("heartbeat of %s failed", self.node)
            if self._stop.wait(self.interval):
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agentbox-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
