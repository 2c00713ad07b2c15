"""What every provider adapter shares: one HTTP client, and the classification of failures.

A subclass only knows its wire format (URL, headers, body, how to read an answer and a
stream). Everything that can go wrong on the way is turned into a ``ProviderFailure`` with
a ``Category`` here, so the pool sees one vocabulary whatever the vendor.

The upstream client is aiohttp, not httpx2 (which the rest of agentbox uses): every model
call through the gateway pays this leg, and aiohttp's asyncio-native client with its C
HTTP parser costs ~1 ms less per request here (bench/bench_models.py). Server-sent events
are decoded by httpx2's SSE parser (derived from httpx-sse): the one tested decoder we
already depend on, fed with aiohttp's chunks.
"""

from __future__ import annotations

import codecs
import contextlib
import email.utils
import json
import math
import os
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, ClassVar

import aiohttp
import yarl
from httpx2._sse import ServerSentEvent, SSEError, _SSEParser

from agentbox.config.settings import ProviderSettings
from agentbox.errors import InvalidConfig
from agentbox.models.providers.types import (
    Category,
    ChatRequest,
    ChatResponse,
    ProviderFailure,
    StreamEvent,
)

_MAX_DETAIL = 300  # characters of a provider's error message kept in ours
# What a parser raises on JSON that has the wrong shape (missing keys, wrong types).
_SHAPE_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError)


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None if absent
    or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


# What the transport raises when no complete answer arrived (aiohttp's timeouts are
# TimeoutErrors; SSEError is an event over the size limit).
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, SSEError)
_MAX_SSE_EVENT = 1 << 20  # bytes of one event: a provider cannot make us buffer more
MAX_ANSWER_BYTES = 32 << 20  # of a whole JSON answer (or error body), for the same reason


class _TooLarge(aiohttp.ClientPayloadError):
    """An answer over MAX_ANSWER_BYTES (classified as malformed)."""


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    """The body, refused past MAX_ANSWER_BYTES instead of buffered whole."""
    limit = MAX_ANSWER_BYTES
    if (response.content_length or 0) > limit:
        raise _TooLarge(f"the answer is {response.content_length} bytes, over {limit}")
    parts, size = [], 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(f"the answer is over {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _detail(body: bytes, reason: str) -> str:
    """The provider's own words: both vendors answer ``{"error": {"message": ...}}``."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:_MAX_DETAIL]
        if isinstance(error, str) and error:
            return error[:_MAX_DETAIL]
    return text.strip()[:_MAX_DETAIL] or reason


def failure_from_response(
    status: int, headers: Mapping[str, str], body: bytes, reason: str = ""
) -> ProviderFailure:
    """A non-2xx answer, classified."""
    detail = f"HTTP {status}: {_detail(body, reason)}"
    retry_after = retry_after_seconds(headers.get("retry-after"))
    if status == 429:
        return ProviderFailure(
            Category.RATE_LIMITED, detail, status=status, retry_after=retry_after
        )
    if status == 408:
        return ProviderFailure(Category.TIMEOUT, detail, status=status)
    # 402: the account cannot pay; like a bad key, it lasts until a person acts.
    if status in (401, 402, 403):
        return ProviderFailure(Category.AUTH, detail, status=status)
    if status >= 500:  # includes Anthropic's 529 "overloaded"
        return ProviderFailure(
            Category.SERVER_ERROR, detail, status=status, retry_after=retry_after
        )
    if 400 <= status < 500:
        return ProviderFailure(Category.BAD_REQUEST, detail, status=status)
    # 1xx/3xx: redirects are not followed (a key must not travel to another host).
    return ProviderFailure(
        Category.MALFORMED, f"{detail} (unexpected; check base_url)", status=status
    )


def failure_from_exception(error: BaseException) -> ProviderFailure:
    """A transport failure (no complete answer: one of ``TRANSPORT_ERRORS``), classified."""
    detail = f"{type(error).__name__}: {error}"[:_MAX_DETAIL]
    if isinstance(error, TimeoutError):
        return ProviderFailure(Category.TIMEOUT, detail)
    if isinstance(error, SSEError | aiohttp.ContentTypeError | _TooLarge):
        return ProviderFailure(Category.MALFORMED, detail)
    return ProviderFailure(Category.CONNECTION, detail)


def _proxy_for(url: yarl.URL) -> str | None:
    """The proxy the environment names for this URL (HTTPS_PROXY, HTTP_PROXY, NO_PROXY),
    read once: aiohttp's trust_env would look it up in a worker thread on every call."""
    if not url.host or urllib.request.proxy_bypass(url.host):
        return None
    return urllib.request.getproxies().get(url.scheme)


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[ServerSentEvent]:
    """The server-sent events of a response, as its chunks arrive (UTF-8, as the SSE
    standard fixes it)."""
    if response.content_type != "text/event-stream":
        raise SSEError(f"expected a text/event-stream answer, got {response.content_type!r}")
    parser = _SSEParser(_MAX_SSE_EVENT)
    text = codecs.getincrementaldecoder("utf-8")("replace")
    async for chunk in response.content.iter_any():
        for event in parser.decode(text.decode(chunk)):
            yield event
    for event in parser.flush():
        yield event


def _check_status(response: aiohttp.ClientResponse, body: bytes) -> None:
    """Raises the classified failure of a response that is not a 2xx."""
    if not 200 <= response.status < 300:
        raise failure_from_response(response.status, response.headers, body, response.reason or "")


class Adapter(ABC):
    """One provider: translates ``ChatRequest`` to its wire format and back.

    Every failure leaves as ``ProviderFailure``. Use from one event loop; ``aclose()`` at
    the end (the pool does it).
    """

    kind: ClassVar[str]
    default_base_url: ClassVar[str]
    path: ClassVar[str]  # the endpoint, below base_url

    def __init__(self, settings: ProviderSettings, env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.name = settings.name
        self.base_url = (settings.base_url or self.default_base_url).rstrip("/")
        try:
            url = yarl.URL(self.base_url)
        except ValueError:
            url = yarl.URL()
        if url.scheme not in ("http", "https"):
            raise InvalidConfig(
                f"provider {self.name!r}: base_url {self.base_url!r} is not an http(s) URL"
            )
        env = os.environ if env is None else env
        key_env = settings.api_key_env
        # Read once at start, like every secret the gateway holds.
        # Stripped: a key file's trailing newline would make every request's header invalid.
        self._api_key = ((env.get(key_env) or "").strip() or None) if key_env else None
        self._missing_key = key_env if key_env and not self._api_key else None
        seconds = settings.timeout_seconds
        # Each step bounded (connect, then every read), not the whole call: a long stream
        # that keeps sending is alive.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=seconds, sock_connect=seconds, sock_read=seconds
        )
        self._proxy = _proxy_for(url)
        self._http: aiohttp.ClientSession | None = None  # made on first use, on the loop

    # The wire format -------------------------------------------------------------------
    def url(self) -> str:
        return self.base_url + self.path

    @abstractmethod
    def headers(self) -> dict[str, str]: ...

    def request_headers(self, request: ChatRequest) -> dict[str, str]:
        """Headers this request adds (Anthropic's betas)."""
        return {}

    @abstractmethod
    def payload(self, request: ChatRequest, stream: bool) -> dict[str, Any]: ...

    @abstractmethod
    def parse(self, data: Any, request: ChatRequest) -> ChatResponse: ...

    @abstractmethod
    def events(
        self, source: AsyncIterator[ServerSentEvent], request: ChatRequest
    ) -> AsyncIterator[StreamEvent]:
        """Text events, then one ``done``; a stream that ends without the protocol's last
        event raises ``ProviderFailure(CONNECTION)``."""

    # Calls ---------------------------------------------------------------------------
    def _post(self, request: ChatRequest, stream: bool) -> Any:
        body = self.payload(request, stream)
        if request.extra and request.extra_kind == self.kind:
            body = {**request.extra, **body}  # what we set wins
        return self._send(self.url(), body, self.request_headers(request))

    def _send(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """The POST of ``body`` as JSON (an aiohttp request context manager)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        return self._http.post(
            url,
            proxy=self._proxy,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self.headers(), **headers},
            allow_redirects=False,  # a key must not travel to another host
        )

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self._check_key()
        try:
            async with self._post(request, stream=False) as response:
                body = await _read_capped(response)
        except TRANSPORT_ERRORS as e:
            raise failure_from_exception(e) from e
        _check_status(response, body)
        try:
            return self.parse(json.loads(body), request)
        except _SHAPE_ERRORS as e:
            raise self._malformed(e) from e

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        self._check_key()
        try:
            async with self._post(request, stream=True) as response:
                if not 200 <= response.status < 300:
                    _check_status(response, await _read_capped(response))
                source = aiter(_events(response))
                async for event in self.events(source, request):
                    yield event
                # The answer is complete (events() ended at the protocol's last event):
                # read the body to its end so the connection is reused (else every stream
                # pays a new TCP/TLS handshake); a failure now loses nothing.
                with contextlib.suppress(*TRANSPORT_ERRORS):
                    async for _ in source:
                        pass
        except TRANSPORT_ERRORS as e:
            raise failure_from_exception(e) from e
        except _SHAPE_ERRORS as e:
            raise self._malformed(e) from e

    async def count_tokens(self, request: ChatRequest) -> int | None:
        """The provider's own count of the request's input tokens, or None when its API
        has no counting (then the caller estimates)."""
        return None

    async def _post_json(self, url: str, body: dict[str, Any],
                         headers: dict[str, str] | None = None) -> Any:  # fmt: skip
        """One JSON POST to ``url`` (not retried), its parsed answer; failures classified."""
        self._check_key()
        try:
            async with self._send(url, body, headers or {}) as response:
                raw = await _read_capped(response)
        except TRANSPORT_ERRORS as e:
            raise failure_from_exception(e) from e
        _check_status(response, raw)
        try:
            return json.loads(raw)
        except ValueError as e:
            raise self._malformed(e) from e

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()

    def _check_key(self) -> None:
        if self._missing_key:
            # Fails like a rejected key (demotion), without a round trip.
            raise ProviderFailure(
                Category.AUTH,
                f"the API key variable {self._missing_key} is not set in the gateway's environment",
            )

    def _malformed(self, error: Exception) -> ProviderFailure:
        return ProviderFailure(
            Category.MALFORMED,
            f"the answer does not follow the {self.kind} protocol "
            f"({type(error).__name__}: {error})"[:_MAX_DETAIL],
        )

    @staticmethod
    def model_of(request: ChatRequest) -> str:
        if not request.model:  # the pool names a model before calling
            raise ProviderFailure(Category.BAD_REQUEST, "the request names no model")
        return request.model
