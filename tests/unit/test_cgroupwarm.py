"""The create's cgroup warm-up moves nothing: it writes a thread into the cgroup that
thread is already in, and the process's cgroups are the same afterwards."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentbox.isolation import cgroupwarm


def test_the_file_is_the_threads_own_cgroup() -> None:
    path = cgroupwarm._own_tasks_file()
    if path is None or not path.exists():
        pytest.skip("no cgroup hierarchy visible here")
    assert str(threading.get_native_id()) in path.read_text().split()


def test_a_warm_up_leaves_every_cgroup_as_it_was() -> None:
    before = Path("/proc/self/cgroup").read_text()
    cgroupwarm._last = 0.0
    cgroupwarm.start()
    for thread in [t for t in threading.enumerate() if t.name == "cgroup-warm"]:
        thread.join(30)
    assert Path("/proc/self/cgroup").read_text() == before


def test_a_second_call_at_once_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    real = threading.Thread

    def counting(*args: object, **kwargs: object) -> threading.Thread:
        thread = real(*args, **kwargs)  # type: ignore[arg-type]
        started.append(thread)
        return thread

    monkeypatch.setattr(cgroupwarm.threading, "Thread", counting)
    cgroupwarm._last = 0.0
    cgroupwarm.start()
    cgroupwarm.start()
    assert len(started) == 1
