"""Reaching a service a sandbox runs, from the host, without any host listening socket.

A socket belongs to the network namespace it was created in. So the gateway creates one
in the sandbox's namespace (this thread joins it for the ``socket()`` call only) and
connects it to the sandbox's own loopback: the service needs no address reachable from
outside, nothing listens on a host interface, and every mode (``none`` included) works.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from agentbox.errors import InvalidRequest, NotFound, SandboxNotRunning
from agentbox.isolation import syscalls


def socket_in_netns(
    init_pid: int | Path,
    family: int = socket.AF_INET,
    kind: int = socket.SOCK_STREAM,
    proto: int = 0,
) -> socket.socket:
    """A socket (TCP unless said) in the network namespace of ``init_pid`` (or of a
    pinned namespace file). Call from a worker thread."""
    where = init_pid if isinstance(init_pid, Path) else f"/proc/{init_pid}/ns/net"
    try:
        target = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SandboxNotRunning("the sandbox is gone; create a new one") from None
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        syscalls.setns(target, syscalls.CLONE_NEWNET)
        try:
            return socket.socket(family, kind, proto)
        finally:
            try:
                syscalls.setns(own, syscalls.CLONE_NEWNET)
            except BaseException:
                # This thread would go on serving others inside a sandbox's network.
                sys.stderr.write("agentbox: could not leave a sandbox's netns; exiting\n")
                os._exit(70)
    finally:
        os.close(target)
        os.close(own)


def connect_to_port(init_pid: int, port: int, timeout: float = 10.0) -> socket.socket:
    """A connected socket to 127.0.0.1:``port`` inside the sandbox."""
    if not 0 < port < 65536:
        raise InvalidRequest(f"port must be 1-65535, got {port}")
    sock = socket_in_netns(init_pid)
    sock.settimeout(timeout)
    try:
        sock.connect(("127.0.0.1", port))
    except ConnectionRefusedError:
        sock.close()
        raise NotFound(
            f"nothing listens on port {port} inside the sandbox; start the service there "
            "(bound to 127.0.0.1 or 0.0.0.0) and try again",
            port=port,
        ) from None
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
