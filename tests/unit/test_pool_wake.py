"""The warm-pool keeper's wake socket (runtime/pool_wake.py, warmpool.WakeListener): one
keeper per home listens, root alone may send, a socket left by a dead keeper is replaced,
and a keeper that stops removes only its own socket."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

from agentbox.runtime import pool_wake
from agentbox.runtime.warmpool import WakeListener


def test_a_notify_wakes_the_listener(tmp_path: Path) -> None:
    woken = threading.Event()
    listener = WakeListener(tmp_path, woken.set)
    assert listener.start()
    try:
        mode = os.stat(pool_wake.socket_path(tmp_path)).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        pool_wake.notify(tmp_path)
        assert woken.wait(30)
    finally:
        listener.stop()
    assert not os.path.exists(pool_wake.socket_path(tmp_path))


def test_notify_without_a_listener_is_silent(tmp_path: Path) -> None:
    pool_wake.notify(tmp_path)  # no socket at all
    path = pool_wake.socket_path(tmp_path)
    Path(path).write_text("not a socket")
    pool_wake.notify(tmp_path)  # something else there: still nothing raised


def test_a_second_keeper_does_not_take_the_socket(tmp_path: Path) -> None:
    first, second = threading.Event(), threading.Event()
    one, two = WakeListener(tmp_path, first.set), WakeListener(tmp_path, second.set)
    assert one.start()
    try:
        assert two.start() is False and not two.listening
        two.stop()  # stopping the one that never listened leaves the socket alone
        pool_wake.notify(tmp_path)
        assert first.wait(30) and not second.is_set()
    finally:
        one.stop()


def test_a_socket_left_by_a_dead_keeper_is_replaced(tmp_path: Path) -> None:
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(pool_wake.socket_path(tmp_path))
    dead.close()  # the file stays, nothing answers
    woken = threading.Event()
    listener = WakeListener(tmp_path, woken.set)
    assert listener.start()
    try:
        pool_wake.notify(tmp_path)
        assert woken.wait(30)
    finally:
        listener.stop()


def test_a_stopped_keeper_leaves_a_newer_keepers_socket(tmp_path: Path) -> None:
    old = WakeListener(tmp_path, lambda: None)
    assert old.start()
    os.unlink(pool_wake.socket_path(tmp_path))  # as if removed, and a new keeper came
    woken = threading.Event()
    new = WakeListener(tmp_path, woken.set)
    assert new.start()
    try:
        old.stop()
        pool_wake.notify(tmp_path)
        assert woken.wait(30)
    finally:
        new.stop()


def test_a_failing_wake_does_not_end_the_listener(tmp_path: Path) -> None:
    calls: list[int] = []
    woken = threading.Event()

    def on_wake() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("refill failed")
        woken.set()

    listener = WakeListener(tmp_path, on_wake)
    assert listener.start()
    try:
        pool_wake.notify(tmp_path)
        for _ in range(3000):  # bounded: 30 s
            if calls:
                break
            threading.Event().wait(0.01)
        assert calls
        pool_wake.notify(tmp_path)
        assert woken.wait(30)
    finally:
        listener.stop()
