"""An MCP tool call held by an egress question (network mode ``ask``), for current clients.

A 2026-07-28 MCP client's ``terminal_run`` in a sandbox of mode ``ask`` whose command
waits on a held connection gets MCP's input-required result, as a command that needs
approval does: an elicitation that names the name, port and approval, so the agent's
client asks its user, who decides where decisions are made (the console, ``agentbox
approvals``, REST: the operator; a session token never decides). The command keeps
running in the gateway meanwhile; the client's retry carries the sealed request state,
which names the held call, and attaches to it again: its result once it ends, or another
input-required while a question is still open. Handshake-era clients cannot receive that
result: their call simply waits (bounded by the sandbox's ``ask_timeout``).
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agentbox.errors import Conflict
from agentbox.policy.approvals import EGRESS_TOOL, Approval, ApprovalStore
from agentbox.runtime.runtime import Runtime

POLL = 0.25  # how often a running call looks for an open question (a database read)
KEEP = 600.0  # a held call nobody came back for is dropped this long after it ended
MAX_HELD = 256
HELD_TOOLS = frozenset({"terminal_run"})  # the tools whose commands open connections
Owner = tuple[str, str, str]  # (actor, tool, sandbox): a retry must be the same caller's


@dataclass(frozen=True)
class Waiting:
    """The call is held: these questions are open; ``key`` names it for the retry."""

    questions: tuple[Approval, ...]
    key: str

    def message(self, tool: str) -> str:
        asked = "; ".join(
            f"{a.summary} ({a.id}, asked by {a.requested_by})" for a in self.questions
        )
        first = self.questions[0].id
        return (
            f"`{tool}` is still running: its sandbox waits for a person to allow egress: "
            f"{asked}. Ask your user to decide in the agentbox console or with "
            f"`agentbox approvals approve {first} --scope once|sandbox|always` (or `deny`), "
            "then check again."
        )


@dataclass
class _Held:
    task: asyncio.Task[Any]
    owner: Owner
    ended: float | None = None


class HeldCalls:
    def __init__(self, approvals: ApprovalStore, runtime: Runtime) -> None:
        self.approvals = approvals
        self.runtime = runtime
        self._held: dict[str, _Held] = {}

    def applies(self, tool: str, sandbox: str) -> bool:
        if tool not in HELD_TOOLS or not sandbox:
            return False
        try:
            return self.runtime.get(sandbox).network_mode == "ask"
        except Exception:
            return False  # the call path reports an unknown sandbox in its own words

    async def run(
        self, owner: Owner, key: str | None, start: Callable[[], Coroutine[Any, Any, Any]]
    ) -> Any:
        """The call's outcome, or :class:`Waiting` while an egress question of its
        sandbox is open (the call then runs on, held here under a new key)."""
        self._sweep()
        if key is not None:
            held = self._held.get(key)
            if held is None or held.owner != owner:
                raise Conflict(
                    "the held call this request names is gone (the gateway restarted, or it "
                    "ended over 10 minutes ago); call the tool again without that state"
                )
            del self._held[key]
            task = held.task
        else:
            task = asyncio.create_task(start())
        handed = False
        try:
            while True:
                await asyncio.wait({task}, timeout=POLL)
                if task.done():
                    return task.result()
                open_ = await asyncio.to_thread(self._questions, owner[2])
                if open_:
                    if len(self._held) >= MAX_HELD:
                        continue  # nowhere to keep it: the caller simply waits
                    new = secrets.token_urlsafe(16)
                    self._held[new] = _Held(task, owner)
                    task.add_done_callback(functools.partial(self._ended, new))
                    handed = True
                    return Waiting(open_, new)
        finally:
            if not handed and not task.done():
                task.cancel()  # the caller went away: so does its call (as without asking)

    def _questions(self, sandbox: str) -> tuple[Approval, ...]:
        pending = self.approvals.list("pending")
        return tuple(a for a in pending if a.sandbox == sandbox and a.tool == EGRESS_TOOL)

    def _ended(self, key: str, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved (re-raised by result() if the client comes back)
        held = self._held.get(key)
        if held is not None:
            held.ended = time.monotonic()

    def _sweep(self) -> None:
        now = time.monotonic()
        for key, held in list(self._held.items()):
            if held.ended is not None and now - held.ended > KEEP:
                del self._held[key]
