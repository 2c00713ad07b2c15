"""The model endpoint: OpenAI-compatible ``POST /v1/chat/completions`` and
``POST /v1/responses``, Anthropic-compatible ``POST /v1/messages`` (JSON and SSE
streaming) and ``POST /v1/messages/count_tokens``, so any agent can send its model calls
through agentbox; plus ``GET /v1/usage`` and ``GET /v1/providers``.

Authentication is the gateway's: a session token (as ``Authorization: Bearer`` or, for
Anthropic clients, ``x-api-key``) attributes the call to its sandbox and that sandbox's
project; the operator token may name a project (``X-Agentbox-Project``). A batch task's
calls carry ``X-Agentbox-Task``.

An Anthropic client's ``anthropic-beta`` features reach an Anthropic provider when they
are known to be safe (``anthropic.SAFE_BETAS``); a beta that would let the provider act
outside the sandbox or its prices is a 400 naming it (``anthropic.REFUSED_BETAS``); an
unknown one is dropped and named in ``X-Agentbox-Dropped-Betas`` (clients send every beta
they know on every call, so refusing unknown ones would break each client upgrade; the
provider refuses any field that needed a dropped beta, naming the field).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from agentbox.errors import InvalidRequest
from agentbox.gateway import jsonbody
from agentbox.models import responses_wire, wire
from agentbox.models.providers import anthropic
from agentbox.models.providers.types import ChatRequest, ChatResponse, StreamEvent
from agentbox.models.service import Attribution, ModelService
from agentbox.policy.principal import Principal
from agentbox.runtime.runtime import Runtime

log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # dropped betas already logged (once each, not per call)


def _with_betas(request: Request, chat: ChatRequest) -> tuple[ChatRequest, dict[str, str]]:
    """The request with its client's safe Anthropic betas, and the response headers that
    name those dropped."""
    kept, dropped = anthropic.betas(request.headers.get("anthropic-beta"))
    for beta in set(dropped) - _WARNED:
        _WARNED.add(beta)
        log.warning("anthropic-beta %r is not known to be safe: dropped (add it to "
                    "models/providers/anthropic.py SAFE_BETAS if it is)", beta)  # fmt: skip
    headers = {"X-Agentbox-Dropped-Betas": ",".join(dropped)} if dropped else {}
    return (chat.model_copy(update={"betas": kept}) if kept else chat), headers


def build_model_router(
    service: ModelService, runtime: Runtime, principal_of: Callable[[str | None], Principal]
) -> tuple[APIRouter, dict[str, Callable[[Request], Awaitable[Response]]]]:
    """The routes (for the schema), and the two POST handlers by path, which the app's
    front door calls without FastAPI's routing (what a model call adds must stay small)."""
    api = APIRouter(prefix="/v1", tags=["models"], route_class=jsonbody.JsonRoute)

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
            project = record.spec.project
            return Attribution(project, who.sandbox_id, task, who.actor)
        project = request.headers.get("x-agentbox-project") or "default"
        return Attribution(project, None, task, who.actor)

    async def body_of(request: Request) -> dict[str, Any]:
        body = jsonbody.loads(await request.body())
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
        betas: bool = False,
    ) -> Callable[[Request], Awaitable[Response]]:
        """One wire format's handler: parse, then a stream or a JSON answer. With
        ``betas``, the client's Anthropic betas are judged (an Anthropic client)."""

        async def handle(request: Request) -> Response:
            who = await caller(request)
            body = await body_of(request)
            chat = parse(body)
            headers: dict[str, str] = {}
            if betas and "anthropic-beta" in request.headers:
                chat, headers = _with_betas(request, chat)
            if chat.stream:
                events = service.stream(chat, who)
                first = await _first(events)
                return EventStream(sse(first, events, body, chat),
                                   stream_headers(body) | headers)  # fmt: skip
            response, settle = await service.complete_deferred(chat, who)
            answered = answer(response, body, BackgroundTask(settle))
            answered.headers.update(headers)
            return answered

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
        betas=True,
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

    # The handlers read the body themselves: the schema says it is a JSON object with a
    # model and its input (so the API's fuzz pass sends such bodies).
    def body_schema(*required: str) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["model", *required],
            "properties": {"model": {"type": "string"}},
        }}}}}  # fmt: skip

    api.post("/chat/completions", openapi_extra=body_schema("messages"))(chat_completions)
    api.post("/messages", openapi_extra=body_schema("messages"))(messages)
    api.post("/responses", openapi_extra=body_schema("input"))(responses)

    async def count_tokens(request: Request) -> Response:
        """Anthropic's count_tokens: exact from an Anthropic provider, else an estimate;
        ``X-Agentbox-Token-Count`` says which (exact, estimated)."""
        principal(request)  # any valid token; counting spends nothing
        chat, headers = _with_betas(request, wire.from_anthropic(await body_of(request)))
        tokens, provider = await service.count_tokens(chat)
        headers["X-Agentbox-Token-Count"] = "estimated" if provider is None else "exact"
        if provider is not None:
            headers["X-Agentbox-Provider"] = provider
        return JSONResponse({"input_tokens": tokens}, headers=headers)

    api.post("/messages/count_tokens", openapi_extra=body_schema("messages"))(count_tokens)

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
