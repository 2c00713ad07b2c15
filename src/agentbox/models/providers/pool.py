"""The provider pool: one ``complete`` / ``stream`` over every configured model service.

Per request:

1. Every text is redacted (here, so no adapter can forget) before anything is sent.
2. Providers that serve the model are tried in health order (``health.py``: lowest fail
   score first, configured order breaking ties), skipping open circuits and providers
   whose Retry-After has not yet passed.
3. On one provider: rate_limited / server_error / timeout / connection / malformed are
   retried up to ``retry.max_attempts`` times with exponential backoff and full jitter
   (``uniform(0, min(max_seconds, base_seconds * 2**n))``), never sooner than the
   provider's Retry-After; a Retry-After longer than ``max_seconds`` fails over at once.
   ``auth`` demotes the provider and fails over; ``bad_request`` is raised at once as
   ``ProviderRejected`` (the request is wrong, not the provider).
4. Nobody answered: ``AllProvidersFailed`` with each provider's last answer.

A stream may fail over only until its first token reached the caller; after that a cut
raises ``ProviderStreamBroken``. Use the pool from one event loop (the gateway's).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from agentbox.config.settings import ProviderSettings, RetrySettings
from agentbox.errors import (
    AllProvidersFailed,
    InvalidConfig,
    InvalidRequest,
    ProviderRejected,
    ProviderStreamBroken,
)
from agentbox.models.providers.adapter import Adapter
from agentbox.models.providers.anthropic import AnthropicAdapter
from agentbox.models.providers.health import BreakerSettings, ProviderHealth
from agentbox.models.providers.openai import OpenAIAdapter
from agentbox.models.providers.types import (
    Category,
    ChatRequest,
    ChatResponse,
    ProviderFailure,
    StreamEvent,
)

log = logging.getLogger(__name__)

ADAPTERS: dict[str, type[Adapter]] = {"openai": OpenAIAdapter, "anthropic": AnthropicAdapter}


def adapter_for(settings: ProviderSettings, env: Mapping[str, str] | None = None) -> Adapter:
    return ADAPTERS[settings.kind](settings, env)


@dataclass
class _Attempt:
    """One call to one provider; the caller sets ``failure`` when it failed."""

    adapter: Adapter
    call: ChatRequest
    health: ProviderHealth
    failure: ProviderFailure | None = None


class ProviderPool:
    """``redact`` is required: every text passes it before leaving the host (the gateway
    gives ``Redactor.redact``). ``clock`` (monotonic seconds), ``sleep`` and ``rng`` are
    there for tests."""

    def __init__(
        self,
        providers: Sequence[ProviderSettings],
        retry: RetrySettings | None = None,
        *,
        redact: Callable[[str], str],
        env: Mapping[str, str] | None = None,
        breaker: BreakerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        on_failure: Callable[[str, str, str | None], None] | None = None,
    ) -> None:
        if not providers:
            raise InvalidConfig("no model providers are configured (the providers section)")
        self.retry = retry or RetrySettings()
        # Told of every failed attempt (provider, category, model): retried ones included,
        # which the final answer alone would hide from the metrics.
        self._on_failure = on_failure
        self._redact = redact
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        breaker = breaker or BreakerSettings()
        self._adapters = [adapter_for(p, env) for p in providers]
        self._health = {p.name: ProviderHealth(p.name, p.kind, breaker) for p in providers}

    async def __aenter__(self) -> ProviderPool:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for adapter in self._adapters:
            await adapter.aclose()

    def health(self) -> list[dict[str, Any]]:
        """Each provider's state, fail score and last error, in configured order."""
        now = self._clock()
        return [self._health[a.name].to_dict(now) for a in self._adapters]

    # Calls ---------------------------------------------------------------------------
    async def complete(self, request: ChatRequest) -> ChatResponse:
        async with aclosing(self._attempts(request.redacted(self._redact))) as attempts:
            async for attempt in attempts:
                try:
                    response = await attempt.adapter.complete(attempt.call)
                except ProviderFailure as failure:
                    attempt.failure = failure
                    continue
                except BaseException:
                    attempt.health.release()  # cancelled: not the provider's fault
                    raise
                attempt.health.succeeded(self._clock())
                return response
        raise AssertionError("unreachable: _attempts raises when nobody answered")

    async def count_tokens(self, request: ChatRequest) -> tuple[int, str] | None:
        """(input tokens, provider) from the first provider serving the model that can
        count (Anthropic's counting endpoint), None when none can. Not retried, and a
        failure is not held against the provider's health: a count is advisory."""
        redacted = request.redacted(self._redact)
        for adapter, call in self._route(redacted):
            if not self._health[adapter.name].admit(self._clock()):
                continue
            try:
                tokens = await adapter.count_tokens(call)
            except ProviderFailure as failure:
                log.warning("provider %s could not count tokens: %s", adapter.name, failure)
                tokens = None
            finally:
                self._health[adapter.name].release()
            if tokens is not None:
                return tokens, adapter.name
        return None

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        """Text events, then one ``done`` event naming the provider and the usage."""
        async with aclosing(self._attempts(request.redacted(self._redact))) as attempts:
            async for attempt in attempts:
                sent = 0  # characters the caller already has
                events_sent = 0  # text, tool calls: once one left, a retry would repeat it
                try:
                    async with aclosing(attempt.adapter.stream(attempt.call)) as events:
                        async for event in events:
                            if event.kind == "done":
                                attempt.health.succeeded(self._clock())
                            else:  # who is answering, known before the end (accounting)
                                event = replace(event, provider=attempt.adapter.name,
                                                model=attempt.call.model)  # fmt: skip
                            sent += len(event.text)
                            events_sent += 1
                            yield event
                    return
                except ProviderFailure as failure:
                    if events_sent:
                        attempt.health.failed(failure, self._clock())
                        raise ProviderStreamBroken(
                            f"provider {attempt.adapter.name!r} cut the stream after {sent} "
                            f"characters ({failure.category.value}: {failure.message}); the "
                            "text so far stands, retry the whole request for a complete answer",
                            provider=attempt.adapter.name,
                            category=failure.category.value,
                            sent_characters=sent,
                        ) from None
                    attempt.failure = failure
                except BaseException:
                    attempt.health.release()  # the caller stopped reading, or was cancelled
                    raise

    async def _attempts(self, request: ChatRequest) -> AsyncGenerator[_Attempt, None]:
        """The attempts to make, in order: each provider in health order, retried with
        backoff while its failures are retryable. The caller makes the call and sets
        ``failure`` on the attempt if it failed; a success ends the sequence. When nobody
        answered, raises ``AllProvidersFailed``."""
        answers: dict[str, dict[str, Any]] = {}
        for adapter, call in self._route(request):
            health = self._health[adapter.name]
            for number in range(self.retry.max_attempts):
                if not health.admit(self._clock()):
                    answers.setdefault(adapter.name, health.skipped(self._clock()))
                    break
                attempt = _Attempt(adapter, call, health)
                yield attempt
                if attempt.failure is None:
                    return
                delay = self._failed(health, attempt.failure, number, answers, call.model)
                if delay is None:
                    break
                await self._sleep(delay)
        raise self._all_failed(answers)

    # Decisions -----------------------------------------------------------------------
    def _route(self, request: ChatRequest) -> list[tuple[Adapter, ChatRequest]]:
        """Providers serving the model, healthiest first, each with the model to ask for."""
        now = self._clock()
        routes = []
        required = request.requires()
        for index, adapter in enumerate(self._adapters):
            if required is not None and adapter.kind != required[0]:
                continue
            models, aliases = adapter.settings.models, adapter.settings.aliases
            if request.model is None and models:
                model = models[0]
            elif request.model in aliases:
                model = aliases[request.model]
            elif request.model is not None and (not models or request.model in models):
                model = request.model
            else:
                continue
            rank = self._health[adapter.name].rank(now)
            routes.append((rank, index, adapter, request.model_copy(update={"model": model})))
        if not routes and required is not None:
            kind, why = required
            raise InvalidRequest(
                f"the request needs a provider of kind {kind!r} serving model "
                f"{request.model or '(its default)'!r}, and none is configured: it carries {why}; "
                "remove that from the request or configure such a provider",
                model=request.model,
            )
        if not routes:
            raise InvalidRequest(
                f"no configured provider serves model {request.model!r}"
                if request.model
                else "name a model: no provider has a default (its models list is empty)",
                model=request.model,
            )
        routes.sort(key=lambda r: (r[0], r[1]))
        return [(adapter, call) for _, _, adapter, call in routes]

    def _failed(
        self,
        health: ProviderHealth,
        failure: ProviderFailure,
        attempt: int,
        answers: dict[str, dict[str, Any]],
        model: str | None = None,
    ) -> float | None:
        """Record a failed attempt; the delay before retrying the same provider, or None
        to fail over."""
        now = self._clock()
        health.failed(failure, now)
        if self._on_failure is not None:
            self._on_failure(health.name, failure.category.value, model)
        answers[health.name] = failure.answer(health.name) | {"attempts": attempt + 1}
        log.warning(
            "provider %s attempt %d: %s: %s",
            health.name,
            attempt + 1,
            failure.category.value,
            failure.message,
        )
        if failure.category is Category.BAD_REQUEST:
            raise ProviderRejected(
                f"provider {health.name!r} refused the request: {failure.message}; "
                "fix the request (it was not retried)",
                provider=health.name,
                status=failure.status,
                category=failure.category.value,
            )
        if not failure.category.retryable or attempt + 1 >= self.retry.max_attempts:
            return None
        if health.state(now) != "closed":
            return None  # the breaker just opened
        delay = self._backoff(attempt)
        if failure.retry_after is not None:
            if failure.retry_after > self.retry.max_seconds:
                return None  # too long to wait here; health keeps it aside meanwhile
            delay = max(delay, failure.retry_after)
        return delay

    def _backoff(self, attempt: int) -> float:
        cap = min(self.retry.max_seconds, self.retry.base_seconds * 2**attempt)
        return self._rng.uniform(0, cap) if self.retry.jitter == "full" else cap

    def _all_failed(self, answers: dict[str, dict[str, Any]]) -> AllProvidersFailed:
        now = self._clock()
        waits = [h.available_in(now) for h in self._health.values() if h.available_in(now) > 0]
        listed = "; ".join(
            f"{a['provider']}: {a['message']}"
            + (f" ({a['category']}, {a['attempts']} attempts)" if "attempts" in a else "")
            for a in answers.values()
        )
        return AllProvidersFailed(
            f"no model provider could answer — {listed}. Check the providers' keys and "
            "status (the gateway's provider health), or retry later",
            providers=list(answers.values()),
            retry_after=round(min(waits), 3) if waits else None,
        )
