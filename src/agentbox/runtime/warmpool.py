"""Warm pools: sandboxes made ahead of time, so that a create that matches is served in a
database transaction instead of a launch.

A pool is a spec (what a plain create on the gateway would get) and a size. The keeper
(a thread of the gateway) tops each pool up one sandbox at a time, replaces pooled
sandboxes whose template changed, and wakes up after a claim (one made in its own process,
or one made by another process on the same home, the in-process SDK or the CLI, which
says so on the keeper's socket: runtime/pool_wake.py) once the calls have paused:
``settle`` seconds after the last transition (at most ``max_settle`` after the first). A
refill is a create, a tenth of a second of CPU in the gateway's process; started at the
claim, it took the GIL and the host's cores from the calls that follow a create (a
one-shot script's run and kill: 3 times slower, docs/benchmarks.md). Pooled sandboxes
are real, running sandboxes in state ``pooled``: admission counts them, calls cannot reach
them, and ``Runtime.create`` claims the oldest one whose fixed settings (template, limits,
disk, network: ``runtime.pool_key``) match the request; the request's environment,
lifetime, idle settings and project are applied at the claim.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentbox.config.specs import SandboxSpec
from agentbox.errors import LimitExceeded
from agentbox.runtime import pool_wake
from agentbox.runtime.runtime import Runtime, pool_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pool:
    spec: SandboxSpec
    size: int


class PoolKeeper:
    def __init__(
        self,
        runtime: Runtime,
        pools: list[Pool],
        interval: float = 5.0,
        settle: float = 0.25,
        max_settle: float = 2.0,
    ) -> None:
        self.runtime = runtime
        self.pools = [p for p in pools if p.size > 0]
        self.interval = interval
        self.settle = settle
        self.max_settle = max_settle
        self._woken_at = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)
        self.listener = WakeListener(runtime.home, self.wake)

    def start(self) -> None:
        if self.pools:
            try:
                self.listener.start()
            except OSError as e:  # claims elsewhere then wait for the interval
                log.warning("warm pool: cannot listen on %s: %s", self.listener.path, e)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.listener.stop()
        if self._thread.is_alive():
            self._thread.join(60)

    def wake(self) -> None:
        """A sandbox was claimed (or may have been): refill once the calls pause."""
        self._woken_at = time.monotonic()
        self._wake.set()

    def _settle(self) -> None:
        """Wait until no wake came for ``settle`` seconds, ``max_settle`` at most."""
        started = time.monotonic()
        while not self._stop.is_set():
            left = min(self._woken_at + self.settle, started + self.max_settle) - time.monotonic()
            if left <= 0:
                return
            self._stop.wait(left)

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = False
            for pool in self.pools:
                try:
                    busy |= self.refill_once(pool)
                except LimitExceeded as e:  # the host is full: pooled ones wait their turn
                    log.info("warm pool waits: %s", e.message)
                except Exception:  # the keeper must outlive a failed create
                    log.exception("warm pool refill failed")
            if not busy:
                woken = self._wake.wait(self.interval)
                self._wake.clear()
                if woken:
                    self._settle()

    def refill_once(self, pool: Pool) -> bool:
        """Replace one stale pooled sandbox or add one missing; whether it did anything."""
        spec = self.runtime.with_template_tier(pool.spec)  # the tier its creates get
        template = self.runtime.templates.get(spec.template)
        members = self.runtime.store.pooled(pool_key(spec))
        for record in members:
            if record.state == "pooled" and record.template_digest != template.digest:
                return self.runtime.recycle(record.id)  # False: claimed meanwhile
        if len(members) < pool.size:
            self.runtime.fill_pool(spec)
            return True
        return False


class WakeListener:
    """The keeper's end of runtime/pool_wake.py: calls ``on_wake`` for each datagram on
    the home's socket, on a thread of its own.

    One keeper per home listens: another one finds the socket answered and listens to
    nothing (its interval still refills its pools); a socket file left by a keeper that
    died is replaced. The socket is root's alone (0600); a datagram can only make the
    keeper look at its pools once more."""

    def __init__(self, home: Path, on_wake: Callable[[], None]) -> None:
        self.path = pool_wake.socket_path(home)
        self._on_wake = on_wake
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def start(self) -> bool:
        """Bind and listen; False when another live keeper holds the socket."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            if not self._bind(sock):
                sock.close()
                return False
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="pool-wake",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        return True

    def _bind(self, sock: socket.socket) -> bool:
        try:
            sock.bind(self.path)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            if _answered(self.path):
                log.info("another warm-pool keeper listens on %s: this one refills on its "
                         "interval", self.path)  # fmt: skip
                return False
            os.unlink(self.path)  # left by a keeper that died
            sock.bind(self.path)
        os.chmod(self.path, 0o600)
        st = os.stat(self.path)
        self._inode = (st.st_dev, st.st_ino)
        return True

    def _serve(self, sock: socket.socket) -> None:
        while True:
            try:
                sock.recv(16)
            except OSError:
                return
            if self._sock is not sock:  # stop() shut it down (the recv returned b"")
                return
            try:
                self._on_wake()
            except Exception:  # a wake must never end the listener
                log.exception("warm pool: wake failed")

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:  # ours, not a later keeper's
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the recv
        if self._thread is not None:
            self._thread.join(5)
        sock.close()


def _answered(path: str) -> bool:
    """Whether a live socket is bound at ``path`` (connecting a datagram socket fails
    only when nothing is bound there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True
