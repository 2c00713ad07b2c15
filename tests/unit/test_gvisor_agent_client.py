"""The host side of the gVisor exec agent treats its replies as untrusted: over a real
socket pair, a peer speaking the agent's wire format badly gets a typed error, never an
unbounded read or a guessed status."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from agentbox.errors import InvalidRequest, SandboxError
from agentbox.runtime import gvisor_agent_client as agent
from agentbox.runtime.output import BoundedCapture


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    host, peer = socket.socketpair()
    with host, peer:
        yield host, peer


def _call(host: socket.socket, peer: socket.socket, reply: bytes, timeout: float = 10.0) -> int:
    def respond() -> None:
        peer.recv(1 << 16)  # the request
        peer.sendall(reply)
        peer.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=respond)
    t.start()
    out, err = BoundedCapture(100, "stdout"), BoundedCapture(100, "stderr")
    try:
        status, _ = agent.AgentCall(host).run(agent.request(["true"], {}, "/", None),
                                              timeout, out, err)  # fmt: skip
        return status
    finally:
        t.join()
        out.close()
        err.close()


def frame(kind: bytes, data: bytes) -> bytes:
    return struct.pack("<BI", kind[0], len(data)) + data


def test_a_well_formed_reply(pair: tuple[socket.socket, socket.socket]) -> None:
    reply = frame(b"O", b"hi") + frame(b"R", b"") + frame(b"X", struct.pack("<i", -9))
    assert _call(*pair, reply) == -9


@pytest.mark.parametrize(
    "reply",
    [
        struct.pack("<BI", ord("O"), 0xFFFFFFFF),  # a 4 GiB chunk: refused before reading
        struct.pack("<BI", ord("F"), agent.MAX_MESSAGE + 1),
        frame(b"X", b"\x00\x00"),  # a status of the wrong size
        frame(b"Q", b""),  # an unknown type
    ],
)
def test_a_malformed_reply_is_a_typed_error(
    pair: tuple[socket.socket, socket.socket], reply: bytes
) -> None:
    with pytest.raises(SandboxError, match="malformed reply"):
        _call(*pair, reply)


def test_a_hang_up_before_the_status_is_a_typed_error(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    with pytest.raises(SandboxError, match="hung up"):
        _call(*pair, frame(b"O", b"partial"))


def test_launch_failures_map_to_the_callers_terms(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    with pytest.raises(InvalidRequest, match="cwd"):
        _call(*pair, frame(b"F", b"cwd /x: No such file or directory"))


def test_a_silent_agent_is_hung_up_on_after_the_timeout(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    host, peer = pair
    out, err = BoundedCapture(100, "stdout"), BoundedCapture(100, "stderr")
    call = agent.AgentCall(host)
    # The peer never answers; the kill grace is what bounds the wait.
    monkeypatch.setattr(agent, "KILL_GRACE_S", 0.1)
    try:
        status, outcome = call.run(agent.request(["sleep"], {}, "/", None), 0.1, out, err)
    finally:
        out.close()
        err.close()
    assert (status, outcome, call.killed) == (-9, agent.TIMED_OUT, True)
    assert peer.recv(1 << 16).endswith(struct.pack("<BI", ord("K"), 0))
