"""REST for batch tasks: submit, list, show, steps (the log), cancel. Operator routes."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from agentbox.errors import TasksNotConfigured
from agentbox.gateway.jsonbody import JsonRoute
from agentbox.policy.principal import Principal
from agentbox.tasks.store import TaskStore


class SubmitTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    goal: str = Field(min_length=1, max_length=20_000)
    template: str = "default"
    project: str = "default"
    max_steps: int = Field(default=50, ge=1, le=1000)


def build_task_router(
    store: TaskStore, authenticate: Any, wake: Any, has_providers: bool
) -> APIRouter:
    api = APIRouter(prefix="/v1/tasks", tags=["tasks"], route_class=JsonRoute)
    auth = Depends(authenticate)

    @api.post("", status_code=201)
    async def submit(body: SubmitTask, p: Principal = auth) -> dict[str, Any]:
        """Queue a task; a worker gives it a sandbox and runs the reference agent loop."""
        p.require_operator("submitting a task")
        if not has_providers:  # it would be claimed, get a sandbox and fail at its first step
            raise TasksNotConfigured(
                "this gateway has no model providers, so no task can run: add a `providers:` "
                "section to its config (see gateway.example.yaml) and restart it"
            )
        task = await asyncio.to_thread(
            store.submit, body.goal, body.template, body.project, body.max_steps
        )
        wake()
        return task.to_dict()

    @api.get("")
    async def list_tasks(
        p: Principal = auth, state: str | None = None, limit: int = Query(100, ge=1, le=1000)
    ) -> list[dict[str, Any]]:
        p.require_operator("listing tasks")
        return [t.to_dict() for t in await asyncio.to_thread(store.list, state, limit)]

    @api.get("/{task_id}")
    async def show(task_id: str, p: Principal = auth) -> dict[str, Any]:
        p.require_operator("reading a task")
        return (await asyncio.to_thread(store.get, task_id)).to_dict()

    @api.get("/{task_id}/steps")
    async def steps(task_id: str, p: Principal = auth) -> list[dict[str, Any]]:
        """Every completed step: the model's action, the tool's result, tokens and cost."""
        p.require_operator("reading a task")
        await asyncio.to_thread(store.get, task_id)  # a clear 404 for an unknown id
        return [s.to_dict() for s in await asyncio.to_thread(store.steps, task_id)]

    @api.post("/{task_id}/cancel")
    async def cancel(task_id: str, p: Principal = auth) -> dict[str, Any]:
        """Stop a task: a queued one at once; a running one's command is killed."""
        p.require_operator("cancelling a task")
        return (await asyncio.to_thread(store.request_cancel, task_id)).to_dict()

    return api
