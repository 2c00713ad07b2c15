"""The warm pool's keeper refills after a claim once the calls pause (``settle``), not
during the calls that follow a create; steady calls delay it by ``max_settle`` at most."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from agentbox.config.specs import SandboxSpec
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.warmpool import Pool, PoolKeeper


class Recording(PoolKeeper):
    """A keeper whose refill only notes when it ran (no runtime, no sandbox; its wake
    socket in ``home``)."""

    def __init__(self, home: Path, settle: float, max_settle: float) -> None:
        pool = Pool(cast(SandboxSpec, None), 1)
        runtime = cast(Runtime, SimpleNamespace(home=home))
        super().__init__(runtime, [pool], interval=60, settle=settle, max_settle=max_settle)
        self.refills: list[float] = []

    def refill_once(self, pool: Pool) -> bool:
        self.refills.append(time.monotonic())
        return False

    def wait_refills(self, count: int) -> None:
        deadline = time.monotonic() + 30
        while len(self.refills) < count:
            assert time.monotonic() < deadline, f"{len(self.refills)} refills, not {count}"
            time.sleep(0.01)


def test_a_refill_waits_until_the_calls_pause(tmp_path: Path) -> None:
    keeper = Recording(tmp_path, settle=1.0, max_settle=60)
    keeper.start()
    try:
        keeper.wait_refills(1)  # the first look, at start
        for _ in range(4):  # a create, its command, its kill...: one wake each
            last = time.monotonic()  # before the wake: the refill comes settle after it
            keeper.wake()
            time.sleep(0.05)
        assert len(keeper.refills) == 1  # nothing while the calls go on
        keeper.wait_refills(2)
        assert keeper.refills[1] - last >= 1.0
    finally:
        keeper.stop()


def test_steady_calls_delay_a_refill_by_max_settle_at_most(tmp_path: Path) -> None:
    keeper = Recording(tmp_path, settle=1.0, max_settle=0.5)
    keeper.start()
    try:
        keeper.wait_refills(1)
        first = time.monotonic()
        keeper.wake()
        while time.monotonic() - first < 5.0:  # never a pause of `settle`
            keeper.wake()
            time.sleep(0.05)
        # refilled while the calls went on (max_settle after the first wake), not after
        assert len(keeper.refills) >= 2
        assert keeper.refills[1] - first < 5.0
    finally:
        keeper.stop()
