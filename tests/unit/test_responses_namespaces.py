"""Responses API tool namespaces (how Codex sends its MCP tools: ``{"type": "namespace",
"name": "mcp__agentbox", "tools": [...]}``): the provider sees flat names, and the
model's calls go back to the client under their namespace."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.background import BackgroundTask

from agentbox.errors import InvalidRequest
from agentbox.models import responses_wire as rw
from agentbox.models.providers.types import ChatResponse, StreamEvent, ToolCall, Usage

SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
BODY: dict[str, Any] = {
    "model": "m",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call", "call_id": "c1", "namespace": "mcp__agentbox",
         "name": "terminal_run", "arguments": '{"command": "ls"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a b"},
    ],
    "tools": [
        {"type": "function", "name": "get_goal", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "mcp__agentbox", "description": "the sandbox",
         "tools": [{"type": "function", "name": "terminal_run", "strict": False,
                    "parameters": SCHEMA},
                   {"type": "custom", "name": "patch", "description": "edit"}]},
    ],
}  # fmt: skip


def test_namespaced_tools_reach_the_provider_by_their_flat_names() -> None:
    chat = rw.from_responses(BODY)
    assert [t.name for t in chat.tools or []] == [
        "get_goal",
        "mcp__agentbox__terminal_run",
        "mcp__agentbox__patch",
    ]
    call = chat.messages[1].tool_calls[0]
    assert (call.name, call.arguments) == ("mcp__agentbox__terminal_run", '{"command": "ls"}')
    forced = {"type": "function", "namespace": "mcp__agentbox", "name": "terminal_run"}
    assert rw.from_responses(BODY | {"tool_choice": forced}).tool_choice == (
        "mcp__agentbox__terminal_run"
    )


def _answer(*calls: ToolCall) -> ChatResponse:
    return ChatResponse(text="", model="m", provider="p", usage=Usage(1, 1),
                        finish_reason="tool_calls", tool_calls=list(calls))  # fmt: skip


def test_a_call_goes_back_under_its_namespace() -> None:
    run = ToolCall("c2", "mcp__agentbox__terminal_run", '{"command": "pwd"}')
    patch = ToolCall("c3", "mcp__agentbox__patch", '{"input": "*** Begin Patch"}')
    plain = ToolCall("c4", "get_goal", "{}")
    response = rw.responses_json(_answer(run, patch, plain), BODY, BackgroundTask(lambda: None))
    output = json.loads(bytes(response.body))["output"]
    assert [(o["type"], o.get("namespace"), o["name"]) for o in output] == [
        ("function_call", "mcp__agentbox", "terminal_run"),
        ("custom_tool_call", "mcp__agentbox", "patch"),
        ("function_call", None, "get_goal"),
    ]
    assert output[1]["input"] == "*** Begin Patch"


def test_a_streamed_call_goes_back_under_its_namespace() -> None:
    call = ToolCall("c5", "mcp__agentbox__terminal_run", '{"command": "id"}')

    async def rest() -> AsyncGenerator[StreamEvent, None]:
        yield StreamEvent(kind="done", finish_reason="tool_calls", usage=Usage(1, 1))

    async def collect() -> list[dict[str, Any]]:
        first = StreamEvent(kind="tool_call", tool_call=call, model="m")
        chat = rw.from_responses(BODY)
        chunks = [c async for c in rw.responses_sse(first, rest(), BODY, chat)]
        events = b"".join(chunks).decode().split("\n\n")
        return [json.loads(e.split("data: ", 1)[1]) for e in events if "data: " in e]

    done = [e["item"] for e in asyncio.run(collect()) if e["type"] == "response.output_item.done"]
    assert [(i["namespace"], i["name"]) for i in done] == [("mcp__agentbox", "terminal_run")]


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "namespace", "tools": [{"type": "function", "name": "x"}]},
        {"type": "namespace", "name": "ns"},
        {"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]},
    ],
)
def test_a_malformed_namespace_is_refused_with_the_reason(tool: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as raised:
        rw.from_responses({"model": "m", "input": "hi", "tools": [tool]})
    assert raised.value.details.get("field") == "tools"


SEARCHED: dict[str, Any] = {
    "model": "m",
    "tools": [{"type": "tool_search", "execution": "client"}],
    "input": [
        {"type": "message", "role": "user", "content": "go"},
        *[item for n in (1, 2) for item in (
            {"type": "tool_search_call", "call_id": f"s{n}", "execution": "client",
             "arguments": '{"query": "patch"}'},  # a string, as some clients replay it
            {"type": "tool_search_output", "call_id": f"s{n}", "execution": "client",
             "tools": [{"type": "namespace", "name": "mcp__fs", "tools": [
                 {"type": "custom", "name": "patch", "description": "edit a file"}]}]},
        )],
    ],
}  # fmt: skip


def test_a_tool_loaded_twice_is_offered_once_and_called_back_as_what_it_is() -> None:
    chat = rw.from_responses(SEARCHED)
    assert [t.name for t in chat.tools or []] == ["tool_search", "mcp__fs__patch"]
    assert chat.tools is not None and chat.tools[0].parameters["required"] == ["query"]
    assert chat.messages[1].tool_calls[0].arguments == '{"query": "patch"}'
    assert chat.messages[2].content == (
        "These tools are now available to call:\n- mcp__fs__patch: edit a file"
    )
    patch = ToolCall("c6", "mcp__fs__patch", '{"input": "*** Begin Patch"}')
    search = ToolCall("c7", "tool_search", "not json")
    response = rw.responses_json(_answer(patch, search), SEARCHED, BackgroundTask(lambda: None))
    output = json.loads(bytes(response.body))["output"]
    assert output[0] | {"id": ""} == {"type": "custom_tool_call", "id": "", "call_id": "c6",
                                      "namespace": "mcp__fs", "name": "patch",
                                      "input": "*** Begin Patch", "status": "completed"}  # fmt: skip
    assert output[1] == {"type": "tool_search_call", "id": "tsc_c7", "call_id": "c7",
                         "execution": "client", "arguments": {"arguments": "not json"},
                         "status": "completed"}  # fmt: skip


def test_without_a_search_tool_a_call_named_tool_search_is_a_function_call() -> None:
    body = {"model": "m", "input": "hi", "tools": [
        {"type": "function", "name": "tool_search", "parameters": {"type": "object"}}]}  # fmt: skip
    response = rw.responses_json(_answer(ToolCall("c8", "tool_search", "{}")), body,
                                 BackgroundTask(lambda: None))  # fmt: skip
    assert json.loads(bytes(response.body))["output"][0]["type"] == "function_call"
