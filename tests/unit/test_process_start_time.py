"""The fast exec path (runtime/quick_exec.py) does not take a process that ended and is
not reaped yet (a zombie) for a running init: a stopped sandbox's init stays one until the
host's PID 1 reaps it (on these VMs about once a second), with no namespaces to enter."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentbox.runtime import quick_exec
from agentbox.runtime.host import process_start_time


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[0]


def test_a_zombie_has_no_start_time_on_the_fast_path() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 30
        while _state(pid) != "Z":
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        assert quick_exec._start_time(pid) is None
    finally:
        os.waitpid(pid, 0)
    assert quick_exec._start_time(pid) is None  # reaped: gone


def test_a_running_process_has_the_same_start_time_on_both_paths() -> None:
    start = process_start_time(os.getpid())
    assert start is not None and start > 0
    assert quick_exec._start_time(os.getpid()) == start
