"""OpenAI chat completions (and every server that speaks them: vLLM, Ollama, llama.cpp …).

``POST {base_url}/chat/completions`` with ``Authorization: Bearer``. Streams are SSE
``data: {chunk}`` lines ending with ``data: [DONE]``; with
``stream_options.include_usage`` the last chunk before it carries the usage.
``max_tokens`` (not ``max_completion_tokens``) because local servers only know that one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from httpx2 import ServerSentEvent

from agentbox.models.providers.adapter import Adapter
from agentbox.models.providers.types import (
    Category,
    ChatRequest,
    ChatResponse,
    Message,
    ProviderFailure,
    StreamEvent,
    ToolCall,
    Usage,
)


def _usage(data: Any) -> Usage:
    """prompt_tokens includes the cached input (prompt_tokens_details.cached_tokens)."""
    details = data.get("prompt_tokens_details") or {}
    return Usage(
        int(data.get("prompt_tokens") or 0),
        int(data.get("completion_tokens") or 0),
        cache_read_tokens=int(details.get("cached_tokens") or 0),
    )


def _content(m: Message) -> Any:
    if not m.images:
        return m.content
    parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    return parts + [{"type": "image_url", "image_url": {"url": i.data_url()}} for i in m.images]


def _message(m: Message) -> dict[str, Any]:
    if m.role == "tool":  # images of a result travel in a user turn after the results
        # OpenAI has no error flag on a result: the text says it.
        content = f"Error: {m.content}" if m.is_error else m.content
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": content}
    if m.tool_calls:
        return {
            "role": m.role,
            "content": m.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ],
        }  # fmt: skip
    return {"role": m.role, "content": _content(m)}


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    """OpenAI's turns. A tool turn cannot hold images, and the results of one assistant
    turn must follow it directly: their images go in one user turn after the last."""
    out: list[dict[str, Any]] = []
    pending: list[Message] = []  # tool turns with images, since the last non-tool turn
    for m in messages:
        if m.role != "tool" and pending:
            out.append(_result_images(pending))
            pending = []
        out.append(_message(m))
        if m.role == "tool" and m.images:
            pending.append(m)
    if pending:
        out.append(_result_images(pending))
    return out


def _result_images(results: list[Message]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for m in results:
        parts.append({"type": "text", "text": f"Images of the result of {m.tool_call_id}:"})
        parts += [{"type": "image_url", "image_url": {"url": i.data_url()}} for i in m.images]
    return {"role": "user", "content": parts}


def _error_in_body(data: Any) -> ProviderFailure | None:
    # Some compatible servers answer 200 (or end a stream) with an error object.
    if isinstance(data, dict) and data.get("error"):
        error = data["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return ProviderFailure(Category.SERVER_ERROR, f"error in the answer: {message}"[:300])
    return None


# Request fields OpenAI takes as they are, under the same name, when set.
_AS_IS = ("max_tokens", "temperature", "top_p", "reasoning_effort", "verbosity")


class OpenAIAdapter(Adapter):
    kind = "openai"
    default_base_url = "https://api.openai.com/v1"
    path = "/chat/completions"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def payload(self, request: ChatRequest, stream: bool) -> dict[str, Any]:
        messages = [{"role": "system", "content": request.system}] if request.system else []
        messages += _messages(request.messages)
        body: dict[str, Any] = {
            "model": self.model_of(request),
            "messages": messages,
        }
        body |= {k: v for k in _AS_IS if (v := getattr(request, k)) is not None}
        if request.stop:
            body["stop"] = request.stop
        if request.tools and request.tool_choice:
            named = request.tool_choice not in ("auto", "required", "none")
            body["tool_choice"] = (
                {"type": "function", "function": {"name": request.tool_choice}}
                if named
                else request.tool_choice
            )
        if request.tools and request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def parse(self, data: Any, request: ChatRequest) -> ChatResponse:
        if failure := _error_in_body(data):
            raise failure
        choice = data["choices"][0]
        message = choice["message"]
        calls = [
            ToolCall(c["id"], c["function"]["name"], c["function"].get("arguments") or "{}")
            for c in message.get("tool_calls") or []
        ]
        return ChatResponse(
            text=message.get("content") or "",
            model=data.get("model") or self.model_of(request),
            provider=self.name,
            usage=_usage(data.get("usage") or {}),
            finish_reason=choice.get("finish_reason"),
            tool_calls=calls,
            raw=data,
        )

    async def events(
        self, source: AsyncIterator[ServerSentEvent], request: ChatRequest
    ) -> AsyncIterator[StreamEvent]:
        model = self.model_of(request)
        usage: Usage | None = None
        finish: str | None = None
        calls: dict[int, dict[str, str]] = {}  # a call arrives in pieces, by index
        async for event in source:
            if event.data.strip() == "[DONE]":
                for index in sorted(calls):
                    call = calls[index]
                    yield StreamEvent("tool_call", tool_call=ToolCall(
                        call["id"], call["name"], call["arguments"] or "{}"))  # fmt: skip
                yield StreamEvent(
                    "done",
                    usage=usage or Usage(),
                    finish_reason=finish,
                    model=model,
                    provider=self.name,
                )
                return
            chunk = json.loads(event.data)
            if failure := _error_in_body(chunk):
                raise failure
            model = chunk.get("model") or model
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if text := delta.get("content"):
                    yield StreamEvent("text", text=text)
                for piece in delta.get("tool_calls") or []:
                    index = piece.get("index")
                    if index is None:  # some servers send whole calls without an index
                        last = calls.get(len(calls) - 1)
                        fresh = last is None or (piece.get("id") and piece["id"] != last["id"])
                        index = len(calls) if fresh else len(calls) - 1
                    call = calls.setdefault(int(index), {"id": "", "name": "", "arguments": ""})
                    function = piece.get("function") or {}
                    call["id"] = piece.get("id") or call["id"]
                    call["name"] = function.get("name") or call["name"]
                    call["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                usage = _usage(chunk["usage"])
        raise ProviderFailure(Category.CONNECTION, "the stream ended before data: [DONE]")
