"""The reference agent loop: a model (through the provider pool) chooses one sandbox tool
per turn; the gateway runs it (policy, approvals, audit, redaction); every completed step
is stored before the next turn, so a task resumes after its last step.

The model speaks a plain JSON protocol in its text (any chat model can, with or without
native tool calling): one object per turn, ``{"tool": NAME, "arguments": {...}}`` or
``{"finish": "what was done"}``. Tool results go back as the next user message, cut to a
few KB.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentbox.errors import AgentboxError
from agentbox.gateway.auth import Principal
from agentbox.providers.types import ChatRequest, ChatResponse, Message
from agentbox.tasks.store import Step, Task, TaskStore

RESULT_CHARS = 4000  # of a tool result shown to the model
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


class Model(Protocol):
    async def complete(self, request: ChatRequest) -> ChatResponse: ...


class ToolRunner(Protocol):
    async def __call__(
        self, principal: Principal, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]: ...


@dataclass
class TaskEnd(Exception):
    """How a task ended (raised out of the loop)."""

    state: str
    failure: str | None = None
    result: str | None = None


def system_prompt(tools: list[dict[str, Any]]) -> str:
    lines = [
        "You carry out a task in a Linux sandbox (user `user`, files under /workspace) "
        "using tools. Reply with exactly one JSON object and nothing else:",
        '  {"tool": "<name>", "arguments": {...}}   to use a tool, or',
        '  {"finish": "<what you did>"}              when the task is done.',
        "Tools:",
    ]
    for tool in tools:
        params = json.dumps(tool["input_schema"].get("properties", {}), separators=(",", ":"))
        lines.append(f"- {tool['name']}: {tool['description']} Arguments: {params}")
    return "\n".join(lines)


def transcript(task: Task, steps: list[Step]) -> list[Message]:
    """The conversation so far, rebuilt from the stored steps (also after a restart)."""
    messages = [Message(role="user", content=f"Task: {task.goal}")]
    for step in steps:
        messages.append(Message(role="assistant", content=json.dumps(step.action)))
        shown = json.dumps(step.result)[:RESULT_CHARS]
        messages.append(Message(role="user", content=f"Result of step {step.n}: {shown}"))
    return messages


def parse_action(text: str) -> dict[str, Any]:
    """The model's JSON object (the first ``{...}`` in its text), checked."""
    match = _JSON_OBJECT.search(text)
    try:
        action = json.loads(match.group(0)) if match else None
    except ValueError:
        action = None
    if not isinstance(action, dict):
        raise TaskEnd("failed", "bad_model_output", f"the model did not answer JSON: {text[:200]}")
    if "finish" in action:
        return {"finish": str(action["finish"])}
    if isinstance(action.get("tool"), str) and isinstance(action.get("arguments", {}), dict):
        return {"tool": action["tool"], "arguments": action.get("arguments", {})}
    raise TaskEnd("failed", "bad_model_output", f"not a tool call or a finish: {text[:200]}")


async def run_task(
    task: Task,
    store: TaskStore,
    model: Model,
    run_tool: ToolRunner,
    tools: list[dict[str, Any]],
    account: Callable[[ChatResponse], float],
    cancelled: Callable[[], Awaitable[bool]],
    model_name: str | None = None,
) -> None:
    """Run (or resume) ``task`` in its sandbox until it finishes; raises TaskEnd."""
    assert task.sandbox is not None
    principal = Principal(kind="session", token_id=task.id, sandbox_id=task.sandbox)
    steps = store.steps(task.id)
    system = system_prompt(tools)
    while True:
        if await cancelled():
            raise TaskEnd("cancelled", "cancelled")
        n = len(steps) + 1
        if n > task.max_steps:
            raise TaskEnd("failed", "max_steps", f"no finish after {task.max_steps} steps")
        request = ChatRequest(model=model_name, system=system, messages=transcript(task, steps))
        response = await model.complete(request)
        cost = account(response)
        tokens = (response.usage.input_tokens, response.usage.output_tokens)
        try:
            action = parse_action(response.text)
        except TaskEnd:
            store.add_usage(task.id, tokens, cost)
            raise
        if "finish" in action:
            store.add_step(task.id, n, action, {"finished": True}, tokens, cost)
            raise TaskEnd("succeeded", None, action["finish"])
        try:
            result = await run_tool(principal, action["tool"], action["arguments"])
        except AgentboxError as e:  # the model hears what went wrong and may try again
            result = {"error": {"code": e.code, "message": e.message}}
        store.add_step(task.id, n, action, result, tokens, cost)
        steps = store.steps(task.id)
