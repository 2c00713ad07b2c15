"""Task workers: asyncio tasks of the gateway that take queued tasks, give each a sandbox,
run the reference loop, keep the task's lease alive, and honour cancellation (a running
command is killed, not waited for).

After a crash the lease runs out; the next gateway queues the task again and the loop
resumes after its last stored step, in the same sandbox (sandboxes outlive the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from agentbox.errors import AgentboxError, BudgetExceeded, ProviderError, StateUnavailable
from agentbox.models.providers.types import ChatRequest, ChatResponse
from agentbox.policy.principal import Principal
from agentbox.runtime.runtime import Runtime
from agentbox.tasks.agent import TaskEnd, run_task
from agentbox.tasks.store import Task, TaskStore

log = logging.getLogger(__name__)
LEASE_S = 30.0


class TaskWorkers:
    def __init__(
        self,
        store: TaskStore,
        runtime: Runtime,
        model: Callable[[Task, ChatRequest], Awaitable[ChatResponse]],
        call_tool: Callable[[Principal, str, dict[str, Any]], Any],
        tools: list[dict[str, Any]],
        sandbox_spec: Callable[[Task], dict[str, Any]],
        account: Callable[[Task, ChatResponse], float],
        workers: int = 1,
        poll_s: float = 0.5,
        lease_s: float = LEASE_S,
        on_finish: Callable[[Task], Any] | None = None,
        on_end: Literal["destroy", "stop"] = "destroy",
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.model = model
        self.call_tool = call_tool
        self.tools = tools
        self.sandbox_spec = sandbox_spec
        self.account = account
        self.workers = workers
        self.poll_s = poll_s
        self.lease_s = lease_s
        self.on_finish = on_finish
        self.on_end = on_end
        self.id = "worker-" + secrets.token_hex(4)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop()) for _ in range(self.workers)]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def wake(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.store.requeue_expired)
                task = await asyncio.to_thread(self.store.claim, self.id, self.lease_s)
            except StateUnavailable as e:  # PostgreSQL restarting: the next round reconnects
                log.warning("task worker %s: %s", self.id, e.message)
                task = None
            if task is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                self._wake.clear()
                continue
            try:
                await self._run(task)
            except asyncio.CancelledError:
                raise  # the gateway stops: the lease runs out, another run resumes it
            except StateUnavailable as e:
                # Not the task's fault, and where it stands cannot be written now: its
                # lease runs out and a worker resumes it after its last stored step, in the
                # same sandbox (kept).
                log.warning("task %s: paused, it resumes when its lease runs out: %s",
                            task.id, e.message)  # fmt: skip
                continue
            except Exception:
                log.exception("task %s: the worker failed", task.id)
                with contextlib.suppress(StateUnavailable):  # its lease still runs out
                    self.store.finish(task.id, "failed", "error", "internal error; see the log")
            try:
                await asyncio.to_thread(self._end_sandbox, task.id)
            except Exception:  # the worker must carry on; the sandbox's lifetime still ends it
                log.exception("task %s: its sandbox could not be ended", task.id)

    async def _run(self, task: Task) -> None:
        renewer = asyncio.create_task(self._renew(task))
        try:
            task = await self._with_sandbox(task)
            watcher = asyncio.create_task(self._watch_cancel(task))
            try:
                await run_task(
                    task,
                    self.store,
                    _Bound(self.model, task),
                    self._run_tool,
                    self.tools,
                    lambda response: self.account(task, response),
                    lambda: self._cancel_requested(task),
                )
            finally:
                watcher.cancel()
        except TaskEnd as end:
            self.store.finish(task.id, end.state, end.failure, end.result)
        except BudgetExceeded as e:
            self.store.finish(task.id, "failed", "budget", e.message)
        except ProviderError as e:
            self.store.finish(task.id, "failed", "provider", e.message)
        except StateUnavailable:
            raise  # the database, not the sandbox: _loop leaves the task to resume
        except AgentboxError as e:
            self.store.finish(task.id, "failed", "sandbox", f"{e.code}: {e.message}")
        finally:
            renewer.cancel()
        if self.on_finish is not None:
            self.on_finish(self.store.get(task.id))

    def _end_sandbox(self, task_id: str) -> None:
        """The task is over (whichever way): its sandbox goes as ``tasks.on_end`` says."""
        sandbox = self.store.get(task_id).sandbox
        if sandbox is None or not self.runtime.exists(sandbox):
            return
        if self.on_end == "destroy":
            self.runtime.destroy(sandbox, reason="task", actor=f"task:{task_id}")
        else:
            self.runtime.stop(sandbox, reason="task", actor=f"task:{task_id}")

    async def _with_sandbox(self, task: Task) -> Task:
        if task.sandbox is not None and self.runtime.exists(task.sandbox):
            return task  # a resumed task carries on where its files are
        record = await asyncio.to_thread(self.runtime.create, self.sandbox_spec(task))
        self.store.set_sandbox(task.id, record.id)
        return self.store.get(task.id)

    async def _run_tool(
        self, principal: Principal, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        outcome = await self.call_tool(principal, name, {**arguments})
        return dict(outcome.result)

    async def _cancel_requested(self, task: Task) -> bool:
        return bool((await asyncio.to_thread(self.store.get, task.id)).cancel_requested)

    async def _watch_cancel(self, task: Task) -> None:
        """Cancellation interrupts: the command running now is killed (its call returns)."""
        while not await self._cancel_requested(task):
            await asyncio.sleep(0.25)
        if task.sandbox is not None:
            with contextlib.suppress(AgentboxError):  # gone meanwhile: nothing runs
                self.runtime.commands(task.sandbox).kill_foreground()

    async def _renew(self, task: Task) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await asyncio.to_thread(self.store.renew, task.id, self.id, self.lease_s)


class _Bound:
    """The model, with the calls of one task attributed to it."""

    def __init__(self, model: Callable[[Task, ChatRequest], Awaitable[ChatResponse]], task: Task):
        self.model, self.task = model, task

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return await self.model(self.task, request)
