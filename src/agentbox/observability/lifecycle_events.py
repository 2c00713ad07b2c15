"""Lifecycle events (``runtime.lifecycle``) into the audit trail, the metrics and webhooks.

Events are written by whichever process made the transition (the gateway, the CLI, an
SDK user, the idle watcher) into ``state.db``. While a gateway runs, this follower copies
each into the gateway's trail (decision ``lifecycle``), counts it, and posts it to the
configured webhooks. Its position is kept in ``audit/lifecycle.ingested``, so a restart
resumes where it stopped (a crash between the append and the position write may copy an
event twice: dedupe on ``event_id``).

A ``destroyed`` event also calls ``on_destroyed(sandbox)`` (the gateway revokes the
sandbox's tokens and ends its approvals and grants), whichever process destroyed it: the
CLI, an idle timeout or the sandbox's lifetime as well as the gateway's own routes.

Webhook deliveries are JSON POSTs of the event, signed when the hook names a secret
(``X-Agentbox-Signature-256: sha256=<HMAC-SHA256 of the body>``), retried with backoff
and then dropped with a log line: a slow receiver never holds up the gateway.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2

from agentbox.audit.log import AuditLog
from agentbox.config.settings import WebhookSettings
from agentbox.observability.metrics import Metrics
from agentbox.runtime.store import Store

log = logging.getLogger(__name__)
_RETRY_DELAYS = (0.5, 2.0, 8.0)
_QUEUE_MAX = 10_000


class Position:
    """A follower's position (a number in a small file), written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> int:
        try:
            return int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def save(self, value: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{value}\n")
        os.replace(tmp, self.path)


def public_event(event: dict[str, Any]) -> dict[str, Any]:
    """The shape clients see (SSE, webhooks)."""
    return {
        "id": event["id"],
        "at": event["at"],
        "sandbox": event["sandbox"],
        "type": event["type"],
        "reason": event["reason"],
        "actor": event["actor"],
        "details": event["details"],
    }


class LifecycleIngest:
    def __init__(
        self,
        store: Store,
        audit: AuditLog,
        metrics: Metrics | None = None,
        webhooks: list[WebhookSettings] | None = None,
        poll_interval: float = 0.25,
        on_destroyed: Callable[[str], Any] | None = None,
    ) -> None:
        self.store = store
        self.on_destroyed = on_destroyed
        self.audit = audit
        self.metrics = metrics
        self.poll_interval = poll_interval
        self.position = Position(audit.path.with_name("lifecycle.ingested"))
        self.sender = WebhookSender(webhooks or [])
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lifecycle-ingest", daemon=True)

    def start(self) -> None:
        if not self.position.path.exists():
            # A first run starts now: history before this gateway is in state.db already.
            self.position.save(self.store.last_event_id())
        self.sender.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        self.sender.stop()

    def wake(self) -> None:
        """Copy new events now (after a transition this process made)."""
        self._wake.set()

    def _run(self) -> None:
        after = self.position.load()
        while not self._stop.is_set():
            try:
                for event in self.store.events_after(after, limit=500):
                    self._copy(event)
                    after = event["id"]
                    self.position.save(after)
            except Exception:  # a broken follower must not take the gateway down
                log.exception("lifecycle event ingest failed; retrying")
            self._wake.wait(self.poll_interval)
            self._wake.clear()

    def _copy(self, event: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.lifecycle_event(event["type"], event["reason"])
        self.audit.append(
            decision="lifecycle",
            actor=event["actor"],
            sandbox=event["sandbox"],
            tool=None,
            extra={
                "event": event["type"],
                "reason": event["reason"],
                "event_id": event["id"],
                **event["details"],
            },
        )
        self.sender.send(public_event(event))
        if event["type"] == "destroyed" and self.on_destroyed is not None:
            self.on_destroyed(event["sandbox"])


class WebhookSender:
    """Posts events to webhooks from one background thread."""

    def __init__(self, hooks: list[WebhookSettings], timeout: float = 10.0) -> None:
        self.hooks = hooks
        self.timeout = timeout
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(_QUEUE_MAX)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)

    def start(self) -> None:
        if self.hooks:
            self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._queue.put(None)
            self._thread.join(15)

    def send(self, event: dict[str, Any]) -> None:
        if not self.hooks:
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.error("webhook queue full; event %s not delivered", event["id"])

    def _run(self) -> None:
        with httpx2.Client(timeout=self.timeout) as client:
            while True:
                event = self._queue.get()
                if event is None:
                    return
                for hook in self.hooks:
                    if not hook.events or event["type"] in hook.events:
                        self._deliver(client, hook, event)

    def _deliver(self, client: httpx2.Client, hook: WebhookSettings, event: dict[str, Any]) -> None:
        body = json.dumps(event, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "agentbox-webhook",
            "X-Agentbox-Event": str(event["type"]),
            "X-Agentbox-Delivery": str(event["id"]),
        }
        secret = os.environ.get(hook.secret_env) if hook.secret_env else None
        if hook.secret_env and not secret:
            log.error("webhook %s: $%s is not set; not delivered", hook.url, hook.secret_env)
            return
        if secret:
            digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
            headers["X-Agentbox-Signature-256"] = f"sha256={digest}"
        for delay in (*_RETRY_DELAYS, None):
            try:
                response = client.post(hook.url, content=body, headers=headers)
                if response.status_code < 300:
                    return
                problem = f"HTTP {response.status_code}"
            except httpx2.HTTPError as e:
                problem = str(e) or type(e).__name__
            if delay is None or self._stop.wait(delay):
                log.error("webhook %s: event %s not delivered (%s)", hook.url, event["id"], problem)
                return
