"""Anthropic messages API.

``POST {base_url}/v1/messages`` with ``x-api-key`` and ``anthropic-version``. Streams are
SSE events: ``message_start`` (input tokens), ``content_block_delta`` (``text_delta``),
``message_delta`` (stop reason, cumulative output tokens), ``message_stop``; ``ping`` and
block start/stop carry nothing we need; ``error`` can arrive mid-stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from httpx2 import ServerSentEvent

from agentbox.errors import InvalidRequest
from agentbox.models.providers.adapter import Adapter
from agentbox.models.providers.types import (
    Category,
    ChatRequest,
    ChatResponse,
    Image,
    Message,
    ProviderFailure,
    Reasoning,
    StreamEvent,
    ToolCall,
    Usage,
)

API_VERSION = "2023-06-01"
# Anthropic requires an output limit; for a request that sets none (a Responses client):
# what every current Claude model can write.
DEFAULT_MAX_TOKENS = 8192
# Anthropic's stop reasons in OpenAI's words, so callers see one vocabulary.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
_CHOICE: dict[str, dict[str, Any]] = {
    "auto": {"type": "auto"},
    "required": {"type": "any"},
    "none": {"type": "none"},
}
# The ``anthropic-beta`` features an Anthropic client may ask an Anthropic provider for,
# by family (the name without its date: a new version of a family is judged as the
# family), each with why it is safe: it changes how the model reads the request or writes
# the answer, and reaches nothing the request does not carry.
SAFE_BETAS = {
    "claude-code": "names the client as Claude Code; changes no field",
    "interleaved-thinking": "thinking between tool calls: blocks the gateway passes through",
    "context-management": "the provider drops old tool results or thinking from what the "
                          "model reads (context_management): less input, nothing new",
    "effort": "output_config.effort: how much the model thinks",
    "thinking-token-count": "the usage also counts thinking tokens (already billed as output)",
    "mid-conversation-tool-changes": "the tool list may change between turns",
    "fine-grained-tool-streaming": "tool input streamed unbuffered; the gateway gathers it",
    "token-efficient-tools": "a denser tool-call encoding; the same calls",
    "output-128k": "longer answers, at the same price per token",
    "prompt-caching": "cache_control marks (generally available; cache reads and writes are "
                      "priced)",
    "pdfs": "inline PDF documents (sent inline, redacted around)",
    "token-counting": "count_tokens",
}  # fmt: skip
# Families refused with a 400 that says why: the provider would act outside the sandbox
# and its egress policy, hold data the gateway cannot see, or bill at prices the price
# tables do not have.
REFUSED_BETAS = {
    "mcp-client": "the provider would connect to MCP servers itself, outside the "
                  "sandbox's egress policy: give the agent agentbox's MCP tools",
    "web-fetch": "the provider would fetch URLs from its servers, outside the sandbox's "
                 "egress policy: browse from the sandbox",
    "web-search": "the provider would search the web from its servers, outside the "
                  "sandbox's egress policy",
    "code-execution": "the provider would run code on its servers, outside the sandbox",
    "skills": "skills run in the provider's code execution, outside the sandbox",
    "files-api": "files stored at the provider are sent by reference, past redaction",
    "extended-cache-ttl": "1-hour cache writes cost 2x input, not the cache_write price "
                          "budgets are counted with",
    "context-1m": "input beyond 200k tokens costs more than the price tables say, so "
                  "budgets would undercount",
}  # fmt: skip
_DATED = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


def betas(header: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An ``anthropic-beta`` header judged: the betas to forward and those dropped
    (unknown: the provider refuses any field that needed one, naming it). A refused
    beta raises ``InvalidRequest`` naming it and why."""
    kept: list[str] = []
    dropped: list[str] = []
    for beta in filter(None, (b.strip() for b in (header or "").split(","))):
        family = _DATED.sub("", beta)
        if family in REFUSED_BETAS:
            raise InvalidRequest(f"anthropic-beta {beta!r} is not allowed through agentbox: "
                                 f"{REFUSED_BETAS[family]}", beta=beta)  # fmt: skip
        (kept if family in SAFE_BETAS else dropped).append(beta)
    return tuple(kept), tuple(dropped)


# OpenAI's text.verbosity, which Anthropic has no field for, said to the model instead.
VERBOSITY = {
    "low": "Keep your answers short: say what is needed and no more.",
    "high": "Give thorough answers: explain your reasoning and the details.",
}
# What POST /v1/messages/count_tokens accepts of a messages request.
_COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers")
_ERROR_CATEGORY = {
    "rate_limit_error": Category.RATE_LIMITED,
    "overloaded_error": Category.SERVER_ERROR,
    "api_error": Category.SERVER_ERROR,
    "authentication_error": Category.AUTH,
    "permission_error": Category.AUTH,
    "invalid_request_error": Category.BAD_REQUEST,
}


def _finish(reason: Any) -> str | None:
    return _FINISH.get(reason, reason) if reason else None


def _error(data: Any) -> ProviderFailure:
    error = data.get("error") or {}
    category = _ERROR_CATEGORY.get(str(error.get("type")), Category.SERVER_ERROR)
    return ProviderFailure(category, f"{error.get('type')}: {error.get('message')}"[:300])


def usage_of(data: Any, output_tokens: int | None = None) -> Usage:
    """Anthropic's usage in the neutral words: its input_tokens leave out the cache reads
    and writes, which the neutral input counts."""
    read = int(data.get("cache_read_input_tokens") or 0)
    write = int(data.get("cache_creation_input_tokens") or 0)
    return Usage(
        int(data.get("input_tokens") or 0) + read + write,
        int(data.get("output_tokens") or 0) if output_tokens is None else output_tokens,
        cache_read_tokens=read,
        cache_write_tokens=write,
    )


def tool_input(arguments: str) -> Any:
    """A call's arguments as the JSON object Anthropic wants (a model may have written
    invalid JSON: then the text, under one key, so nothing is lost)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _image(image: Image) -> dict[str, Any]:
    if image.url and not image.url.startswith("data:"):
        return {"type": "image", "source": {"type": "url", "url": image.url}}
    media_type, data = image.media_type, image.data
    if image.url:  # a data: URL
        head, _, data = image.url.partition(",")
        media_type = head.removeprefix("data:").split(";")[0]
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _blocks(m: Message) -> list[dict[str, Any]]:
    text: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    images = [_image(i) for i in m.images]
    if m.role == "tool":
        content: Any = text + images if images else m.content
        result = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": content}
        return [{**result, "is_error": True} if m.is_error else result]
    return (
        text
        + images
        + [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c.arguments)}
            for c in m.tool_calls
        ]
    )


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Anthropic's turns: tool results travel in a user turn, and consecutive turns of one
    role become one (its content blocks in order); a plain text turn stays a string."""
    turns: list[dict[str, Any]] = []
    for m in messages:
        role = "user" if m.role == "tool" else m.role
        plain = m.role != "tool" and not m.tool_calls and not m.images
        if turns and turns[-1]["role"] == role:
            previous = turns[-1]
            if isinstance(previous["content"], str):
                previous["content"] = [{"type": "text", "text": previous["content"]}]
            previous["content"] += _blocks(m)
        else:
            turns.append({"role": role, "content": m.content if plain else _blocks(m)})
    return turns


class AnthropicAdapter(Adapter):
    kind = "anthropic"
    default_base_url = "https://api.anthropic.com"
    path = "/v1/messages"

    def headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def request_headers(self, request: ChatRequest) -> dict[str, str]:
        return {"anthropic-beta": ",".join(request.betas)} if request.betas else {}

    def payload(self, request: ChatRequest, stream: bool) -> dict[str, Any]:
        if request.native is not None and request.extra_kind == self.kind:
            # An Anthropic client's own body, as it sent it (redacted): nothing lost.
            native = {k: v for k, v in request.native.items() if k != "stream"}
            limit = {"max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS}  # if it set none
            return (limit | native | {"model": self.model_of(request)}
                    | ({"stream": True} if stream else {}))  # fmt: skip
        body: dict[str, Any] = {
            "model": self.model_of(request),
            "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": _messages(request.messages),
        }
        system = [request.system] if request.system else []
        if request.verbosity in VERBOSITY:
            system.append(VERBOSITY[request.verbosity])
        if system:
            body["system"] = "\n\n".join(system)
        if request.temperature is not None:
            # Anthropic refuses more than 1 (OpenAI's scale goes to 2): clamp, not fail.
            body["temperature"] = min(request.temperature, 1.0)
        if request.top_p is not None and request.temperature is None:
            # Recent Claude models refuse both at once; OpenAI clients often send both.
            body["top_p"] = request.top_p
        if request.stop:
            body["stop_sequences"] = request.stop
        if request.tools and (request.tool_choice or request.parallel_tool_calls is False):
            choice: dict[str, Any] = _CHOICE.get(request.tool_choice or "auto") or {
                "type": "tool",
                "name": request.tool_choice,
            }
            if request.parallel_tool_calls is False and choice["type"] != "none":
                choice = {**choice, "disable_parallel_tool_use": True}
            body["tool_choice"] = choice
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        if stream:
            body["stream"] = True
        return body

    async def count_tokens(self, request: ChatRequest) -> int | None:
        # The counting endpoint takes only what shapes the input (no max_tokens, stream …).
        body = {k: v for k, v in self.payload(request, stream=False).items() if k in _COUNTED}
        data = await self._post_json(f"{self.url()}/count_tokens", body,
                                     self.request_headers(request))  # fmt: skip
        try:
            return int(data["input_tokens"])
        except (KeyError, TypeError, ValueError) as e:
            raise self._malformed(e) from e

    def parse(self, data: Any, request: ChatRequest) -> ChatResponse:
        if data.get("type") == "error":
            raise _error(data)
        blocks = data["content"]
        usage = data.get("usage") or {}
        return ChatResponse(
            reasoning=[
                Reasoning(b.get("thinking") or "", b.get("signature") or "")
                if b["type"] == "thinking"
                else Reasoning(redacted=b.get("data") or "")
                for b in blocks
                if b.get("type") in ("thinking", "redacted_thinking")
            ],
            stop_sequence=data.get("stop_sequence"),
            text="".join(b["text"] for b in blocks if b.get("type") == "text"),
            model=data.get("model") or self.model_of(request),
            provider=self.name,
            usage=usage_of(usage),
            finish_reason=_finish(data.get("stop_reason")),
            tool_calls=[
                ToolCall(b["id"], b["name"], json.dumps(b.get("input") or {}))
                for b in blocks
                if b.get("type") == "tool_use"
            ],
            raw=data,
        )

    async def events(
        self, source: AsyncIterator[ServerSentEvent], request: ChatRequest
    ) -> AsyncIterator[StreamEvent]:
        model = self.model_of(request)
        usage = Usage()
        finish: str | None = None
        calls: dict[int, dict[str, str]] = {}  # tool_use blocks being received, by index
        thinking: dict[int, str] = {}  # thinking blocks being received: their signature
        stop_sequence: str | None = None
        async for event in source:
            data = json.loads(event.data) if event.data else {}
            kind = data.get("type") or event.event
            block = data.get("content_block") or {}
            if kind == "content_block_start" and block.get("type") == "tool_use":
                calls[data["index"]] = {"id": block["id"], "name": block["name"], "input": ""}
            elif kind == "content_block_start" and block.get("type") == "thinking":
                thinking[data["index"]] = block.get("signature") or ""
            elif kind == "content_block_start" and block.get("type") == "redacted_thinking":
                yield StreamEvent("reasoning_done", reasoning=Reasoning(redacted=block["data"]))
            elif kind == "content_block_stop" and data.get("index") in thinking:
                signature = thinking.pop(data["index"])
                yield StreamEvent("reasoning_done", reasoning=Reasoning(signature=signature))
            elif kind == "content_block_stop" and data.get("index") in calls:
                call = calls.pop(data["index"])
                yield StreamEvent("tool_call", tool_call=ToolCall(
                    call["id"], call["name"], call["input"] or "{}"))  # fmt: skip
            elif kind == "message_start":
                message = data["message"]
                model = message.get("model") or model
                usage = usage_of(message.get("usage") or {})
            elif kind == "content_block_delta":
                delta = data["delta"]
                if delta.get("type") == "text_delta" and delta.get("text"):
                    yield StreamEvent("text", text=delta["text"])
                elif delta.get("type") == "input_json_delta" and data.get("index") in calls:
                    calls[data["index"]]["input"] += delta.get("partial_json") or ""
                elif delta.get("type") == "thinking_delta" and delta.get("thinking"):
                    yield StreamEvent("reasoning", text=delta["thinking"])
                elif delta.get("type") == "signature_delta" and data.get("index") in thinking:
                    thinking[data["index"]] += delta.get("signature") or ""
            elif kind == "message_delta":
                finish = _finish((data.get("delta") or {}).get("stop_reason")) or finish
                stop_sequence = (data.get("delta") or {}).get("stop_sequence") or stop_sequence
                # Cumulative counts: the last one wins (input ones, when it repeats them).
                counts = data.get("usage") or {}
                output = int(counts.get("output_tokens") or usage.output_tokens)
                usage = replace(usage, output_tokens=output)
                if "input_tokens" in counts:
                    cached = {"cache_read_input_tokens": usage.cache_read_tokens,
                              "cache_creation_input_tokens": usage.cache_write_tokens}  # fmt: skip
                    usage = usage_of(cached | counts, output)
            elif kind == "message_stop":
                yield StreamEvent(
                    "done",
                    usage=usage,
                    finish_reason=finish,
                    model=model,
                    provider=self.name,
                    stop_sequence=stop_sequence,
                )
                return
            elif kind == "error":
                raise _error(data)
        raise ProviderFailure(Category.CONNECTION, "the stream ended before message_stop")
