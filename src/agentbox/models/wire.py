"""The model endpoint's two wire formats, both ways: an OpenAI chat-completions or
Anthropic messages request body to the neutral ``ChatRequest``, and a ``ChatResponse`` or
a stream of ``StreamEvent`` back to the client's format (JSON, or SSE chunks).

Text, tool calls and results, images, ``top_p``, stop sequences and the tool choice
translate; an OpenAI client's other top-level fields (``response_format``, ``seed``, …)
travel untranslated to an OpenAI provider only. An Anthropic client's body goes to an
Anthropic provider as it is (redacted): ``thinking`` and its signed blocks, ``cache_control``
marks, documents, ``metadata``, all intact, and the answer's thinking blocks and matched
``stop_sequence`` come back. Across formats, thinking (the setting and earlier blocks) and
cache marks are dropped (OpenAI caches prompts by itself; thinking blocks verify only at
their issuer); a document is refused unless an Anthropic provider serves the model. Content
that cannot be represented is refused with an ``InvalidRequest`` that says what is
supported.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Literal

from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from agentbox.errors import AgentboxError, InvalidRequest
from agentbox.models.providers.anthropic import tool_input
from agentbox.models.providers.types import (
    ChatRequest,
    ChatResponse,
    Image,
    Message,
    Reasoning,
    StreamEvent,
    Tool,
    ToolCall,
    Usage,
)

_FINISH_OPENAI = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
_FINISH_ANTHROPIC = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _openai_finish(reason: str | None) -> str:
    return _FINISH_OPENAI.get(reason or "", reason or "stop")


def _anthropic_stop(reason: str | None, stop_sequence: str | None = None) -> str:
    if stop_sequence:
        return "stop_sequence"
    return _FINISH_ANTHROPIC.get(reason or "", reason or "end_turn")


# Carried to an Anthropic provider in the native body; no other provider can verify them.
_SKIPPED_BLOCKS = ("thinking", "redacted_thinking")
# An OpenAI client's top-level fields translated (or deliberately dropped); the rest travel
# as ChatRequest.extra to an OpenAI provider. Dropped: ``n`` (several answers, one
# returned), ``stream_options`` (set per provider).
_TRANSLATED = {"model", "messages", "max_tokens", "temperature", "top_p", "stream", "tools",
               "tool_choice", "max_completion_tokens", "stop", "stream_options", "n"}  # fmt: skip
_DOCUMENT_SOURCES = ("base64", "text", "content")


def _image(part: dict[str, Any]) -> Image | None:
    """An image part in either format (OpenAI ``image_url``, Anthropic ``image``), else
    None."""
    if part.get("type") == "image_url":
        url = _object(part.get("image_url"), "an image_url").get("url")
        if not isinstance(url, str) or not url.startswith("data:"):
            raise InvalidRequest(_INLINE_ONLY)
        return Image(url=url)
    if part.get("type") == "image":
        source = _object(part.get("source"), "an image's source")
        if source.get("type") == "base64":
            return Image(media_type=str(source.get("media_type") or ""),
                         data=str(source.get("data") or ""))  # fmt: skip
        raise InvalidRequest(_INLINE_ONLY)
    return None


# A URL would be fetched by the provider, from its servers: outside the sandbox's egress
# policy, and a channel for data (in the URL) that redaction cannot see.
_INLINE_ONLY = ("images must be sent inline (base64 / a data: URL): an image URL would be "
                "fetched by the provider, outside the sandbox's network policy")  # fmt: skip


def _parts_of(content: Any, images_allowed: bool = True) -> tuple[str, tuple[Image, ...]]:
    """The text and the images of a message's content (a string or a list of parts)."""
    if content is None:
        return "", ()
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise InvalidRequest("message content must be a string or a list of parts")
    texts: list[str] = []
    images: list[Image] = []
    for part in content:
        part = _object(part, "a content part")
        image = _image(part)
        if image is not None and images_allowed:
            images.append(image)
        elif part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        else:
            raise InvalidRequest(
                f"content of type {part.get('type')!r} is not supported here (text, images "
                "in user turns and tool results, and tool calls are; no files or audio)"
            )
    return "".join(texts), tuple(images)


def _text_of(content: Any) -> str:
    return _parts_of(content, images_allowed=False)[0]


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    """A field that must be an array (absent or null: none)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{what} must be a JSON array")
    return value


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def _tool(name: Any, description: Any, parameters: Any) -> Tool:
    try:
        return Tool(name=str(name or ""), description=str(description or ""),
                    parameters=parameters or {"type": "object"})  # fmt: skip
    except ValueError as e:
        raise InvalidRequest(f"invalid tool {name!r}: {e}") from None


def _openai_tools(body: dict[str, Any]) -> list[Tool] | None:
    tools = []
    for entry in _list(body.get("tools"), "tools"):
        entry = _object(entry, "a tool")
        if entry.get("type", "function") != "function":
            raise InvalidRequest(f"tool type {entry.get('type')!r} is not supported (function)")
        function = _object(entry.get("function"), "a tool's function")
        tools.append(_tool(function.get("name"), function.get("description"),
                           function.get("parameters")))  # fmt: skip
    return tools or None


def _anthropic_tools(body: dict[str, Any]) -> list[Tool] | None:
    tools = []
    for entry in _list(body.get("tools"), "tools"):
        entry = _object(entry, "a tool")
        if entry.get("type", "custom") != "custom":  # a server tool (web search, …)
            raise InvalidRequest(
                f"tool type {entry.get('type')!r} is not supported (custom tools with an "
                "input_schema; the provider's own server tools are not)"
            )
        tools.append(_tool(entry.get("name"), entry.get("description"),
                           entry.get("input_schema")))  # fmt: skip
    return tools or None


def from_openai(body: dict[str, Any]) -> ChatRequest:
    system, turns = [], []
    for m in _list(body.get("messages"), "messages"):
        m = _object(m, "a message")
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(m.get("content")))
        elif role == "tool":
            text, images = _parts_of(m.get("content"))
            turns.append(Message(role="tool", content=text, images=images,
                                 tool_call_id=str(m.get("tool_call_id") or "")))  # fmt: skip
        elif role == "user":
            text, images = _parts_of(m.get("content"))
            turns.append(Message(role="user", content=text, images=images))
        elif role == "assistant":
            calls = tuple(
                ToolCall(str(c.get("id") or ""), str(f.get("name") or ""),
                         _arguments(f.get("arguments")))
                for c in _list(m.get("tool_calls"), "a message's tool_calls")
                for f in [_object(_object(c, "a tool call").get("function"), "a function")]
            )  # fmt: skip
            turns.append(Message(role="assistant", content=_text_of(m.get("content")),
                                 tool_calls=calls))  # fmt: skip
        else:
            raise InvalidRequest(
                f"message role {role!r} is not supported (system, user, assistant, tool)"
            )
    return _request(body, turns, "\n\n".join(system) or None,
                    body.get("max_completion_tokens") or body.get("max_tokens"),
                    _openai_tools(body), body.get("stop"),
                    _openai_choice(body.get("tool_choice")), "openai")  # fmt: skip


def _document(block: dict[str, Any]) -> None:
    """Check a document block (carried natively, never translated)."""
    source = _object(block.get("source"), "a document's source")
    kind = source.get("type")
    if kind == "url":
        raise InvalidRequest(_INLINE_ONLY.replace("images", "documents"))
    if kind == "content":  # blocks of its own: the same rules (no image URLs, …)
        _parts_of(source.get("content"))
    elif kind not in _DOCUMENT_SOURCES:
        raise InvalidRequest(f"a document source of type {kind!r} is not supported "
                             f"({', '.join(_DOCUMENT_SOURCES)}; send files inline)")  # fmt: skip


def _anthropic_turns(m: dict[str, Any], native: list[str]) -> list[Message]:
    """One Anthropic turn in the neutral form: tool results become ``tool`` turns (before
    the text that came with them), tool uses the assistant's calls. What has no neutral
    form (documents) is named in ``native``: only an Anthropic provider can take it."""
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise InvalidRequest(f"message role {role!r} is not supported (user, assistant)")
    content = m.get("content")
    if not isinstance(content, list):
        return [Message(role=role, content=_text_of(content))]
    results, text, calls = [], [], []
    images: list[Image] = []
    for block in content:
        kind = _object(block, "a content block").get("type")
        if kind == "tool_result" and role == "user":
            result_text, result_images = _parts_of(block.get("content"))
            results.append(Message(role="tool", content=result_text, images=result_images,
                                   tool_call_id=str(block.get("tool_use_id") or ""),
                                   is_error=bool(block.get("is_error"))))  # fmt: skip
        elif kind == "tool_use" and role == "assistant":
            calls.append(ToolCall(str(block.get("id") or ""), str(block.get("name") or ""),
                                  _arguments(block.get("input"))))  # fmt: skip
        elif kind in _SKIPPED_BLOCKS:
            continue
        elif kind == "document":
            _document(block)
            native.append("a document block (no other format has one)")
        else:
            block_text, block_images = _parts_of([block], images_allowed=role == "user")
            text.append(block_text)
            images += block_images
    turns = results
    if text or images or calls or not results:
        turns.append(Message(role=role, content="".join(text), tool_calls=tuple(calls),
                             images=tuple(images)))  # fmt: skip
    return turns


def from_anthropic(body: dict[str, Any]) -> ChatRequest:
    native: list[str] = []
    turns = [
        t
        for m in _list(body.get("messages"), "messages")
        for t in _anthropic_turns(_object(m, "a message"), native)
    ]
    system = body.get("system")
    request = _request(body, turns, _text_of(system) if system else None,
                       body.get("max_tokens"), _anthropic_tools(body), body.get("stop_sequences"),
                       _anthropic_choice(body.get("tool_choice")), "anthropic")  # fmt: skip
    return request.model_copy(update={"native": body, "native_only": native[0] if native else None})


def _request(
    body: dict[str, Any],
    turns: list[Message],
    system: str | None,
    max_tokens: Any,
    tools: list[Tool] | None,
    stop: Any,
    tool_choice: str | None,
    kind: Literal["openai", "anthropic"],
) -> ChatRequest:
    extra = {k: v for k, v in body.items() if k not in _TRANSLATED} if kind == "openai" else None
    try:
        return ChatRequest(
            model=body.get("model"),
            messages=turns,
            system=system,
            max_tokens=int(max_tokens or 1024),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            stop=[stop] if isinstance(stop, str) else stop or None,
            stream=bool(body.get("stream")),
            tools=tools,
            tool_choice=tool_choice,
            extra=extra or None,
            extra_kind=kind,
        )
    except (ValueError, TypeError) as e:
        raise InvalidRequest(f"invalid request: {e}") from None


def _openai_choice(value: Any) -> str | None:
    """OpenAI's tool_choice in the neutral words: auto, required, none, or a tool's name."""
    if value is None or isinstance(value, str):
        return value
    function = _object(_object(value, "tool_choice").get("function"), "tool_choice's function")
    return str(function.get("name") or "") or None


def _anthropic_choice(value: Any) -> str | None:
    if value is None:
        return None
    choice = _object(value, "tool_choice")
    kind = choice.get("type")
    if kind == "tool":
        return str(choice.get("name") or "") or None
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))


def _openai_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    named: dict[str, Any] = {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip
    return named if index is None else {"index": index, **named}


def _openai_message(r: ChatResponse) -> dict[str, Any]:
    if not r.tool_calls:
        return {"role": "assistant", "content": r.text}
    return {"role": "assistant", "content": r.text or None,
            "tool_calls": [_openai_call(c) for c in r.tool_calls]}  # fmt: skip


def _thinking_block(r: Reasoning) -> dict[str, Any]:
    if r.redacted:
        return {"type": "redacted_thinking", "data": r.redacted}
    return {"type": "thinking", "thinking": r.text, "signature": r.signature}


def _anthropic_content(r: ChatResponse) -> list[dict[str, Any]]:
    content = [_thinking_block(t) for t in r.reasoning]
    content += [{"type": "text", "text": r.text}] if r.text or not r.tool_calls else []
    content += [{"type": "tool_use", "id": c.id, "name": c.name,
                 "input": tool_input(c.arguments)} for c in r.tool_calls]  # fmt: skip
    return content


def openai_usage(u: Usage) -> dict[str, Any]:
    """OpenAI's usage: prompt_tokens counts the cached input too (cache writes, which
    OpenAI does not bill apart, are in it without a field of their own)."""
    usage: dict[str, Any] = {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total,
    }
    if u.cache_read_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": u.cache_read_tokens}
    return usage


def anthropic_usage(u: Usage) -> dict[str, Any]:
    """Anthropic's usage: input_tokens leaves out the cache reads and writes."""
    cached = u.cache_read_tokens + u.cache_write_tokens
    usage: dict[str, Any] = {"input_tokens": max(0, u.input_tokens - cached),
                             "output_tokens": u.output_tokens}  # fmt: skip
    if cached:
        usage["cache_read_input_tokens"] = u.cache_read_tokens
        usage["cache_creation_input_tokens"] = u.cache_write_tokens
    return usage


def openai_json(r: ChatResponse, background: BackgroundTask) -> JSONResponse:
    return JSONResponse(
        {
            "id": "chatcmpl-" + secrets.token_hex(12),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": r.model,
            "choices": [{
                "index": 0,
                "message": _openai_message(r),
                "finish_reason": _openai_finish(r.finish_reason),
            }],
            "usage": openai_usage(r.usage),
        },
        headers={"X-Agentbox-Provider": r.provider},
        background=background,
    )  # fmt: skip


def anthropic_json(r: ChatResponse, background: BackgroundTask) -> JSONResponse:
    return JSONResponse(
        {
            "id": "msg_" + secrets.token_hex(12),
            "type": "message",
            "role": "assistant",
            "model": r.model,
            "content": _anthropic_content(r),
            "stop_reason": _anthropic_stop(r.finish_reason, r.stop_sequence),
            "stop_sequence": r.stop_sequence,
            "usage": anthropic_usage(r.usage),
        },
        headers={"X-Agentbox-Provider": r.provider},
        background=background,
    )  # fmt: skip


async def _all(first: StreamEvent, rest: AsyncGenerator[StreamEvent, None]
               ) -> AsyncGenerator[StreamEvent, None]:  # fmt: skip
    """``first`` then ``rest``; closed early (the client left), it closes ``rest`` at once:
    the provider's stream ends and what it produced is accounted (ModelService.stream)."""
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


async def openai_sse(first: StreamEvent, rest: AsyncGenerator[StreamEvent, None], usage: bool
                      ) -> AsyncGenerator[bytes, None]:  # fmt: skip
    ident, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None, model: str, **extra: Any) -> bytes:
        data = {"id": ident, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [{"index": 0, "delta": delta,
                                             "finish_reason": finish}], **extra}  # fmt: skip
        return f"data: {json.dumps(data)}\n\n".encode()

    model = first.model or ""
    preamble = chunk({"role": "assistant", "content": ""}, None, model)
    calls = 0  # tool calls sent, each with its index
    try:
        async with aclosing(_all(first, rest)) as events:
            async for event in events:
                # The role chunk leaves with the first event: one write to the first token.
                if event.kind == "text":
                    yield preamble + chunk({"content": event.text}, None, model)
                elif event.kind == "tool_call" and event.tool_call is not None:
                    delta = {"tool_calls": [_openai_call(event.tool_call, calls)]}
                    yield preamble + chunk(delta, None, model)
                    calls += 1
                elif event.kind != "done":
                    continue  # thinking: chat completions has no place for it
                else:
                    yield preamble + chunk(
                        {}, _openai_finish(event.finish_reason), event.model or model
                    )
                preamble = b""
                if event.kind == "done" and usage and event.usage is not None:
                    u = event.usage
                    data = {"id": ident, "object": "chat.completion.chunk", "created": created,
                            "model": event.model or model, "choices": [],
                            "usage": openai_usage(u)}  # fmt: skip
                    yield f"data: {json.dumps(data)}\n\n".encode()
    except AgentboxError as e:  # after the first byte only a stream event can say it
        yield f"data: {json.dumps({'error': e.to_dict()})}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def anthropic_sse(first: StreamEvent, rest: AsyncGenerator[StreamEvent, None],
                        chat: ChatRequest
                         ) -> AsyncGenerator[bytes, None]:  # fmt: skip
    def sse(event: str, data: dict[str, Any]) -> bytes:
        return f"event: {event}\ndata: {json.dumps({'type': event, **data})}\n\n".encode()

    model = first.model or chat.model or ""
    head = sse("message_start", {"message": {
        "id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}})  # fmt: skip
    index, text_open = -1, False  # the last content block, and whether it is open text
    thinking_open = False
    try:
        async with aclosing(_all(first, rest)) as events:
            async for event in events:
                out = head  # message_start leaves with the first event
                head = b""
                if event.kind in ("reasoning", "reasoning_done"):
                    if text_open:
                        out += sse("content_block_stop", {"index": index})
                        text_open = False
                    r = event.reasoning or Reasoning()
                    if r.redacted:
                        index += 1
                        start = {"index": index, "content_block": _thinking_block(r)}
                        yield out + sse("content_block_start", start) + sse(
                                            "content_block_stop", {"index": index})  # fmt: skip
                        continue
                    if not thinking_open:
                        index, thinking_open = index + 1, True
                        start = {"index": index, "content_block": _thinking_block(Reasoning())}
                        out += sse("content_block_start", start)
                    if event.kind == "reasoning":
                        delta = {"type": "thinking_delta", "thinking": event.text}
                        yield out + sse("content_block_delta", {"index": index, "delta": delta})
                        continue
                    delta = {"type": "signature_delta", "signature": r.signature}
                    thinking_open = False
                    yield out + sse("content_block_delta", {"index": index, "delta": delta}) + sse(
                        "content_block_stop", {"index": index})  # fmt: skip
                    continue
                if event.kind == "text":
                    if not text_open:
                        index, text_open = index + 1, True
                        text_block = {"type": "text", "text": ""}
                        out += sse(
                            "content_block_start", {"index": index, "content_block": text_block}
                        )
                    delta = {"type": "text_delta", "text": event.text}
                    yield out + sse("content_block_delta", {"index": index, "delta": delta})
                    continue
                if text_open:
                    out += sse("content_block_stop", {"index": index})
                    text_open = False
                if event.kind == "tool_call" and event.tool_call is not None:
                    call, index = event.tool_call, index + 1
                    block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
                    # An object, whatever the model wrote (as the JSON answer's input).
                    partial = json.dumps(tool_input(call.arguments))
                    delta = {"type": "input_json_delta", "partial_json": partial}
                    yield b"".join((
                        out,
                        sse("content_block_start", {"index": index, "content_block": block}),
                        sse("content_block_delta", {"index": index, "delta": delta}),
                        sse("content_block_stop", {"index": index}),
                    ))  # fmt: skip
                    continue
                u = event.usage
                yield out + sse("message_delta", {
                    "delta": {"stop_reason": _anthropic_stop(event.finish_reason,
                                                             event.stop_sequence),
                              "stop_sequence": event.stop_sequence},
                    "usage": anthropic_usage(u or Usage())})  # fmt: skip
                yield sse("message_stop", {})
    except AgentboxError as e:
        yield sse("error", {"error": {"type": e.code, "message": e.message}})
