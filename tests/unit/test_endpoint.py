"""Which backend a process reaches (agentbox.endpoint): AGENTBOX_URL when set (``inprocess``:
none), else the home's gateway only while something accepts on its socket."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import endpoint


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTBOX_HOME", str(tmp_path))
    monkeypatch.delenv("AGENTBOX_URL", raising=False)
    return tmp_path


@pytest.fixture
def listening(home: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(home / endpoint.SOCKET_NAME))
    sock.listen(4)
    try:
        yield sock
    finally:
        sock.close()


def test_a_listening_socket_in_the_home_is_the_backend(
    home: Path, listening: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert endpoint.gateway_url() == f"unix://{home}/gateway.sock"
    assert endpoint.named_url() is None  # found, not named
    monkeypatch.setenv("AGENTBOX_URL", endpoint.IN_PROCESS)
    assert endpoint.gateway_url() is None and endpoint.named_url() is None
    monkeypatch.setenv("AGENTBOX_URL", "http://127.0.0.1:9")
    assert endpoint.gateway_url() == endpoint.named_url() == "http://127.0.0.1:9"


def test_no_socket_or_a_dead_gateways_socket_means_in_process(home: Path) -> None:
    assert endpoint.gateway_url() is None  # no file
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(home / endpoint.SOCKET_NAME))  # bound, never listening: a killed gateway's
    stale.close()
    assert (home / endpoint.SOCKET_NAME).exists() and endpoint.gateway_url() is None
    (home / endpoint.SOCKET_NAME).unlink()
    (home / endpoint.SOCKET_NAME).write_text("not a socket")
    assert endpoint.gateway_url() is None


def test_the_home_is_the_environments_or_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOX_HOME", raising=False)
    assert endpoint.home() == endpoint.DEFAULT_HOME
    monkeypatch.setenv("AGENTBOX_HOME", "relative/home")
    assert endpoint.home().startswith("/") and endpoint.home().endswith("/relative/home")
