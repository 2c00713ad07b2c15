"""What every provider adapter shares: one HTTP client, and the classification of failures.

A subclass only knows its wire format (URL, headers, body, how to read an answer and a
stream). Everything that can go wrong on the way is turned into a ``ProviderFailure`` with
a ``Category`` here, so the pool sees one vocabulary whatever the vendor.
"""

from __future__ import annotations

import email.utils
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, ClassVar

import httpx2

from agentbox.errors import InvalidConfig
from agentbox.gateway.settings import ProviderSettings
from agentbox.providers.types import (
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


def _detail(response: httpx2.Response) -> str:
    """The provider's own words: both vendors answer ``{"error": {"message": ...}}``."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:_MAX_DETAIL]
        if isinstance(error, str) and error:
            return error[:_MAX_DETAIL]
    return response.text.strip()[:_MAX_DETAIL] or response.reason_phrase


def failure_from_response(response: httpx2.Response) -> ProviderFailure:
    """A non-2xx answer (its body already read), classified."""
    status = response.status_code
    detail = f"HTTP {status}: {_detail(response)}"
    retry_after = retry_after_seconds(response.headers.get("retry-after"))
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


def failure_from_exception(error: httpx2.HTTPError) -> ProviderFailure:
    """A transport failure (no complete answer), classified."""
    detail = f"{type(error).__name__}: {error}"[:_MAX_DETAIL]
    if isinstance(error, httpx2.TimeoutException):
        return ProviderFailure(Category.TIMEOUT, detail)
    if isinstance(error, httpx2.SSEError | httpx2.DecodingError):
        return ProviderFailure(Category.MALFORMED, detail)
    return ProviderFailure(Category.CONNECTION, detail)


class Adapter(ABC):
    """One provider: translates ``ChatRequest`` to its wire format and back.

    Every failure leaves as ``ProviderFailure``. Use from one event loop; ``aclose()`` at
    the end (the pool does it).
    """

    kind: ClassVar[str]
    default_base_url: ClassVar[str]

    def __init__(self, settings: ProviderSettings, env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.name = settings.name
        self.base_url = (settings.base_url or self.default_base_url).rstrip("/")
        try:
            scheme = httpx2.URL(self.base_url).scheme
        except httpx2.InvalidURL:
            scheme = ""
        if scheme not in ("http", "https"):
            raise InvalidConfig(
                f"provider {self.name!r}: base_url {self.base_url!r} is not an http(s) URL"
            )
        env = os.environ if env is None else env
        key_env = settings.api_key_env
        # Read once at start, like every secret the gateway holds.
        self._api_key = env.get(key_env) if key_env else None
        self._missing_key = key_env if key_env and not self._api_key else None
        self._client = httpx2.AsyncClient(timeout=settings.timeout_seconds, follow_redirects=False)

    # The wire format -------------------------------------------------------------------
    @abstractmethod
    def url(self) -> str: ...

    @abstractmethod
    def headers(self) -> dict[str, str]: ...

    @abstractmethod
    def payload(self, request: ChatRequest, stream: bool) -> dict[str, Any]: ...

    @abstractmethod
    def parse(self, data: Any, request: ChatRequest) -> ChatResponse: ...

    @abstractmethod
    def events(
        self, source: AsyncIterator[httpx2.ServerSentEvent], request: ChatRequest
    ) -> AsyncIterator[StreamEvent]:
        """Text events, then one ``done``; a stream that ends without the protocol's last
        event raises ``ProviderFailure(CONNECTION)``."""

    # Calls ---------------------------------------------------------------------------
    async def complete(self, request: ChatRequest) -> ChatResponse:
        self._check_key()
        try:
            response = await self._client.post(
                self.url(), json=self.payload(request, stream=False), headers=self.headers()
            )
        except httpx2.HTTPError as e:
            raise failure_from_exception(e) from e
        if not response.is_success:
            raise failure_from_response(response)
        try:
            return self.parse(response.json(), request)
        except _SHAPE_ERRORS as e:
            raise self._malformed(e) from e

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        self._check_key()
        try:
            async with self._client.stream(
                "POST", self.url(), json=self.payload(request, stream=True), headers=self.headers()
            ) as response:
                if not response.is_success:
                    await response.aread()
                    raise failure_from_response(response)
                source = aiter(httpx2.EventSource(response))
                async for event in self.events(source, request):
                    yield event
                async for _ in source:  # read the body to its end: the connection is
                    pass  # then reused (else every stream pays a new TCP/TLS handshake)
        except httpx2.HTTPError as e:
            raise failure_from_exception(e) from e
        except _SHAPE_ERRORS as e:
            raise self._malformed(e) from e

    async def aclose(self) -> None:
        await self._client.aclose()

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
