"""Warm pools: sandboxes made ahead of time, so that a create that matches is served in a
database transaction instead of a launch.

A pool is a spec (what a plain create on the gateway would get) and a size. The keeper
(a thread of the gateway) tops each pool up one sandbox at a time, replaces pooled
sandboxes whose template changed, and wakes up after a claim once the calls have paused:
``settle`` seconds after the last transition (at most ``max_settle`` after the first). A
refill is a create, a tenth of a second of CPU in the gateway's process; started at the
claim, it took the GIL and the host's cores from the calls that follow a create (a
one-shot script's run and kill: 3 times slower, docs/benchmarks.md). Pooled sandboxes
are real, running sandboxes in state ``pooled``: admission counts them, calls cannot reach
them, and ``Runtime.create`` claims the oldest one whose fixed settings (template, limits,
disk, network: ``runtime.pool_key``) match the request; the request's environment,
lifetime, idle settings and project are applied at the claim.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from agentbox.config.specs import SandboxSpec
from agentbox.errors import LimitExceeded
from agentbox.runtime.runtime import Runtime, pool_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pool:
    spec: SandboxSpec
    size: int


class PoolKeeper:
    def __init__(
        self,
        runtime: Runtime,
        pools: list[Pool],
        interval: float = 5.0,
        settle: float = 0.25,
        max_settle: float = 2.0,
    ) -> None:
        self.runtime = runtime
        self.pools = [p for p in pools if p.size > 0]
        self.interval = interval
        self.settle = settle
        self.max_settle = max_settle
        self._woken_at = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)

    def start(self) -> None:
        if self.pools:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(60)

    def wake(self) -> None:
        """A sandbox was claimed (or may have been): refill once the calls pause."""
        self._woken_at = time.monotonic()
        self._wake.set()

    def _settle(self) -> None:
        """Wait until no wake came for ``settle`` seconds, ``max_settle`` at most."""
        started = time.monotonic()
        while not self._stop.is_set():
            left = min(self._woken_at + self.settle, started + self.max_settle) - time.monotonic()
            if left <= 0:
                return
            self._stop.wait(left)

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = False
            for pool in self.pools:
                try:
                    busy |= self.refill_once(pool)
                except LimitExceeded as e:  # the host is full: pooled ones wait their turn
                    log.info("warm pool waits: %s", e.message)
                except Exception:  # the keeper must outlive a failed create
                    log.exception("warm pool refill failed")
            if not busy:
                woken = self._wake.wait(self.interval)
                self._wake.clear()
                if woken:
                    self._settle()

    def refill_once(self, pool: Pool) -> bool:
        """Replace one stale pooled sandbox or add one missing; whether it did anything."""
        spec = self.runtime.with_template_tier(pool.spec)  # the tier its creates get
        template = self.runtime.templates.get(spec.template)
        members = self.runtime.store.pooled(pool_key(spec))
        for record in members:
            if record.state == "pooled" and record.template_digest != template.digest:
                return self.runtime.recycle(record.id)  # False: claimed meanwhile
        if len(members) < pool.size:
            self.runtime.fill_pool(spec)
            return True
        return False
