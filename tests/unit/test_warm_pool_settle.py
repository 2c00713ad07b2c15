"""The warm pool's keeper refills after a claim once the calls pause (``settle``), not
during the calls that follow a create; steady calls delay it by ``max_settle`` at most."""

from __future__ import annotations

import time
from typing import cast

from agentbox.config.specs import SandboxSpec
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.warmpool import Pool, PoolKeeper


class Recording(PoolKeeper):
    """A keeper whose refill only notes when it ran (no runtime, no sandbox)."""

    def __init__(self) -> None:
        pool = Pool(cast(SandboxSpec, None), 1)
        super().__init__(cast(Runtime, None), [pool], interval=60, settle=0.2, max_settle=0.8)
        self.refills: list[float] = []

    def refill_once(self, pool: Pool) -> bool:
        self.refills.append(time.monotonic())
        return False

    def wait_refills(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.refills) < count:
            assert time.monotonic() < deadline, f"{len(self.refills)} refills, not {count}"
            time.sleep(0.01)


def test_a_refill_waits_until_the_calls_pause() -> None:
    keeper = Recording()
    keeper.start()
    try:
        keeper.wait_refills(1)  # the first look, at start
        for _ in range(4):  # a create, its command, its kill...: one wake each
            keeper.wake()
            last = time.monotonic()
            time.sleep(0.05)
        assert len(keeper.refills) == 1  # nothing while the calls go on
        keeper.wait_refills(2)
        assert keeper.refills[1] - last >= 0.19
    finally:
        keeper.stop()


def test_steady_calls_delay_a_refill_by_max_settle_at_most() -> None:
    keeper = Recording()
    keeper.start()
    try:
        keeper.wait_refills(1)
        first = time.monotonic()
        keeper.wake()
        while time.monotonic() - first < 2.0:  # never a pause of `settle`
            keeper.wake()
            time.sleep(0.05)
        assert len(keeper.refills) >= 2
        assert keeper.refills[1] - first < 0.8 + 0.3
    finally:
        keeper.stop()
