"""E2B's ``lifecycle.on_timeout = "pause"`` (``autoPause``): at its timeout a sandbox is
paused, not killed.

Such a sandbox is made with agentbox's own lifetime (``sandbox.limits.lifetime``, or its
E2B timeout if longer) as the bound of its whole life, running and paused; its E2B timeout
is a pause deadline in ``e2b_pauses``, moved by ``set_timeout`` and by ``connect``. At the
deadline it is paused with its memory (``runtime.pause``: frozen, resumed exactly where it
was) or, with ``keep_memory`` False, stopped (``runtime.stop``: processes end, the disk is
kept; ``connect`` starts it again). Either is a lifecycle event with reason ``lifetime``,
actor ``agentbox``, copied to the audit trail like every transition.

One asyncio task per gateway sleeps until the next deadline; it ends when none is left
and is started again by the next control-plane request that may set one (so deadlines
kept in the database over a restart are enforced from the first E2B request on).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from agentbox.errors import AgentboxError
from agentbox.gateway.e2b.access import E2BAccess, Pausing
from agentbox.gateway.service import Gateway

log = logging.getLogger(__name__)
_MAX_SLEEP_S = 60.0  # a deadline set by another gateway process is seen within this


class TimeoutPauses:
    def __init__(self, gateway: Gateway, access: E2BAccess) -> None:
        self.gateway, self.access = gateway, access
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    def kick(self) -> None:
        """A deadline may have changed: look again (from the gateway's event loop)."""
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake
        while True:
            pending = await asyncio.to_thread(self.access.pausings)
            if not pending:
                return
            now = time.time()
            due = [p for p in pending if p.pause_at is not None and p.pause_at <= now]
            for pausing in due:
                await self._pause(pausing)
            if due:
                continue  # look again: the rest, and any deadline set meanwhile
            wait = min(p.pause_at or now for p in pending) - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), min(wait, _MAX_SLEEP_S))
            wake.clear()

    async def _pause(self, due: Pausing) -> None:
        runtime = self.gateway.runtime
        self.access.set_pausing(dataclasses.replace(due, pause_at=None))
        try:
            record = await asyncio.to_thread(runtime.get, due.id)
            if record.state != "running":
                return
            act = runtime.pause if due.keep_memory else runtime.stop
            await asyncio.to_thread(act, due.id, reason="lifetime", actor="agentbox")
        except AgentboxError as e:  # gone meanwhile, or it could not be frozen: said once
            log.info("E2B timeout of %s: not paused: %s", due.id, e)
            return
        self.gateway.lifecycle_changed()

    def arm(self, pausing: Pausing, time_left: float, timeout_s: float | None = None) -> None:
        """Paused ``time_left`` seconds from now; ``timeout_s``, if given, becomes the
        timeout a resume (connect without one, or a call that wakes it) starts again."""
        until = time.time() + time_left
        kept = pausing.timeout_s if timeout_s is None or timeout_s <= 0 else timeout_s
        self.access.set_pausing(dataclasses.replace(pausing, pause_at=until, timeout_s=kept))
        self.kick()
