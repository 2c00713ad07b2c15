"""A POST to /mcp is decoded once by the gateway: the front door's bounded decoder leaves
the message in the scope, and McpAuth, the stream decision and the cancellation watcher
read that object instead of decoding the body again; a success answer is not decoded
either (only one that may be an auth failure is)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from agentbox.gateway import mcp_http
from agentbox.gateway.mcp_http import DECODED_BODY, McpAuth
from agentbox.policy.principal import Principal

CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "terminal_run"}}
BODY = json.dumps(CALL).encode()


def _scope(**extra: Any) -> Scope:
    headers = [(b"host", b"127.0.0.1:8848"), (b"authorization", b"Bearer t")]
    return {"type": "http", "method": "POST", "path": "/mcp", "scheme": "http",
            "headers": headers, **extra}  # fmt: skip


def _answer(body: bytes) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["body"] == BODY  # the SDK still gets the bytes
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    return app


def _call(auth: McpAuth, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(auth(scope, receive, send))
    return sent


def test_hooks_get_the_front_doors_message_and_nothing_is_decoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_decoding(*_: object, **__: object) -> None:
        raise AssertionError("decoded a second time")

    decoded = json.loads(BODY)
    answer = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": []}}).encode()
    monkeypatch.setattr(mcp_http.json, "loads", no_decoding)
    seen: list[Any] = []
    auth = McpAuth(
        _answer(answer),
        lambda _: Principal("operator"),
        observe=lambda message, _: seen.append(message),
    )
    sent = _call(auth, _scope(**{DECODED_BODY: decoded}))
    assert seen == [decoded] and seen[0] is decoded
    assert sent[0]["status"] == 200 and sent[1]["body"] == answer


def test_without_the_front_door_the_body_is_decoded_here() -> None:
    seen: list[Any] = []
    auth = McpAuth(_answer(b"{}"), lambda _: Principal("operator"),
                   observe=lambda message, _: seen.append(message))  # fmt: skip
    _call(auth, _scope())
    assert seen == [CALL]


def test_an_auth_failure_answer_still_gets_its_status() -> None:
    error = {"code": -32001, "message": "terminal_run is not in this token's tools",
             "data": {"code": "insufficient_scope", "message": "not allowed"}}  # fmt: skip
    answer = json.dumps({"jsonrpc": "2.0", "id": 7, "error": error}).encode()
    auth = McpAuth(_answer(answer), lambda _: Principal("operator"))
    sent = _call(auth, _scope(**{DECODED_BODY: CALL}))
    assert sent[0]["status"] == 403
    assert any(k == b"www-authenticate" for k, _ in sent[0]["headers"])
