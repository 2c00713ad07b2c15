"""How healthy one provider is: a decaying fail score, a circuit breaker, Retry-After.

* The fail score orders providers (lower first, configured order breaking ties). Each
  failure adds 1 (an auth failure adds ``AUTH_PENALTY``); each success halves it; it also
  halves every ``score_half_life_seconds``. Below ``HEALTHY_BELOW`` it counts as 0, so a
  recovered primary ties with its fallback again and gets its traffic back, rather than
  the fallback (maybe the local model) keeping it for good.
* The circuit: closed → open after ``failures`` consecutive failures (or at once on an
  auth failure, for ``auth_cooldown_seconds``: a bad key does not fix itself) → half-open
  after the cooldown, when exactly one probe call is let through: its success closes the
  circuit, its failure opens it again.
* Retry-After: the provider is not called again before the time it asked for.

Times come from the pool's clock (monotonic seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from agentbox.models.providers.types import Category, ProviderFailure

State = Literal["closed", "open", "half_open"]
AUTH_PENALTY = 100.0  # sorts a demoted provider after every merely flaky one
HEALTHY_BELOW = 0.5


@dataclass(frozen=True)
class BreakerSettings:
    failures: int = 5  # consecutive failed calls that open the circuit
    cooldown_seconds: float = 30.0  # open → half-open
    auth_cooldown_seconds: float = 3600.0  # how long an auth failure demotes a provider
    score_half_life_seconds: float = 60.0


class ProviderHealth:
    def __init__(self, name: str, kind: str, breaker: BreakerSettings) -> None:
        self.name = name
        self.kind = kind
        self.breaker = breaker
        self._score = 0.0
        self._scored_at = 0.0
        self.consecutive_failures = 0
        self._open_until: float | None = None  # None: closed
        self._not_before = 0.0  # Retry-After
        self._probing = False
        self.last_failure: ProviderFailure | None = None

    def score(self, now: float) -> float:
        elapsed = max(0.0, now - self._scored_at)
        return self._score * math.pow(0.5, elapsed / self.breaker.score_half_life_seconds)

    def rank(self, now: float) -> float:
        """The routing key: the fail score, or 0 once it has decayed below the mark."""
        score = self.score(now)
        return 0.0 if score < HEALTHY_BELOW else score

    def state(self, now: float) -> State:
        if self._open_until is None:
            return "closed"
        return "open" if now < self._open_until else "half_open"

    def available_in(self, now: float) -> float:
        """Seconds before a call may go (0: now, unless a probe is already in flight)."""
        until = max(self._not_before, self._open_until or 0.0)
        return max(0.0, until - now)

    def admit(self, now: float) -> bool:
        """May a call go now? A call admitted half-open is the probe."""
        if self.available_in(now) > 0 or self._probing:
            return False
        if self.state(now) == "half_open":
            self._probing = True
        return True

    def release(self) -> None:
        """The admitted call ended without a verdict (cancelled by the caller)."""
        self._probing = False

    def wait_until(self, when: float) -> None:
        self._not_before = max(self._not_before, when)

    def succeeded(self, now: float) -> None:
        self._score = self.score(now) / 2
        self._scored_at = now
        self.consecutive_failures = 0
        self._open_until = None
        self._probing = False

    def failed(self, failure: ProviderFailure, now: float) -> None:
        probe = self._probing
        self._probing = False
        auth = failure.category is Category.AUTH
        self._score = self.score(now) + (AUTH_PENALTY if auth else 1.0)
        self._scored_at = now
        self.consecutive_failures += 1
        self.last_failure = failure
        if auth:
            self._open_until = now + self.breaker.auth_cooldown_seconds
        elif probe or self.consecutive_failures >= self.breaker.failures:
            self._open_until = now + self.breaker.cooldown_seconds
        if failure.retry_after is not None:
            self.wait_until(now + failure.retry_after)

    def skipped(self, now: float) -> dict[str, Any]:
        """Why a request did not call this provider, as ``AllProvidersFailed`` lists it."""
        wait = self.available_in(now)
        last = self.last_failure
        if self.state(now) == "open":
            why = f"circuit open for {wait:.0f} more s after {self.consecutive_failures} failures"
        elif self._probing:
            why = "circuit half-open and its probe call is in flight"
        else:
            why = f"asked to wait {wait:.0f} more s (Retry-After)"
        if last is not None:
            why += f"; last: {last.message}"
        return {
            "provider": self.name,
            "status": None,
            "category": last.category.value if last else None,
            "message": f"skipped: {why}",
        }

    def to_dict(self, now: float) -> dict[str, Any]:
        """For the console and the metrics."""
        last = self.last_failure
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.state(now),
            "fail_score": round(self.score(now), 3),
            "consecutive_failures": self.consecutive_failures,
            "last_error": last.category.value if last else None,
            "last_status": last.status if last else None,
            "last_message": last.message if last else None,
            "available_in_seconds": round(self.available_in(now), 3),
        }
