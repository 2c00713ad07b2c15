"""OpenAI's Responses API (``POST /v1/responses``, what Codex speaks), both ways: a request
body to the neutral ``ChatRequest``, and a ``ChatResponse`` or a stream of ``StreamEvent``
back as a ``response`` object or its ``response.*`` server-sent events.

Any provider serves it (upstream it is chat completions or Anthropic messages). Every
top-level field is either translated, accepted because it changes nothing here, or
refused with a 400 naming it (``_FIELDS``); nothing that would change the answer is
dropped in silence. The conversation is stateless: ``store`` is never honoured (nothing
is kept), so ``previous_response_id`` is refused: send the whole input each turn, as
Codex does by default (``store: false``).

Tool search (what Codex sends for its GPT models: its MCP tools are deferred, found by a
``tool_search`` tool it runs itself, ``execution: "client"``) translates too: the search
tool is a function ``tool_search`` for the provider, the model's call of it goes back as a
``tool_search_call`` item, and the tools a ``tool_search_output`` item loaded join the
provider's tool list (under their flat names) from then on, as OpenAI makes them callable.
A search OpenAI would run itself (``execution: "server"``) is refused: no provider here
can run it. A tool listed with ``defer_loading`` is offered at once (more input tokens; a
call of it is as valid as after a search).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from agentbox.errors import AgentboxError, InvalidRequest
from agentbox.models import wire
from agentbox.models.providers.anthropic import tool_input
from agentbox.models.providers.types import (
    ChatRequest,
    ChatResponse,
    Image,
    Message,
    StreamEvent,
    Tool,
    ToolCall,
    Usage,
)

_STATELESS = ("agentbox keeps no responses: send the whole conversation in `input` each turn "
              "with store: false (Codex's default)")  # fmt: skip
# Field -> None (translated, or changes nothing here: accepted), or why it is refused.
_FIELDS: dict[str, str | None] = {
    "model": None, "input": None, "instructions": None, "max_output_tokens": None,
    "temperature": None, "top_p": None, "stream": None, "tools": None, "tool_choice": None,
    "parallel_tool_calls": None, "reasoning": None, "text": None,
    # Nothing is stored whatever ``store`` says; ``include`` may ask only for encrypted
    # reasoning (no reasoning items come back); cache keys, metadata and user ids only
    # label the call.
    "store": None, "include": None, "prompt_cache_key": None, "metadata": None,
    "client_metadata": None, "user": None, "safety_identifier": None, "service_tier": None,
    "stream_options": None, "truncation": None,
    "previous_response_id": _STATELESS,
    "conversation": _STATELESS,
    "background": "background responses are not supported (they need stored responses)",
    "prompt": "prompt templates are not supported: send the instructions and input",
    "max_tool_calls": "max_tool_calls is not supported",
    "top_logprobs": "logprobs are not supported",
}  # fmt: skip
# Server tools run by OpenAI itself: no provider here can run them. Web search is left out
# (reported in X-Agentbox-Dropped-Tools): without it the model answers from what it has,
# and a search from the provider's servers would bypass the sandbox's egress policy.
_DROPPED_TOOLS = ("web_search", "web_search_preview")
_CUSTOM_INPUT = {"type": "object", "properties": {"input": {"type": "string"}},
                 "required": ["input"]}  # fmt: skip
SEARCH = "tool_search"  # the client's tool search, as a function for the provider
# For a client's tool_search that comes without a description or parameters.
_SEARCH_DESCRIPTION = "Search the deferred tools; the matching ones become callable."
_SEARCH_INPUT = {"type": "object", "properties": {"query": {"type": "string"},
                 "limit": {"type": "number"}}, "required": ["query"]}  # fmt: skip
_MAX_SHOWN = 200  # characters of a loaded tool's description in the search's result text


def _check_fields(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if name not in _FIELDS:
            raise InvalidRequest(
                f"field {name!r} is not supported by /v1/responses here (supported: "
                f"{', '.join(k for k, v in _FIELDS.items() if v is None)})",
                field=name,
            )
        why = _FIELDS[name]
        if why is not None and value not in (None, False, ""):
            raise InvalidRequest(f"field {name!r}: {why}", field=name)
    tier = body.get("service_tier")
    if tier not in (None, "auto", "default"):
        raise InvalidRequest(f"service_tier {tier!r} is not supported (auto, default)",
                             field="service_tier")  # fmt: skip
    for value in body.get("include") or []:
        if value != "reasoning.encrypted_content":  # no reasoning items come back to carry it
            raise InvalidRequest(f"include {value!r} is not supported (reasoning.encrypted_"
                                 "content)", field="include")  # fmt: skip
    if body.get("truncation") not in (None, "disabled"):
        raise InvalidRequest("truncation 'auto' is not supported (disabled)", field="truncation")
    text = wire._object(body.get("text") or {}, "text")
    for key, value in text.items():
        if key == "format" and wire._object(value, "text.format").get("type") == "text":
            continue
        if key == "verbosity" and value in (None, "low", "medium", "high"):
            continue
        raise InvalidRequest(f"text.{key} {value!r} is not supported (format text, "
                             "verbosity)", field=f"text.{key}")  # fmt: skip


def _flat(namespace: Any, name: Any) -> str:
    """A namespaced tool's name for the provider, which has no namespaces: Codex's MCP
    tools (namespace ``mcp__agentbox``, tool ``terminal_run``) become the names it uses
    itself, ``mcp__agentbox__terminal_run``."""
    return f"{namespace}__{name}" if namespace else str(name or "")


def _loaded(body: dict[str, Any]) -> list[Any]:
    """The tools the input's ``tool_search_output`` items loaded, in order: callable from
    then on, though the client does not repeat them in ``tools``."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    return [tool for item in items
            if isinstance(item, dict) and item.get("type") == "tool_search_output"
            for tool in wire._list(item.get("tools"), "a tool_search_output's tools")]  # fmt: skip


def search_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The request's client-run ``tool_search`` tool, if it has one."""
    for entry in body.get("tools") or []:
        if isinstance(entry, dict) and entry.get("type") == "tool_search":
            if entry.get("execution") != "client":
                raise InvalidRequest(
                    "tool_search run by the server (execution 'server', the default) is not "
                    "supported: no provider here can search deferred tools; use execution "
                    "'client' (as Codex does) or send the tools without defer_loading",
                    field="tools",
                )
            return entry
    return None


def _entries(body: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """The request's tools and those a tool search loaded, each with its namespace (None
    outside one), namespaces opened; a tool loaded twice counts once."""
    found: list[tuple[str | None, dict[str, Any]]] = []
    seen: set[str] = set()
    tools = [*(body.get("tools") or []), *_loaded(body)]
    searching = any(isinstance(t, dict) and t.get("type") == "tool_search" for t in tools)

    def add(namespace: str | None, tool: dict[str, Any]) -> None:
        name = _flat(namespace, tool.get("name"))
        if searching and name == SEARCH and tool.get("type") in ("function", "custom"):
            raise InvalidRequest(
                f"a tool named {SEARCH!r} besides the tool_search tool is not supported "
                "(the names would collide)",
                field="tools",
            )
        if name not in seen or tool.get("type") not in ("function", "custom"):
            seen.add(name)
            found.append((namespace, tool))

    for entry in tools:
        entry = wire._object(entry, "a tool")
        if entry.get("type") == "tool_search":
            continue  # the search tool itself: search_tool()
        if entry.get("type") != "namespace":
            add(None, entry)
            continue
        namespace = entry.get("name")
        if not isinstance(namespace, str) or not namespace:
            raise InvalidRequest("a namespace tool needs a name", field="tools")
        inner = entry.get("tools")
        if not isinstance(inner, list):
            raise InvalidRequest(f"namespace {namespace!r} needs a list of tools", field="tools")
        for tool in inner:
            tool = wire._object(tool, "a namespace's tool")
            kind = tool.get("type")
            if kind not in ("function", "custom"):
                raise InvalidRequest(f"namespace {namespace!r}: tool type {kind!r} is not "
                                     "supported (function, custom)", field="tools")  # fmt: skip
            add(namespace, tool)
    return found


@dataclass(frozen=True)
class ToolNames:
    """How the model's calls go back: ``custom`` tools (by provider name) as
    ``custom_tool_call`` items, and a namespaced tool's call under its namespace."""

    custom: frozenset[str]
    namespaced: dict[str, tuple[str, str]]  # provider name -> (namespace, name)
    search: bool = False  # a call of ``tool_search`` goes back as a tool_search_call


def tool_names(body: dict[str, Any]) -> ToolNames:
    entries = _entries(body)
    return ToolNames(
        frozenset(_flat(ns, t.get("name")) for ns, t in entries if t.get("type") == "custom"),
        {_flat(ns, t.get("name")): (ns, str(t.get("name"))) for ns, t in entries if ns},
        search_tool(body) is not None,
    )


def dropped_tools(body: dict[str, Any]) -> list[str]:
    return [str(t["type"]) for t in body.get("tools") or []
            if isinstance(t, dict) and t.get("type") in _DROPPED_TOOLS]  # fmt: skip


def _tools(body: dict[str, Any]) -> list[Tool] | None:
    tools = []
    if (search := search_tool(body)) is not None:
        tools.append(wire._tool(SEARCH, search.get("description") or _SEARCH_DESCRIPTION,
                                search.get("parameters") or _SEARCH_INPUT))  # fmt: skip
    for namespace, entry in _entries(body):
        kind, name = entry.get("type"), _flat(namespace, entry.get("name"))
        if kind == "function":
            if entry.get("strict"):
                raise InvalidRequest(f"tool {name!r}: strict schemas are not "
                                     "supported (strict: false)", field="tools")  # fmt: skip
            tools.append(wire._tool(name, entry.get("description"), entry.get("parameters")))
        elif kind == "custom":
            # A freeform tool becomes a function taking its text as ``input``; a grammar
            # is described to the model (in the description), not enforced.
            description = str(entry.get("description") or "")
            fmt = wire._object(entry.get("format") or {"type": "text"}, "a custom tool's format")
            if fmt.get("type") == "grammar":
                description += (f"\n\nThe input must follow this {fmt.get('syntax')} grammar:\n"
                                f"{fmt.get('definition')}")  # fmt: skip
            tools.append(wire._tool(name, description, _CUSTOM_INPUT))
        elif kind not in _DROPPED_TOOLS:
            raise InvalidRequest(
                f"tool type {kind!r} is not supported (function and custom tools, also in "
                "namespaces, and a client-run tool_search; web_search "
                "is left out; local_shell and OpenAI's other server tools are not: give the "
                "agent a function shell tool)",
                field="tools",
            )
    return tools or None


def _choice(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    choice = wire._object(value, "tool_choice")
    if choice.get("type") in ("function", "custom") and choice.get("name"):
        return _flat(choice.get("namespace"), choice["name"])
    raise InvalidRequest(f"tool_choice {value!r} is not supported (auto, required, none, or "
                         "a function or custom tool by name)", field="tool_choice")  # fmt: skip


def _content(content: Any, role: str) -> tuple[str, tuple[Image, ...]]:
    """A message's (or a tool output's) text and images."""
    if content is None or isinstance(content, str):
        return content or "", ()
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or a list of parts")
    texts: list[str] = []
    images: list[Image] = []
    for part in content:
        part = wire._object(part, "a content part")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "refusal"):
            texts.append(str(part.get("text", part.get("refusal", ""))))
        elif kind == "input_image" and role != "assistant":
            url = part.get("image_url")
            if not isinstance(url, str) or not url.startswith("data:"):
                raise InvalidRequest(wire._INLINE_ONLY)
            images.append(Image(url=url))
        else:
            raise InvalidRequest(f"content of type {kind!r} is not supported here (input_text, "
                                 "output_text, inline input_image; no files or audio)")  # fmt: skip
    return "".join(texts), tuple(images)


def _output_text(value: Any) -> tuple[str, tuple[Image, ...]]:
    return _content(value if isinstance(value, list) else str(value or ""), "tool")


def _turns(items: Any) -> tuple[list[Message], list[str]]:
    """The input items as neutral turns, and the system texts (instructions and the
    system/developer messages, in order: the neutral form has one system prompt)."""
    if isinstance(items, str):
        return [Message(role="user", content=items)], []
    if not isinstance(items, list):
        raise InvalidRequest("input must be a string or a list of items")
    turns: list[Message] = []
    system: list[str] = []

    def call(c: ToolCall) -> None:
        # Calls after an assistant turn (or its other calls) join it: one assistant turn.
        if turns and turns[-1].role == "assistant":
            last = turns[-1]
            turns[-1] = last.model_copy(update={"tool_calls": (*last.tool_calls, c)})
        else:
            turns.append(Message(role="assistant", tool_calls=(c,)))

    for item in items:
        item = wire._object(item, "an input item")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text, images = _content(item.get("content"), str(role))
            if role in ("system", "developer"):
                system.append(text)
            elif role in ("user", "assistant"):
                turns.append(Message(role=role, content=text, images=images))
            else:
                raise InvalidRequest(f"message role {role!r} is not supported "
                                     "(user, assistant, system, developer)")  # fmt: skip
        elif kind == "function_call":
            call(ToolCall(str(item.get("call_id") or ""),
                          _flat(item.get("namespace"), item.get("name")),
                          wire._arguments(item.get("arguments"))))  # fmt: skip
        elif kind == "custom_tool_call":
            call(ToolCall(str(item.get("call_id") or ""),
                          _flat(item.get("namespace"), item.get("name")),
                          json.dumps({"input": str(item.get("input") or "")})))  # fmt: skip
        elif kind == "tool_search_call":
            if item.get("execution") != "client":
                raise InvalidRequest("a tool_search_call run by the server is not supported "
                                     "(execution 'client' only)", field="input")  # fmt: skip
            call(ToolCall(str(item.get("call_id") or ""), SEARCH,
                          wire._arguments(item.get("arguments"))))  # fmt: skip
        elif kind == "tool_search_output":
            turns.append(Message(role="tool", content=_search_result(item),
                                 tool_call_id=str(item.get("call_id") or "")))  # fmt: skip
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text, images = _output_text(item.get("output"))
            turns.append(Message(role="tool", content=text, images=images,
                                 tool_call_id=str(item.get("call_id") or "")))  # fmt: skip
        elif kind == "reasoning":
            # A model's earlier reasoning: opaque to chat-completions and Anthropic
            # providers (and never produced here), so it is not resent.
            continue
        else:
            raise InvalidRequest(
                f"input item of type {kind!r} is not supported (message, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output, "
                "tool_search_call, tool_search_output, reasoning)"
                + ("; " + _STATELESS if kind == "item_reference" else "")
            )
    return turns, system


def _search_result(item: dict[str, Any]) -> str:
    """A tool search's result as the provider's model reads it: the tools now callable
    (their definitions join the request's tools)."""
    loaded = _entries({"tools": wire._list(item.get("tools"), "a tool_search_output's tools")})
    if not loaded:
        return "No tools matched the search."
    lines = []
    for namespace, tool in loaded:
        description = " ".join(str(tool.get("description") or "").split())
        lines.append(f"- {_flat(namespace, tool.get('name'))}: {description[:_MAX_SHOWN]}")
    return "These tools are now available to call:\n" + "\n".join(lines)


def from_responses(body: dict[str, Any]) -> ChatRequest:
    _check_fields(body)
    turns, system = _turns(body.get("input"))
    instructions = body.get("instructions")
    if instructions:
        system.insert(0, str(instructions))
    verbosity = (body.get("text") or {}).get("verbosity")
    reasoning = wire._object(body.get("reasoning") or {}, "reasoning")
    unknown = set(reasoning) - {"effort", "summary", "generate_summary"}
    if unknown:
        raise InvalidRequest(f"reasoning.{sorted(unknown)[0]} is not supported (effort, "
                             "summary)", field="reasoning")  # fmt: skip
    try:
        return ChatRequest(
            model=body.get("model"),
            messages=turns,
            system="\n\n".join(system) or None,
            # Unset: no limit of ours, as at OpenAI (an Anthropic provider needs one:
            # anthropic.DEFAULT_MAX_TOKENS).
            max_tokens=body.get("max_output_tokens"),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            stream=bool(body.get("stream")),
            tools=_tools(body),
            tool_choice=_choice(body.get("tool_choice")),
            parallel_tool_calls=body.get("parallel_tool_calls"),
            # The effort an OpenAI provider honours (another reasons as it does by
            # default: ChatRequest.reasoning_effort); summaries are not produced (no
            # reasoning items come back), which changes what is shown, not the answer.
            reasoning_effort=reasoning.get("effort"),
            # Medium is every model's default; low and high reach an Anthropic model as
            # words in its system prompt (ChatRequest.verbosity).
            verbosity=None if verbosity == "medium" else verbosity,
        )
    except (ValueError, TypeError) as e:
        raise InvalidRequest(f"invalid request: {e}") from None


# Answers -------------------------------------------------------------------------------
def _usage(u: Usage | None) -> dict[str, Any]:
    u = u or Usage()
    return {"input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total}  # fmt: skip


def _call_item(call: ToolCall, names: ToolNames, done: bool = True) -> dict[str, Any]:
    status = "completed" if done else "in_progress"
    if names.search and call.name == SEARCH:
        # Arguments as an object (as OpenAI sends them), whatever the model wrote.
        arguments = tool_input(call.arguments) if done else {}
        return {"type": "tool_search_call", "id": "tsc_" + call.id, "call_id": call.id,
                "execution": "client", "arguments": arguments, "status": status}  # fmt: skip
    namespace, name = names.namespaced.get(call.name, (None, call.name))
    where = {"namespace": namespace} if namespace else {}
    if call.name in names.custom:
        try:
            text = json.loads(call.arguments)["input"] if done else ""
        except (ValueError, KeyError, TypeError):
            text = call.arguments  # not the {"input": ...} asked for: the text as written
        return {"type": "custom_tool_call", "id": "ctc_" + call.id, "call_id": call.id,
                **where, "name": name, "input": str(text), "status": status}  # fmt: skip
    return {"type": "function_call", "id": "fc_" + call.id, "call_id": call.id, **where,
            "name": name, "arguments": call.arguments if done else "",
            "status": status}  # fmt: skip


def _message_item(ident: str, text: str, done: bool = True) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
    return {"type": "message", "id": ident, "status": "completed" if done else "in_progress",
            "role": "assistant", "content": content}  # fmt: skip


def _envelope(ident: str, body: dict[str, Any], model: str, status: str,
              output: list[dict[str, Any]], usage: Usage | None) -> dict[str, Any]:  # fmt: skip
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": ident, "object": "response", "created_at": int(time.time()), "status": status,
        "model": model, "output": output, "error": None, "incomplete_details": incomplete,
        "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": None,
        "store": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": None if usage is None and status == "in_progress" else _usage(usage),
    }  # fmt: skip


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _headers(body: dict[str, Any], provider: str | None = None) -> dict[str, str]:
    headers = {"X-Agentbox-Provider": provider} if provider else {}
    if dropped := dropped_tools(body):
        headers["X-Agentbox-Dropped-Tools"] = ",".join(dropped)
    return headers


def responses_json(r: ChatResponse, body: dict[str, Any], background: BackgroundTask
                   ) -> JSONResponse:  # fmt: skip
    names = tool_names(body)
    output = [_message_item("msg_" + secrets.token_hex(12), r.text)] if r.text else []
    output += [_call_item(c, names) for c in r.tool_calls]
    data = _envelope("resp_" + secrets.token_hex(12), body, r.model,
                     _status(r.finish_reason), output, r.usage)  # fmt: skip
    return JSONResponse(data, headers=_headers(body, r.provider), background=background)


def stream_headers(body: dict[str, Any]) -> dict[str, str]:
    return _headers(body)


async def responses_sse(first: StreamEvent, rest: AsyncGenerator[StreamEvent, None],
                        body: dict[str, Any], chat: ChatRequest
                        ) -> AsyncGenerator[bytes, None]:  # fmt: skip
    """The events Codex and the openai SDK read: response.created, output items added and
    done (a message with its text deltas, function or custom calls with their arguments),
    then response.completed (or .incomplete) with the usage, or response.failed."""
    ident, names = "resp_" + secrets.token_hex(12), tool_names(body)
    model = first.model or chat.model or ""
    number = 0
    output: list[dict[str, Any]] = []

    def sse(kind: str, **data: Any) -> bytes:
        nonlocal number
        number += 1
        payload = json.dumps({"type": kind, "sequence_number": number - 1, **data})
        return f"event: {kind}\ndata: {payload}\n\n".encode()

    def envelope(status: str, usage: Usage | None = None) -> dict[str, Any]:
        return _envelope(ident, body, model, status, output, usage)

    head = sse("response.created", response=envelope("in_progress"))
    head += sse("response.in_progress", response=envelope("in_progress"))
    text: list[str] = []  # the open message's text
    message_id = ""

    def close_message() -> bytes:
        nonlocal text, message_id
        if not message_id:
            return b""
        whole, index = "".join(text), len(output)
        item = _message_item(message_id, whole)
        part = item["content"][0]
        out = sse("response.output_text.done", item_id=message_id, output_index=index,
                  content_index=0, text=whole, logprobs=[])  # fmt: skip
        out += sse("response.content_part.done", item_id=message_id, output_index=index,
                   content_index=0, part=part)  # fmt: skip
        out += sse("response.output_item.done", output_index=index, item=item)
        output.append(item)
        text, message_id = [], ""
        return out

    try:
        async with aclosing(wire._all(first, rest)) as events:
            async for event in events:
                out, head = head, b""
                if event.kind in ("reasoning", "reasoning_done"):
                    # Anthropic's thinking: no Responses item carries it back with its
                    # signature (which only Anthropic checks), so it is not shown.
                    if out:
                        yield out
                    continue
                if event.kind == "text":
                    if not message_id:
                        message_id = "msg_" + secrets.token_hex(12)
                        out += sse("response.output_item.added", output_index=len(output),
                                   item=_message_item(message_id, "", done=False))  # fmt: skip
                        out += sse("response.content_part.added", item_id=message_id,
                                   output_index=len(output), content_index=0,
                                   part={"type": "output_text", "text": "",
                                         "annotations": []})  # fmt: skip
                    text.append(event.text)
                    yield out + sse("response.output_text.delta", item_id=message_id,
                                    output_index=len(output), content_index=0,
                                    delta=event.text, logprobs=[])  # fmt: skip
                    continue
                out += close_message()
                if event.kind == "tool_call" and event.tool_call is not None:
                    item, index = _call_item(event.tool_call, names), len(output)
                    started = _call_item(event.tool_call, names, done=False)
                    out += sse("response.output_item.added", output_index=index, item=started)
                    if item["type"] == "tool_search_call":
                        pass  # no argument deltas: the item arrives whole
                    elif item["type"] == "custom_tool_call":
                        delta = "response.custom_tool_call_input"
                        out += sse(delta + ".delta", item_id=item["id"], output_index=index,
                                   delta=item["input"])  # fmt: skip
                        out += sse(delta + ".done", item_id=item["id"], output_index=index,
                                   input=item["input"])  # fmt: skip
                    else:
                        delta = "response.function_call_arguments"
                        out += sse(delta + ".delta", item_id=item["id"], output_index=index,
                                   delta=item["arguments"])  # fmt: skip
                        out += sse(delta + ".done", item_id=item["id"], output_index=index,
                                   name=item["name"], arguments=item["arguments"])  # fmt: skip
                    output.append(item)
                    yield out + sse("response.output_item.done", output_index=index, item=item)
                    continue
                if event.kind == "done":
                    model = event.model or model
                    status = _status(event.finish_reason)
                    yield out + sse(f"response.{status}", response=envelope(status, event.usage))
                else:
                    yield out
    except AgentboxError as e:  # after the first byte only a stream event can say it
        failed = envelope("failed") | {"error": {"code": e.code, "message": e.message}}
        yield close_message() + sse("response.failed", response=failed)
