"""Fake OpenAI and Anthropic servers on real loopback sockets, scriptable per request.

Each ``FakeProvider`` is an HTTP/1.1 server on 127.0.0.1 (a free port) speaking the
vendor's wire format: JSON answers, SSE streams (chunked), the vendor's error bodies.
``script(Reply(...), ...)`` sets what the next requests get (then the default ``Reply()``);
``requests`` records every request received, body bytes included, so a test can assert
what did (or did not) leave the host.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from agentbox.config.settings import ProviderSettings

Kind = Literal["openai", "anthropic"]
_PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass
class Reply:
    text: str = "Hello from the fake provider."
    input_tokens: int = 11
    output_tokens: int = 7
    status: int = 200
    retry_after: str | None = None  # the Retry-After header of an error answer
    error: str = "scripted failure"
    delay: float = 0.0  # seconds before answering (longer than the client's timeout: a timeout)
    cut_after: int | None = None  # stream: drop the connection after this many text pieces
    piece_delay: float = 0.0  # stream: seconds between text pieces (a model still writing)
    end_early: bool = False  # stream: end cleanly, but without the protocol's last event
    malformed: bool = False  # a body (or the first stream event) that is not JSON
    tool_call: tuple[str, dict[str, Any]] | None = None  # answer with a call of this tool
    call_id: str | None = None  # the call's id (default: call_1 / toolu_1)
    # Usage: input_tokens counts every input token, cached ones included.
    thinking: tuple[str, str] | None = None  # anthropic: a thinking block (text, signature) first
    stop_sequence: str | None = None  # anthropic: the answer ended at this stop sequence
    cache_read: int = 0  # prompt-cache tokens read / written, in the vendor's usage words
    cache_write: int = 0


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    client_port: int = 0  # the same port again: the client reused its connection

    def json(self) -> Any:
        return json.loads(self.body)


def _pieces(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text) or [text]


def _halves(text: str) -> list[str]:
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _openai_usage(reply: Reply) -> dict[str, Any]:
    """prompt_tokens includes the cached ones (OpenAI's words)."""
    usage: dict[str, Any] = {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }
    if reply.cache_read:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cache_read}
    return usage


def _anthropic_usage(reply: Reply) -> dict[str, Any]:
    """input_tokens excludes the cache reads and writes (Anthropic's words)."""
    return {
        "input_tokens": reply.input_tokens - reply.cache_read - reply.cache_write,
        "cache_read_input_tokens": reply.cache_read,
        "cache_creation_input_tokens": reply.cache_write,
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler still waiting out a delay does not block close
    fake: FakeProvider

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (timeouts) is part of the script


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes: without this, Nagle's algorithm holds
        # the second until the client's delayed ACK (~40 ms), which no real API does.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        fake.record(Received(self.path, headers, raw, self.client_address[1]))
        if fake.kind == "anthropic" and self.path == "/v1/messages/count_tokens":
            # Anthropic's counting endpoint: the scripted reply's input_tokens, or its error.
            reply = fake.next_reply()
            if reply.status != 200:
                self._json(reply.status, fake.error_body(reply.status, reply.error))
            else:
                self._json(200, {"input_tokens": reply.input_tokens})
            return
        if self.path != _PATHS[fake.kind]:
            self._json(404, fake.error_body(404, f"no route {self.path}"))
            return
        reply = fake.reply_for(raw)
        if reply.delay and fake.stopping.wait(reply.delay):
            self.close_connection = True
            return
        try:
            body = json.loads(raw)
            if reply.status != 200:
                headers = {"Retry-After": reply.retry_after} if reply.retry_after else {}
                self._json(reply.status, fake.error_body(reply.status, reply.error), headers)
            elif body.get("stream"):
                self._stream(fake.stream_events(reply, body), reply)
            elif reply.malformed:
                self._send(200, b'{"choices": [{"message": ', "application/json")
            else:
                self._json(200, fake.answer(reply, body))
        except (BrokenPipeError, ConnectionResetError):
            fake.clients_left += 1  # the client closed before the answer's end
            self.close_connection = True

    def _send(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", headers)

    def _stream(self, events: list[tuple[bool, str]], reply: Reply) -> None:
        """``events``: (is a text piece, SSE text); chunked, one event per chunk."""
        fake = self.server.fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        pieces = 0
        for is_text, event in events:
            if is_text and reply.cut_after is not None and pieces >= reply.cut_after:
                # Mid-body and without the closing chunk: the client sees a cut.
                self.wfile.write(b"400\r\ndata: {")
                self.wfile.flush()
                self.close_connection = True
                return
            if is_text and pieces and reply.piece_delay and fake.stopping.wait(reply.piece_delay):
                return
            pieces += is_text
            data = event.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class FakeProvider:
    """A fake ``kind`` provider on 127.0.0.1; use as a context manager."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.requests: list[Received] = []
        self.clients_left = 0  # answers a client stopped reading (the connection closed)
        self.stopping = threading.Event()
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def base_url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}" + ("/v1" if self.kind == "openai" else "")

    def settings(self, name: str, **overrides: Any) -> ProviderSettings:
        fields: dict[str, Any] = {"name": name, "kind": self.kind, "base_url": self.base_url}
        fields.setdefault("models", ["fake-model"])
        return ProviderSettings(**(fields | overrides))

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def clear_script(self) -> None:
        with self._lock:
            self._replies.clear()

    def next_reply(self) -> Reply:
        with self._lock:
            return self._replies.popleft() if self._replies else Reply()

    def reply_for(self, body: bytes) -> Reply:
        """The answer to a request whose body is ``body``: the script's next (a subclass may
        answer from the conversation instead)."""
        return self.next_reply()

    def record(self, received: Received) -> None:
        with self._lock:
            self.requests.append(received)

    def sent_bytes(self) -> bytes:
        return b"\n".join(r.body for r in self.requests)

    # The vendor's formats --------------------------------------------------------------
    def error_body(self, status: int, message: str) -> dict[str, Any]:
        if self.kind == "openai":
            return {"error": {"message": message, "type": "fake_error", "code": status}}
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def answer(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        model = body["model"]
        if self.kind == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": reply.text}
            finish = "stop"
            if reply.tool_call:
                name, args = reply.tool_call
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": reply.call_id or "call_1",
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)},
                        }
                    ],
                }
                finish = "tool_calls"
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": _openai_usage(reply),
            }
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}]
        if reply.thinking:
            text, signature = reply.thinking
            content.insert(0, {"type": "thinking", "thinking": text, "signature": signature})
        stop = "stop_sequence" if reply.stop_sequence else "end_turn"
        if reply.tool_call:
            name, args = reply.tool_call
            call_id = reply.call_id or "toolu_1"
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
            stop = "tool_use"
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": reply.stop_sequence,
            "usage": _anthropic_usage(reply) | {"output_tokens": reply.output_tokens},
        }

    def stream_events(self, reply: Reply, body: dict[str, Any]) -> list[tuple[bool, str]]:
        if self.kind == "openai":
            events = self._openai_events(reply, body)
        else:
            events = self._anthropic_events(reply, body)
        if reply.malformed:
            events.insert(0, (False, "data: {not json\n\n"))
        if reply.end_early:
            events.pop()
        return events

    def _openai_events(self, reply: Reply, body: dict[str, Any]) -> list[tuple[bool, str]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            data = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [choice],
            }
            return f"data: {json.dumps(data)}\n\n"

        events = [(False, chunk({"role": "assistant", "content": ""}))]
        events += [(True, chunk({"content": p})) for p in _pieces(reply.text)]
        finish = "stop"
        if reply.tool_call:  # a call in pieces, as OpenAI streams one
            name, args = reply.tool_call
            call = {"id": reply.call_id or "call_1", "type": "function",
                    "function": {"name": name, "arguments": ""}}  # fmt: skip
            events.append((False, chunk({"tool_calls": [{"index": 0, **call}]})))
            events += [(False, chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}))
                       for a in _halves(json.dumps(args))]  # fmt: skip
            finish = "tool_calls"
        events.append((False, chunk({}, finish)))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = _openai_usage(reply)
            data = {"id": "chatcmpl-fake", "model": body["model"], "choices": [], "usage": usage}
            events.append((False, f"data: {json.dumps(data)}\n\n"))
        events.append((False, "data: [DONE]\n\n"))
        return events

    def _anthropic_events(self, reply: Reply, body: dict[str, Any]) -> list[tuple[bool, str]]:
        def event(kind: str, data: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind} | data)}\n\n"

        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": body["model"],
            "stop_reason": None,
            "usage": _anthropic_usage(reply) | {"output_tokens": 1},
        }
        events = [(False, event("message_start", {"message": message}))]
        text = 0  # the text block's index
        if reply.thinking:  # a thinking block: its text in pieces, then its signature
            thought, signature = reply.thinking
            block = {"type": "thinking", "thinking": "", "signature": ""}
            events.append(
                (False, event("content_block_start", {"index": 0, "content_block": block}))
            )
            events += [(False, event("content_block_delta", {"index": 0, "delta": {
                "type": "thinking_delta", "thinking": p}})) for p in _pieces(thought)]  # fmt: skip
            events.append((False, event("content_block_delta", {"index": 0, "delta": {
                "type": "signature_delta", "signature": signature}})))  # fmt: skip
            events.append((False, event("content_block_stop", {"index": 0})))
            text = 1
        events += [
            (
                False,
                event(
                    "content_block_start",
                    {"index": text, "content_block": {"type": "text", "text": ""}},
                ),
            ),
            (False, event("ping", {})),
        ]
        events += [
            (
                True,
                event(
                    "content_block_delta",
                    {"index": text, "delta": {"type": "text_delta", "text": p}},
                ),
            )
            for p in _pieces(reply.text)
        ]
        events.append((False, event("content_block_stop", {"index": text})))
        stop = "stop_sequence" if reply.stop_sequence else "end_turn"
        if reply.tool_call:  # a tool_use block whose input arrives as JSON pieces
            name, args = reply.tool_call
            block = {
                "type": "tool_use",
                "id": reply.call_id or "toolu_1",
                "name": name,
                "input": {},
            }
            events.append(
                (False, event("content_block_start", {"index": text + 1, "content_block": block}))
            )
            events += [(False, event("content_block_delta", {"index": text + 1, "delta": {
                "type": "input_json_delta", "partial_json": a}})) for a in _halves(json.dumps(args))]  # fmt: skip
            events.append((False, event("content_block_stop", {"index": text + 1})))
            stop = "tool_use"
        events += [
            (
                False,
                event(
                    "message_delta",
                    {
                        "delta": {"stop_reason": stop, "stop_sequence": reply.stop_sequence},
                        "usage": {"output_tokens": reply.output_tokens},
                    },
                ),
            ),
            (False, event("message_stop", {})),
        ]
        return events
