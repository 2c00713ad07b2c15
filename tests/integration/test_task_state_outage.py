"""A task whose state database goes away mid-step is paused, not failed: the worker
cannot write where it stands, so its lease runs out and it resumes after its last stored
step, in the same sandbox, once PostgreSQL is back. Real parts: the task workers, a
PostgreSQL server of the test's own (stopped and started for real), a real sandbox; the
model is a scripted callable (what the workers call, below the provider pool)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace
from typing import Any

from agentbox.errors import StateUnavailable
from agentbox.models.providers.types import ChatRequest, ChatResponse, Usage
from agentbox.policy.principal import Principal
from agentbox.runtime.runtime import Runtime
from agentbox.state.postgres import PostgresDB, migrate
from agentbox.tasks.store import Task, TaskStore
from agentbox.tasks.worker import TaskWorkers
from pgkit import running_postgres

LEASE_S = 2.0
WAIT = 120.0  # bound on the whole scenario (a loaded host is slow, never this slow)


def _reply(action: dict[str, Any]) -> ChatResponse:
    return ChatResponse(json.dumps(action), "scripted", "scripted", Usage(10, 5), "stop")


def test_a_task_outlives_its_state_database_going_away(runtime: Runtime) -> None:
    with running_postgres() as server:
        url = server.new_database()
        migrate(url)
        db = PostgresDB(url)
        store = TaskStore(db)
        back = threading.Event()
        script = [
            {"tool": "terminal_run", "arguments": {"command": "echo one > /tmp/kept"}},
            {"tool": "terminal_run", "arguments": {"command": "echo two"}},  # PG stops
            {"tool": "terminal_run", "arguments": {"command": "echo two"}},  # step 2 again
            {"tool": "terminal_run", "arguments": {"command": "cat /tmp/kept"}},
            {"finish": "done"},
        ]
        asked: list[int] = []

        async def model(task: Task, request: ChatRequest) -> ChatResponse:
            asked.append(len(request.messages))
            if len(asked) == 2:  # the step's answer cannot be stored: PostgreSQL is down
                server.stop()

                def start_later() -> None:
                    time.sleep(LEASE_S)
                    server.start()
                    back.set()

                threading.Thread(target=start_later, daemon=True).start()
            return _reply(script[len(asked) - 1])

        async def call_tool(principal: Principal, name: str, arguments: dict[str, Any]) -> Any:
            assert principal.sandbox_id is not None and name == "terminal_run"
            done = await asyncio.to_thread(
                runtime.commands(principal.sandbox_id).run, arguments["command"], timeout=30
            )
            return SimpleNamespace(result={"stdout": done.stdout, "exit_code": done.exit_code})

        workers = TaskWorkers(
            store, runtime, model, call_tool, [], lambda task: {"memory": "128MiB"},
            lambda task, r: 0.0, poll_s=0.1, lease_s=LEASE_S, on_end="destroy",
        )  # fmt: skip
        task = store.submit("survive an outage", "default", "default", 10)

        async def scenario() -> Task:
            workers.start()
            try:
                deadline = time.monotonic() + WAIT
                while True:
                    await asyncio.sleep(0.1)
                    assert time.monotonic() < deadline, f"the task never ended: {asked}"
                    if not back.is_set():
                        continue
                    try:
                        now = await asyncio.to_thread(store.get, task.id)
                    except StateUnavailable:  # the server is still starting
                        continue
                    if now.state in ("succeeded", "failed"):
                        return now
            finally:
                await workers.stop()

        ended = asyncio.run(scenario())
        steps = store.steps(task.id)
        db.close()
    assert ended.state == "succeeded", ended
    # Step 2 was asked again after the outage (its first answer was never stored), and
    # step 3 read the file step 1 wrote: the same sandbox.
    assert [s.n for s in steps] == [1, 2, 3, 4] and len(asked) == 5
    assert [s.result.get("stdout") for s in steps[:3]] == ["", "two\n", "one\n"], steps
