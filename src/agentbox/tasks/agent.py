"""The reference agent loop: a model (through the provider pool) chooses one sandbox tool
per turn; the gateway runs it (policy, approvals, audit, redaction); every completed step
is stored before the next turn, so a task resumes after its last step.

The tools are offered natively (OpenAI functions / Anthropic tools): a turn that calls
one is a step (the first call, if a model makes several: one step per turn), and its
result goes back as the call's ``tool`` turn, cut to a few KB. A turn without a call
ends the task with its text as the result. Models without native tool calling can speak
a JSON protocol in their text instead (the system prompt says how): one object per turn,
``{"tool": NAME, "arguments": {...}}`` or ``{"finish": "what was done"}``; an answer
that is empty, cut off (``length``) or a call with arguments that are not a JSON object
is ``bad_model_output``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentbox import hints
from agentbox.errors import AgentboxError, ProviderRejected
from agentbox.models.providers.types import ChatRequest, ChatResponse, Message, Tool, ToolCall
from agentbox.policy.principal import Principal
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
        "using the tools you are given, one call per turn. When the task is done, answer "
        "with a short summary of what you did and call no tool.",
        "If you cannot call tools natively, reply with exactly one JSON object instead:",
        '  {"tool": "<name>", "arguments": {...}}   to use a tool, or',
        '  {"finish": "<what you did>"}              when the task is done.',
        "Tools:",
    ]
    for tool in tools:
        params = json.dumps(tool["input_schema"].get("properties", {}), separators=(",", ":"))
        lines.append(f"- {tool['name']}: {tool['description']} Arguments: {params}")
    return "\n".join(lines)


def offered(tools: list[dict[str, Any]]) -> list[Tool]:
    return [Tool(name=t["name"], description=t["description"], parameters=t["input_schema"])
            for t in tools]  # fmt: skip


def transcript(task: Task, steps: list[Step]) -> list[Message]:
    """The conversation so far, rebuilt from the stored steps (also after a restart): a
    native call as the assistant's call and its ``tool`` turn, a JSON-protocol step as
    text both ways."""
    messages = [Message(role="user", content=f"Task: {task.goal}")]
    for step in steps:
        shown = json.dumps(step.result)[:RESULT_CHARS]
        call_id = step.action.get("call_id")
        if call_id:
            call = ToolCall(call_id, step.action["tool"], json.dumps(step.action["arguments"]))
            messages.append(Message(role="assistant", content=step.action.get("text", ""),
                                    tool_calls=(call,)))  # fmt: skip
            messages.append(Message(role="tool", tool_call_id=call_id, content=shown))
            continue
        messages.append(Message(role="assistant", content=json.dumps(step.action)))
        messages.append(Message(role="user", content=f"Result of step {step.n}: {shown}"))
    return messages


def _bad(why: str, text: str) -> TaskEnd:
    return TaskEnd("failed", "bad_model_output", f"{why}: {text[:200]}")


def parse_action(response: ChatResponse) -> dict[str, Any]:
    """What the model chose: ``{"tool", "arguments"[, "call_id", "text"]}`` or
    ``{"finish"}``."""
    text = response.text
    if response.tool_calls:
        call = response.tool_calls[0]
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise _bad(f"the arguments of {call.name} are not a JSON object", call.arguments)
        return {"tool": call.name, "arguments": arguments, "call_id": call.id or "call",
                "text": text}  # fmt: skip
    match = _JSON_OBJECT.search(text)
    try:
        action = json.loads(match.group(0)) if match else None
    except ValueError:
        action = None
    if isinstance(action, dict) and "finish" in action:
        return {"finish": str(action["finish"])}
    if isinstance(action, dict) and isinstance(action.get("tool"), str):
        if not isinstance(action.get("arguments", {}), dict):
            raise _bad("the tool's arguments are not a JSON object", text)
        return {"tool": action["tool"], "arguments": action.get("arguments", {})}
    if response.finish_reason == "length":
        raise _bad("the answer was cut off at max_tokens", text)
    if not text.strip():
        raise _bad("the model answered nothing", text)
    return {"finish": text.strip()}  # no call: the model is done, its text is the result


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
    native = offered(tools) or None  # None once the model refused them: the JSON protocol
    while True:
        if await cancelled():
            raise TaskEnd("cancelled", "cancelled")
        n = len(steps) + 1
        if n > task.max_steps:
            raise TaskEnd("failed", "max_steps", f"no finish after {task.max_steps} steps")
        request = ChatRequest(model=model_name, system=system, tools=native,
                              messages=transcript(task, steps))  # fmt: skip
        try:
            response = await model.complete(request)
        except ProviderRejected:
            if native is None:
                raise
            # A server without tool calling (Ollama models, vLLM without its tool parser)
            # refuses the tools: the same turn again, the JSON protocol in the text.
            native = None
            continue
        cost = account(response)
        tokens = (response.usage.input_tokens, response.usage.output_tokens)
        try:
            action = parse_action(response)
        except TaskEnd:
            store.add_usage(task.id, tokens, cost)
            raise
        if "finish" in action:
            store.add_step(task.id, n, action, {"finished": True}, tokens, cost)
            raise TaskEnd("succeeded", None, action["finish"])
        try:
            result = await run_tool(principal, action["tool"], action["arguments"])
        except AgentboxError as e:  # the model hears what went wrong and may try again
            result = {"error": {"code": e.code, "message": hints.render(e, "mcp")}}
        store.add_step(task.id, n, action, result, tokens, cost)
        steps = store.steps(task.id)
