"""Which backend the SDK and the CLI of this process reach, as docker's CLI finds dockerd.

- ``AGENTBOX_URL`` set: that gateway (``http(s)://...`` or ``unix:///HOME/gateway.sock``),
  or ``inprocess``: the runtime in this process, whatever serves the home;
- unset: the home's gateway when one serves its socket (``$AGENTBOX_HOME/gateway.sock``
  accepts a connection), else the runtime in this process.

So on a host where ``agentbox serve`` runs, a script or a CLI call goes through the
gateway: its config, policy, warm pool and audit apply to it as to every other client, and
a one-shot script pays for no runtime import (docs/design.md, "The SDK's transports").

Light on purpose (``os`` and the C module ``_socket``): a one-shot script and
``sandbox exec``'s quick path load it first.
"""

from __future__ import annotations

import _socket
import os

IN_PROCESS = "inprocess"  # AGENTBOX_URL's value for "the runtime in this process"
DEFAULT_HOME = "/var/lib/agentbox"  # where state lives (config.host.agentbox_home too)
SOCKET_NAME = "gateway.sock"  # gateway.home_socket binds it


def home() -> str:
    """The home this process works on: ``$AGENTBOX_HOME``, else the default."""
    return os.path.abspath(os.environ.get("AGENTBOX_HOME") or DEFAULT_HOME)


def named_url() -> str | None:
    """The gateway ``AGENTBOX_URL`` names, or None (unset, or ``inprocess``)."""
    url = os.environ.get("AGENTBOX_URL")
    return None if not url or url == IN_PROCESS else url


def gateway_url() -> str | None:
    """The gateway this process talks to, or None: the runtime in this process."""
    if os.environ.get("AGENTBOX_URL"):
        return named_url()
    path = os.path.join(home(), SOCKET_NAME)
    return f"unix://{path}" if serving(path) else None


def serving(path: str) -> bool:
    """A gateway accepts connections on the socket ``path``. A socket left by a gateway
    that died refuses them; one of another user's (mode 0600) is not ours to use."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(2.0)
        sock.connect(path)
    except OSError:
        return False
    finally:
        sock.close()
    return True
