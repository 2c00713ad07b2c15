"""The one JSON decoder for request bodies (REST, the tool fast path, MCP, the model
endpoint): what a hostile body can make ``json.loads`` do is bounded here, as a typed
``InvalidRequest``, before any of it reaches a route.

- nesting: at most ``MAX_DEPTH`` levels, counted without recursion before parsing
  (the stdlib decoder recurses: 100k levels were a RecursionError);
- integers: 64-bit (``MAX_INT``): what SQLite, ``off_t`` and C longs take; a longer
  literal is refused before ``int()`` sees it (4,300 digits raise ValueError there);
- floats: finite (``1e999`` would be inf); ``NaN`` and ``Infinity`` literals are refused;
- strings: UTF-8 text, and no lone surrogate (``"\\ud800"``) in any key or value: no
  encoder downstream (paths, environment, argv, audit, providers) can write one.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from agentbox.errors import InvalidRequest

MAX_DEPTH = 64
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)
_INT_DIGITS = len(str(MIN_INT))  # sign included
# A JSON string, escapes included (unrolled: it runs in the regex engine, not here).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PATH_PART_MAX = 40


def loads(body: bytes) -> Any:
    """``body`` decoded, or InvalidRequest saying what is wrong and where."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"the body is not UTF-8 text ({e}); send UTF-8 JSON") from None
    check_depth(body)
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_not_a_number)
    except ValueError as e:
        raise InvalidRequest(f"the body is not valid JSON ({e})") from None
    if _SURROGATE_ESCAPE.search(text):  # the only way a lone surrogate gets into the text
        check_strings(value)
    return value


class JsonRequest(Request):
    """A request whose ``json()`` is ``loads``."""

    async def json(self) -> Any:
        if not hasattr(self, "_bounded_json"):
            self._bounded_json = loads(await self.body())
        return self._bounded_json


class JsonRoute(APIRoute):
    """A FastAPI route whose JSON body is decoded by ``loads`` before FastAPI's handler
    runs: inside it, any decode failure but a syntax error became an untyped 400 (and
    an unbounded ``json.loads`` did the decoding)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def decoded_first(request: Request) -> Response:
            request = JsonRequest(request.scope, request.receive)
            if await request.body():
                await request.json()  # FastAPI's handler gets the same, decoded once
            return await handler(request)

        return decoded_first


def check_depth(text: bytes) -> None:
    # Brackets inside strings only over-count, so few brackets in all is depth enough.
    if text.count(b"[") + text.count(b"{") <= MAX_DEPTH:
        return
    # Strings out, then only the brackets (of one kind) left; each pass peels the
    # innermost pairs, in C. Balanced text of depth d is empty after d passes; an
    # unclosed run is counted too (the decoder recurses into it before it fails).
    brackets = _STRING.sub(b"", text).translate(_ONE_KIND, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        peeled = brackets.replace(b"[]", b"")
        if len(peeled) == len(brackets):
            break
        brackets = peeled
    if b"[]" in brackets or brackets.count(b"[") > MAX_DEPTH:
        raise InvalidRequest(
            f"the body nests deeper than {MAX_DEPTH} levels; send a flatter document",
            max_depth=MAX_DEPTH,
        )


def check_strings(value: Any, root: str = "") -> None:
    """InvalidRequest naming the first field whose key or text holds a lone surrogate."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                _surrogate(where, "its text")
        elif isinstance(item, dict):
            for key, child in item.items():
                field = f"{where}.{key[:_PATH_PART_MAX]}" if where else key[:_PATH_PART_MAX]
                if _SURROGATE.search(key):
                    _surrogate(where, "a key")
                stack.append((child, field))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))


def encodable(value: Any) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD, so that a JSON encoder
    can write it: a name made inside a sandbox that is not UTF-8 (decoded with
    surrogateescape) made the response fail half-sent. Unchanged when there is none."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if not value.isascii() else value
    if isinstance(value, dict):
        return {_leaf(k): _leaf(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_leaf(v) for v in value]
    return value


_UNCHANGED = frozenset({int, float, bool, type(None)})


def _leaf(value: Any) -> Any:
    """``encodable`` without a call for what it returns as is (most of a result: ASCII
    strings and numbers), which is most of its cost on every tool call's result."""
    kind = type(value)
    if kind in _UNCHANGED or (kind is str and value.isascii()):
        return value
    return encodable(value)


def parse_int(text: str, field: str, low: int = 0, high: int = MAX_INT) -> int:
    """A decimal integer from a header or the like, in [low, high], or InvalidRequest."""
    if len(text) <= _INT_DIGITS and text.isascii() and text.lstrip("-").isdigit():
        number = int(text)
        if low <= number <= high:
            return number
    raise InvalidRequest(
        f"{field} must be an integer from {low} to {high}, got {text[:_PATH_PART_MAX]!r}",
        field=field,
    )


def _surrogate(field: str, what: str) -> None:
    raise InvalidRequest(
        f"{field or 'the body'}: {what} holds a lone UTF-16 surrogate (an unpaired "
        "\\ud800-\\udfff escape); send valid Unicode",
        field=field,
    )


def _int(text: str) -> int:
    if len(text) <= _INT_DIGITS:
        number = int(text)
        if MIN_INT <= number <= MAX_INT:
            return number
    raise InvalidRequest(
        f"the body has an integer out of range ({text[:_PATH_PART_MAX]}"
        f"{'...' if len(text) > _PATH_PART_MAX else ''}); integers must fit in 64 bits",
        max=MAX_INT,
    )


def _float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise InvalidRequest(
            f"the body has a number out of range ({text[:_PATH_PART_MAX]}); send a finite one"
        )
    return number


def _not_a_number(text: str) -> Any:
    raise InvalidRequest(f"the body has {text}, which is not a JSON number; send a finite one")
