"""Per-project model usage per UTC day: tokens, USD, budgets and their alerts.

The caller brackets each model call: ``check(project)`` before (raises ``BudgetExceeded``
once a hard budget is spent), ``record(...)`` after (returns the ``alert_at`` thresholds
this call crossed, each crossed once per project and day, so the caller sends the
webhook, writes the audit record and bumps the metric exactly once). A call that starts
under budget may finish over it; the next one is refused.

Kept in SQLite (WAL; every write one short ``BEGIN IMMEDIATE`` transaction) or the shared
PostgreSQL database, so several gateway processes share one account. Cost is stored in
integer nano-dollars, so sums are exact: a price with up to three decimals per million
tokens is never rounded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from agentbox.config.settings import BudgetSettings, GatewaySettings, ModelPrice
from agentbox.errors import BudgetExceeded
from agentbox.models.providers.types import Usage
from agentbox.state.db import Connection, Database
from agentbox.state.sqlite import database
from agentbox.state.tables import BUDGET_ALERTS, USAGE

log = logging.getLogger(__name__)

NANO = 10**9  # nano-dollars per dollar

PriceTable = Mapping[str, Mapping[str, ModelPrice]]  # provider name → model → price


def cost_nanousd(price: ModelPrice | None, usage: Usage) -> int:
    """What ``usage`` costs at ``price`` (USD per million tokens), in nano-dollars: the
    cache reads and writes among the input at their own prices, the rest at the input's."""
    if price is None:
        return 0

    def rate(value: float | None) -> Decimal:
        return Decimal(str(price.input_per_mtok if value is None else value))

    cached = usage.cache_read_tokens + usage.cache_write_tokens
    per_mtok = (
        rate(None) * max(0, usage.input_tokens - cached)
        + rate(price.cache_read_per_mtok) * usage.cache_read_tokens
        + rate(price.cache_write_per_mtok) * usage.cache_write_tokens
        + Decimal(str(price.output_per_mtok)) * usage.output_tokens
    )
    # USD = tokens * price / 10**6, so nano-USD = tokens * price * 10**3.
    return int((per_mtok * 1000).to_integral_value(ROUND_HALF_UP))


def _day(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")


def _seconds_to_next_day(now: float) -> float:
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today + timedelta(days=1)).timestamp() - now


def _fraction(budget: BudgetSettings, tokens: int, nanos: int) -> float:
    """How much of the budget is spent: the larger of the token and the USD share."""
    shares = [0.0]
    if budget.tokens_per_day:
        shares.append(tokens / budget.tokens_per_day)
    if budget.usd_per_day:
        shares.append(nanos / round(budget.usd_per_day * NANO))
    return max(shares)


@dataclass(frozen=True)
class Alert:
    """A budget threshold crossed; ``webhook_env`` names where the URL to notify lives."""

    project: str
    day: str
    threshold: float
    spent_fraction: float
    tokens: int
    usd: float
    tokens_per_day: int | None
    usd_per_day: float | None
    webhook_env: str | None

    @property
    def message(self) -> str:
        limits = []
        if self.tokens_per_day:
            limits.append(f"{self.tokens} of {self.tokens_per_day} tokens")
        if self.usd_per_day:
            limits.append(f"${self.usd:.2f} of ${self.usd_per_day:.2f}")
        return (
            f"project {self.project!r} has used {self.spent_fraction:.0%} of its daily model "
            f"budget on {self.day} UTC ({', '.join(limits)}); alert threshold "
            f"{self.threshold:.0%}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"message": self.message}


class BudgetLedger:
    """``where`` is the SQLite file (e.g. ``$AGENTBOX_HOME/usage.db``) or the shared
    database (already migrated); ``clock`` gives wall time (seconds since the epoch), which
    decides the UTC day."""

    def __init__(
        self,
        where: Path | Database,
        budgets: Sequence[BudgetSettings] = (),
        prices: PriceTable | None = None,
        *,
        clock: Callable[[], float] = time.time,
        keep_days: int = 400,
    ) -> None:
        self._budgets = {b.project: b for b in budgets}
        self._prices = prices or {}
        self._clock = clock
        self._unpriced_warned: set[tuple[str, str]] = set()
        self.db = database(where, (USAGE, BUDGET_ALERTS))
        with self.db.tx() as db:
            oldest = _day(self._clock() - keep_days * 86400)
            db.execute("DELETE FROM usage WHERE day < ?", (oldest,))
            db.execute("DELETE FROM budget_alerts WHERE day < ?", (oldest,))

    @classmethod
    def from_settings(cls, where: Path | Database, settings: GatewaySettings) -> BudgetLedger:
        prices = {p.name: p.prices for p in settings.providers}
        return cls(where, settings.budgets, prices)

    def close(self) -> None:
        self.db.close()

    def price_of(self, provider: str, model: str) -> ModelPrice | None:
        """The configured price; a dated name (``gpt-4o-2024-08-06``) takes its base's."""
        table = self._prices.get(provider) or {}
        if model in table:
            return table[model]
        bases = [name for name in table if model.startswith(name + "-")]
        return table[max(bases, key=len)] if bases else None

    @staticmethod
    def _spent(db: Connection, day: str, project: str) -> tuple[int, int]:
        tokens, nanos = db.execute(
            "SELECT COALESCE(SUM(input_tokens + output_tokens), 0), "
            "COALESCE(SUM(cost_nanousd), 0) FROM usage WHERE day = ? AND project = ?",
            (day, project),
        ).fetchone()
        return int(tokens), int(nanos)

    def check(self, project: str) -> None:
        """Raise ``BudgetExceeded`` when ``project`` has spent a hard daily budget."""
        budget = self._budgets.get(project)
        if budget is None or (budget.tokens_per_day is None and budget.usd_per_day is None):
            return
        now = self._clock()
        day = _day(now)
        tokens, nanos = self._spent(self.db.conn(), day, project)
        spent = []
        if budget.tokens_per_day and tokens >= budget.tokens_per_day:
            spent.append(f"{tokens} of {budget.tokens_per_day} tokens")
        if budget.usd_per_day and nanos >= round(budget.usd_per_day * NANO):
            spent.append(f"${nanos / NANO:.2f} of ${budget.usd_per_day:.2f}")
        if not spent:
            return
        wait = _seconds_to_next_day(now)
        raise BudgetExceeded(
            f"project {project!r} has spent its daily model budget ({'; '.join(spent)}) "
            f"for {day} UTC; it resets at 00:00 UTC, in {wait / 3600:.1f} h, or raise "
            "budgets[].tokens_per_day / usd_per_day in the gateway configuration",
            project=project,
            day=day,
            tokens=tokens,
            usd=nanos / NANO,
            tokens_per_day=budget.tokens_per_day,
            usd_per_day=budget.usd_per_day,
            retry_after=round(wait, 3),
        )

    def record(
        self,
        project: str,
        sandbox: str | None,
        task: str | None,
        provider: str,
        model: str,
        usage: Usage,
    ) -> list[Alert]:
        """Account one call; the alert thresholds it crossed (each once per project and
        day, whichever process records the crossing call)."""
        price = self.price_of(provider, model)
        if price is None and (provider, model) not in self._unpriced_warned:
            self._unpriced_warned.add((provider, model))
            log.warning(
                "no price for model %r of provider %r: its calls count 0 USD (their tokens "
                "still count); add it to providers[].prices",
                model,
                provider,
            )
        now = self._clock()
        day = _day(now)
        budget = self._budgets.get(project)
        alerts: list[Alert] = []
        # Per project: the sum a crossing is judged on includes every call before it.
        with self.db.tx(f"usage:{project}") as db:
            db.execute(
                "INSERT INTO usage (at, day, project, sandbox, task, provider, model, "
                "input_tokens, output_tokens, cost_nanousd, priced, cache_read_tokens, "
                "cache_write_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now,
                    day,
                    project,
                    sandbox,
                    task,
                    provider,
                    model,
                    usage.input_tokens,
                    usage.output_tokens,
                    cost_nanousd(price, usage),
                    int(price is not None),
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                ),
            )
            if budget is None or not budget.alert_at:
                return alerts
            tokens, nanos = self._spent(db, day, project)
            fraction = _fraction(budget, tokens, nanos)
            for threshold in sorted(set(budget.alert_at)):
                if fraction < threshold:
                    break
                crossed = db.execute(
                    "INSERT INTO budget_alerts (day, project, threshold, at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (day, project, threshold, now),
                ).rowcount
                if crossed:
                    alerts.append(
                        Alert(
                            project,
                            day,
                            threshold,
                            fraction,
                            tokens,
                            nanos / NANO,
                            budget.tokens_per_day,
                            budget.usd_per_day,
                            budget.alert_webhook_env,
                        )
                    )
        return alerts

    def usage(self, project: str | None = None, day: str | None = None) -> list[dict[str, Any]]:
        """Per project (every budgeted one, used or not): tokens, USD, share of the budget,
        and a breakdown by provider and model; ``day`` (YYYY-MM-DD) defaults to today UTC."""
        day = day or _day(self._clock())
        query = (
            "SELECT project, provider, model, COUNT(*), SUM(input_tokens), SUM(output_tokens), "
            "SUM(cost_nanousd), SUM((1 - priced) * (input_tokens + output_tokens)), "
            "MIN(priced), SUM(cache_read_tokens), SUM(cache_write_tokens) "
            "FROM usage WHERE day = ?"
        )
        args: tuple[str, ...] = (day,)
        if project is not None:
            query += " AND project = ?"
            args += (project,)
        query += " GROUP BY project, provider, model ORDER BY project, provider, model"
        rows = self.db.conn().execute(query, args).fetchall()
        budgeted = {p for p in self._budgets if project is None or p == project}
        names = sorted({r[0] for r in rows} | budgeted)
        models: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        nanos_of = dict.fromkeys(names, 0)
        for (name, provider, model, calls, tokens_in, tokens_out, nanos, unpriced, priced,
             cache_read, cache_write) in rows:  # fmt: skip
            nanos_of[name] += nanos
            price = self.price_of(provider, model)
            models[name].append(
                {
                    "provider": provider,
                    "model": model,
                    "requests": calls,
                    "input_tokens": tokens_in,
                    "cache_read_tokens": cache_read,
                    "cache_write_tokens": cache_write,
                    "output_tokens": tokens_out,
                    "unpriced_tokens": unpriced,
                    "usd": nanos / NANO,
                    "priced": bool(priced),
                    # Where today's configured price comes from, and when it was checked.
                    "price_source": price.source if price else None,
                    "price_checked": price.checked.isoformat() if price and price.checked else None,
                }
            )
        return [self._summary(name, day, models[name], nanos_of[name]) for name in names]

    def _summary(
        self, project: str, day: str, models: list[dict[str, Any]], nanos: int
    ) -> dict[str, Any]:
        budget = self._budgets.get(project)
        tokens_in = sum(m["input_tokens"] for m in models)
        tokens_out = sum(m["output_tokens"] for m in models)
        return {
            "project": project,
            "day": day,
            "requests": sum(m["requests"] for m in models),
            "input_tokens": tokens_in,
            "cache_read_tokens": sum(m["cache_read_tokens"] for m in models),
            "cache_write_tokens": sum(m["cache_write_tokens"] for m in models),
            "output_tokens": tokens_out,
            "tokens": tokens_in + tokens_out,
            "unpriced_tokens": sum(m["unpriced_tokens"] for m in models),
            "usd": nanos / NANO,
            "tokens_per_day": budget.tokens_per_day if budget else None,
            "usd_per_day": budget.usd_per_day if budget else None,
            "spent_fraction": _fraction(budget, tokens_in + tokens_out, nanos) if budget else None,
            "models": models,
        }
