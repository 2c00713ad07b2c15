"""A claim in one process wakes the warm-pool keeper of another on the same home.

The keeper (a thread of ``agentbox serve``, runtime/warmpool.py) tops its pools up after
claims. Creates in other processes on the same home (the in-process SDK, the CLI) claim
from those pools too; unwoken, the keeper would see that only at its next interval, so a
few creates in a row would drain the pool and the rest would start cold. ``notify`` sends
one datagram to the keeper's socket in the home (``warmpool.WakeListener`` binds it): no
reply, never blocks, and nothing happens when no keeper listens.

Standard modules only, none heavy: every create that claims runs this.
"""

from __future__ import annotations

import _socket
import os

SOCKET_NAME = "pool-wake.sock"


def socket_path(home: os.PathLike[str] | str) -> str:
    return os.path.join(os.fspath(home), SOCKET_NAME)


def notify(home: os.PathLike[str] | str) -> None:
    """Wake the keeper serving ``home``, if one listens (best effort, tens of us)."""
    try:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_NONBLOCK)
    except OSError:
        return
    try:
        s.sendto(b"w", socket_path(home))
    except OSError:  # no keeper, or its queue is full: it is awake already
        pass
    finally:
        s.close()
