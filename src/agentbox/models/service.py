"""Model calls through the gateway: the provider pool plus budgets, accounting, alerts,
metrics and audit, in one place for the model endpoint and the batch-task workers.

A call: the project's budget is checked (a spent hard budget refuses it), the pool sends
the redacted request with retries and failover, then the usage is recorded (tokens, USD
from the price table) against project, sandbox and task; thresholds crossed become an
audit record, a metric and a webhook POST. The audit record carries provider, model,
tokens and cost, never the prompt or the answer.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from agentbox.audit.log import AuditLog
from agentbox.config.settings import GatewaySettings
from agentbox.errors import AllProvidersFailed, ProviderError
from agentbox.models.providers.budget import NANO, Alert, BudgetLedger, cost_nanousd
from agentbox.models.providers.pool import ProviderPool
from agentbox.models.providers.types import ChatRequest, ChatResponse, StreamEvent, Usage
from agentbox.observability.metrics import Metrics
from agentbox.observability.telemetry import Telemetry
from agentbox.state.db import Database

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attribution:
    """Who a model call is for: usage and budgets are per project; the sandbox and task
    say which agent spent it."""

    project: str
    sandbox: str | None = None
    task: str | None = None
    actor: str = "operator"


class ModelService:
    def __init__(
        self,
        settings: GatewaySettings,
        home: Path,
        audit: AuditLog,
        metrics: Metrics,
        redact: Any,
        telemetry: Telemetry | None = None,
        state: Database | None = None,
    ) -> None:
        self.pool = (
            ProviderPool(
                settings.providers,
                settings.retry,
                redact=redact,
                on_failure=lambda provider, category, model: metrics.provider_request(
                    provider, model or "default", category, 0.0
                ),
            )
            if settings.providers
            else None
        )
        self.settings = settings
        # The shared database when gateway.state names one, else the home's usage.db.
        self.ledger = BudgetLedger.from_settings(state or home / "usage.db", settings)
        self.audit = audit
        self.metrics = metrics
        self.budgets = {b.project: b for b in settings.budgets}
        self.telemetry = telemetry or Telemetry(settings)

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()

    def models(self) -> list[tuple[str, str]]:
        """(model, provider) for every configured model, each model once, in the order
        the providers are configured."""
        seen: dict[str, str] = {}
        for provider in self.settings.providers:
            for model in [*provider.models, *provider.aliases]:
                seen.setdefault(model, provider.name)
        return list(seen.items())

    def health(self) -> list[dict[str, Any]]:
        return [] if self.pool is None else self.pool.health()

    def _pool(self) -> ProviderPool:
        if self.pool is None:
            raise AllProvidersFailed(
                "no model providers are configured; add a `providers` section to the gateway "
                "config (an OpenAI-compatible or Anthropic service, or a local model)",
                providers=[],
            )
        return self.pool

    def cost(self, provider: str, model: str, usage: Usage) -> float:
        """USD, as the ledger counts it (cache reads and writes at their own prices)."""
        return cost_nanousd(self.ledger.price_of(provider, model), usage) / NANO

    async def count_tokens(self, request: ChatRequest) -> tuple[int, str | None]:
        """The request's input tokens and who counted them: a provider's exact count when
        one serving the model can count (Anthropic's endpoint), else (n, None): an
        estimate (~4 characters a token, ``_IMAGE_TOKENS`` an image). Free: no budget."""
        counted = await self._pool().count_tokens(request)
        if counted is not None:
            return counted
        images = sum(len(m.images) for m in request.messages)
        return _tokens(_request_chars(request)) + images * _IMAGE_TOKENS, None

    async def complete(self, request: ChatRequest, who: Attribution) -> ChatResponse:
        response, settle = await self.complete_deferred(request, who)
        await settle()
        return response

    async def complete_deferred(
        self, request: ChatRequest, who: Attribution
    ) -> tuple[ChatResponse, Callable[[], Awaitable[None]]]:
        """The answer, and the accounting to run once it has been sent (the endpoint runs
        it right after the response's last byte: the caller does not wait for SQLite and
        the audit record)."""
        # The ledger's SQLite reads and writes run on the loop thread: ~0.1 ms each, less
        # than a hop to a worker thread and back (the same trade as small file reads).
        with self.telemetry.model_span(request.model, who.project) as span:
            self.ledger.check(who.project)
            started = time.monotonic()
            try:
                response = await self._pool().complete(request)
            except ProviderError as e:
                self._failed(e, who)
                raise
            _describe(span, response.provider, response.model, response.usage)

        async def settle() -> None:
            await self._account(response.provider, response.model, response.usage, who, started)

        return response, settle

    async def stream(
        self, request: ChatRequest, who: Attribution
    ) -> AsyncGenerator[StreamEvent, None]:
        """The pool's stream, accounted at its ``done``. A stream that ends before (the
        client left, or the provider cut it after its first token) is accounted too, by
        estimate: the provider produced, and will bill, what was sent so far."""
        with self.telemetry.model_span(request.model, who.project) as span:
            self.ledger.check(who.project)
            started = time.monotonic()
            answering: StreamEvent | None = None  # the last event: who answers
            produced = 0  # characters of text and tool calls so far
            try:
                async for event in self._pool().stream(request):
                    if event.kind == "done":
                        usage = event.usage or Usage(0, 0)  # a server that reports none: zero
                        _describe(span, event.provider or "", event.model or "", usage)
                        await self._account(
                            event.provider or "", event.model or "", usage, who, started
                        )
                        answering = None
                    else:
                        answering = event
                        produced += len(event.text) + len(_call_text(event))
                    yield event
            except ProviderError as e:
                self._failed(e, who)
                raise
            finally:
                if answering is not None:
                    usage = Usage(_tokens(_request_chars(request)), _tokens(produced))
                    await self._account(answering.provider or "", answering.model or "", usage,
                                        who, started, outcome="cut_short")  # fmt: skip

    async def _account(
        self,
        provider: str,
        model: str,
        usage: Usage,
        who: Attribution,
        started: float,
        outcome: str = "ok",
    ) -> None:
        """Record a call's usage; ``outcome`` cut_short: a stream that ended before the
        provider's usage report, its tokens estimated (~4 characters each)."""
        seconds = time.monotonic() - started
        cost = self.cost(provider, model, usage)
        alerts = self.ledger.record(who.project, who.sandbox, who.task, provider, model, usage)
        self.metrics.provider_request(provider, model, outcome, seconds)
        self.metrics.usage(provider, model, who.project, usage, cost)
        self._budget_gauges(who.project)
        self.audit.append(
            decision="model_call",
            actor=who.actor,
            sandbox=who.sandbox,
            tool="model",
            duration_ms=round(seconds * 1000, 3),
            extra={"provider": provider, "model": model, "project": who.project,
                   "task": who.task, "tokens_in": usage.input_tokens,
                   "tokens_out": usage.output_tokens, "cost_usd": round(cost, 9),
                   **({"tokens_cache_read": usage.cache_read_tokens} if usage.cache_read_tokens
                      else {}),
                   **({"tokens_cache_write": usage.cache_write_tokens}
                      if usage.cache_write_tokens else {}),
                   **({"estimated": True} if outcome == "cut_short" else {})},
        )  # fmt: skip
        for alert in alerts:
            await self._alert(alert)

    def _failed(self, error: ProviderError, who: Attribution) -> None:
        # Each failed attempt was counted as it happened (the pool's on_failure).
        self.audit.append(
            decision="model_call_failed",
            actor=who.actor,
            sandbox=who.sandbox,
            tool="model",
            error=f"{error.code}: {error.message}"[:2000],
            extra={"project": who.project, "task": who.task},
        )

    def _budget_gauges(self, project: str) -> None:
        budget = self.budgets.get(project)
        if budget is None:
            return
        for row in self.ledger.usage(project):
            if budget.tokens_per_day:
                self.metrics.budget(project, "tokens", row.get("tokens", 0) / budget.tokens_per_day)
            if budget.usd_per_day:
                self.metrics.budget(project, "usd", row.get("usd", 0.0) / budget.usd_per_day)

    async def _alert(self, alert: Alert) -> None:
        data = alert.to_dict()
        for kind in ("tokens", "usd"):
            self.metrics.budget_alert(alert.project, kind, alert.threshold)
        self.audit.append(decision="budget_alert", actor="agentbox", tool="model", extra=data)
        url = os.environ.get(alert.webhook_env) if alert.webhook_env else None
        if url:
            try:
                async with httpx2.AsyncClient(timeout=10) as client:
                    await client.post(url, content=json.dumps(data),
                                      headers={"Content-Type": "application/json"})  # fmt: skip
            except httpx2.HTTPError as e:
                log.error("budget alert webhook failed: %s", e)


def _describe(span: Any, provider: str, model: str, usage: Usage) -> None:
    """GenAI attributes of a finished call (span is None when tracing is off)."""
    if span is None:
        return
    span.set_attribute("gen_ai.provider.name", provider)
    span.set_attribute("gen_ai.response.model", model)
    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
    if usage.cache_read_tokens:
        span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cache_read_tokens)
    if usage.cache_write_tokens:
        span.set_attribute("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens)


def _call_text(event: StreamEvent) -> str:
    call = event.tool_call
    return "" if call is None else call.name + call.arguments


def _request_chars(request: ChatRequest) -> int:
    texts = [request.system or ""]
    for m in request.messages:
        texts.append(m.content)
        texts += [c.name + c.arguments for c in m.tool_calls]
    texts += [t.name + t.description + json.dumps(t.parameters) for t in request.tools or ()]
    return sum(map(len, texts))


# An image's tokens when nobody counted: about what the vendors charge for a ~1 megapixel
# image (Anthropic: width * height / 750).
_IMAGE_TOKENS = 1500


def _tokens(chars: int) -> int:
    """A token estimate for text nobody counted: ~4 characters per token (English prose
    and code with the vendors' tokenizers), rounded up."""
    return -(-chars // 4)
