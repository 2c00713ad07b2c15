"""The model endpoint: OpenAI-compatible ``POST /v1/chat/completions`` and
``POST /v1/responses``, Anthropic-compatible ``POST /v1/messages`` (JSON and SSE
streaming) and ``POST /v1/messages/count_tokens``, so any agent can send its model calls
through agentbox; plus ``GET /v1/usage`` and ``GET /v1/providers``.

Authentication is the gateway's: a session token (as ``Authorization: Bearer`` or, for
Anthropic clients, ``x-api-key``) attributes the call to its sandbox and that sandbox's
project; the operator token may name a project (``X-Agentbox-Project``). A batch task's
calls carry ``X-Agentbox-Task``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from agentbox.errors import InvalidRequest
from agentbox.gateway import model_wire as wire
from agentbox.gateway import responses_wire
from agentbox.gateway.auth import Principal
from agentbox.gateway.models import Attribution, ModelService
from agentbox.providers.types import ChatRequest, ChatResponse, StreamEvent
from agentbox.runtime.runtime import Runtime


def build_model_router(
    service: ModelService, runtime: Runtime, principal_of: Callable[[str | None], Principal]
) -> tuple[APIRouter, dict[str, Callable[[Request], Awaitable[Response]]]]:
    """The routes (for the schema), and the two POST handlers by path, which the app's
    front door calls without FastAPI's routing (what a model call adds must stay small)."""
    api = APIRouter(prefix="/v1", tags=["models"])

    def principal(request: Request) -> Principal:
        authorization = request.headers.get("authorization")
        if authorization is None and request.headers.get("x-api-key"):
            authorization = f"Bearer {request.headers['x-api-key']}"  # Anthropic clients
        return principal_of(authorization)

    async def caller(request: Request) -> Attribution:
        who = principal(request)
        task = request.headers.get("x-agentbox-task")
        if who.sandbox_id is not None:
            record = await asyncio.to_thread(runtime.get, who.sandbox_id)
            project = str(record.spec.get("project") or "default")
            return Attribution(project, who.sandbox_id, task, who.actor)
        project = request.headers.get("x-agentbox-project") or "default"
        return Attribution(project, None, task, who.actor)

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            raise InvalidRequest(f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        return body

    def endpoint(
        name: str,
        doc: str,
        parse: Callable[[dict[str, Any]], ChatRequest],
        sse: Callable[
            [StreamEvent, AsyncGenerator[StreamEvent, None], dict[str, Any], ChatRequest],
            AsyncGenerator[bytes, None],
        ],
        answer: Callable[[ChatResponse, dict[str, Any], BackgroundTask], Response],
        stream_headers: Callable[[dict[str, Any]], dict[str, str]] = lambda _: {},
    ) -> Callable[[Request], Awaitable[Response]]:
        """One wire format's handler: parse, then a stream or a JSON answer."""

        async def handle(request: Request) -> Response:
            who = await caller(request)
            body = await body_of(request)
            chat = parse(body)
            if chat.stream:
                events = service.stream(chat, who)
                first = await _first(events)
                return EventStream(sse(first, events, body, chat), stream_headers(body))
            response, settle = await service.complete_deferred(chat, who)
            return answer(response, body, BackgroundTask(settle))

        handle.__name__, handle.__doc__ = name, doc  # the schema's operation and summary
        return handle

    chat_completions = endpoint(
        "chat_completions",
        "OpenAI chat-completions, answered by the provider pool.",
        wire.from_openai,
        lambda first, rest, body, _: wire.openai_sse(
            first, rest, bool((body.get("stream_options") or {}).get("include_usage"))
        ),
        lambda response, _, background: wire.openai_json(response, background),
    )
    messages = endpoint(
        "messages",
        "Anthropic messages, answered by the provider pool.",
        wire.from_anthropic,
        lambda first, rest, _, chat: wire.anthropic_sse(first, rest, chat),
        lambda response, _, background: wire.anthropic_json(response, background),
    )
    responses = endpoint(
        "responses",
        "OpenAI Responses (stateless: store false, the whole input each turn), answered by "
        "the provider pool.",
        responses_wire.from_responses,
        responses_wire.responses_sse,
        responses_wire.responses_json,
        responses_wire.stream_headers,
    )
    api.post("/chat/completions")(chat_completions)
    api.post("/messages")(messages)
    api.post("/responses")(responses)

    async def count_tokens(request: Request) -> Response:
        """Anthropic's count_tokens: exact from an Anthropic provider, else an estimate;
        ``X-Agentbox-Token-Count`` says which (exact, estimated)."""
        principal(request)  # any valid token; counting spends nothing
        chat = wire.from_anthropic(await body_of(request))
        tokens, provider = await service.count_tokens(chat)
        headers = {"X-Agentbox-Token-Count": "estimated" if provider is None else "exact"}
        if provider is not None:
            headers["X-Agentbox-Provider"] = provider
        return JSONResponse({"input_tokens": tokens}, headers=headers)

    api.post("/messages/count_tokens")(count_tokens)

    @api.get("/models")
    async def models(request: Request) -> dict[str, Any]:
        """The models the providers serve, in OpenAI's list format, or Anthropic's when
        the request carries ``anthropic-version`` (both SDKs call this path)."""
        principal(request)  # any valid token: the list is what a client may ask for
        served = service.models()
        if request.headers.get("anthropic-version"):
            data = [{"type": "model", "id": m, "display_name": m,
                     "created_at": "1970-01-01T00:00:00Z"} for m, _ in served]  # fmt: skip
            return {"data": data, "has_more": False,
                    "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None}  # fmt: skip
        listed = [{"id": m, "object": "model", "created": 0, "owned_by": p} for m, p in served]
        return {"object": "list", "data": listed}

    @api.get("/usage")
    async def usage(request: Request, project: str | None = None) -> list[dict[str, Any]]:
        """Today's model usage per project (UTC day): tokens, USD, share of the budget."""
        principal_of(request.headers.get("authorization")).require_operator("reading usage")
        return await asyncio.to_thread(service.ledger.usage, project)

    @api.get("/providers")
    async def providers(request: Request) -> list[dict[str, Any]]:
        """Each provider's health: circuit state, fail score, last error."""
        principal_of(request.headers.get("authorization")).require_operator("reading providers")
        return service.health()

    return api, {"/v1/chat/completions": chat_completions, "/v1/messages": messages,
                 "/v1/responses": responses,
                 "/v1/messages/count_tokens": count_tokens}  # fmt: skip


class EventStream(Response):
    """Server-sent events, each chunk sent as it comes. A client that leaves ends the
    stream at the next chunk: uvicorn drops writes to a closed connection silently, so
    the disconnect is watched (``receive``), from the first byte on, not before (a
    watcher task before it would delay the first token). Ending closes ``chunks`` at once,
    which closes the provider's stream and accounts what it produced."""

    media_type = "text/event-stream"

    def __init__(
        self, chunks: AsyncGenerator[bytes, None], headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(headers={"Cache-Control": "no-store", **(headers or {})})
        # Response sets Content-Length: 0 for its empty body; a stream has none.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone: asyncio.Future[Any] | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if gone is None:
                    gone = asyncio.ensure_future(receive())  # http.disconnect, when it comes
                elif gone.done():
                    return  # the client left: stop reading the provider
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return  # the client is gone
        finally:
            if gone is not None:
                gone.cancel()
            await self.chunks.aclose()


async def _first(events: AsyncIterator[StreamEvent]) -> StreamEvent:
    """The first event before the response starts: a failure before any text is still a
    clean HTTP error, not a broken stream."""
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        raise InvalidRequest("the provider sent an empty stream") from None
