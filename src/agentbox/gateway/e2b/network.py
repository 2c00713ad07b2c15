"""E2B's network options on create, in agentbox's terms.

E2B filters egress by IP/CIDR or name lists (``allowOut``/``denyOut``), rewrites requests
(``rules``, ``maskRequestHost``) and can open a sandbox's ports to the public. agentbox's
egress is its own network spec (names only, through the egress proxy; internal ranges
always refused) and its ports are reached only through the gateway with the sandbox's
token. What means the same is mapped: "deny all outbound" is network ``none``, and
"no public traffic" is what agentbox does anyway. Anything else is refused with the field
named, never dropped: a caller that asked for a restriction must not get a sandbox
without it.
"""

from __future__ import annotations

from typing import Any

from agentbox.errors import InvalidRequest

ALL_TRAFFIC = "0.0.0.0/0"
_HOW = (
    "agentbox sets egress with its own network spec (the gateway's sandbox.network, or "
    "network in POST /v1/sandboxes: names only, through its egress proxy)"
)


def network_of(options: dict[str, Any] | None) -> str | None:
    """The agentbox network mode for E2B's ``network`` options (None: the gateway's
    default); InvalidRequest naming the first option that has no agentbox meaning."""
    if not options:
        return None
    mode = None
    for key, value in options.items():
        if key == "allowPublicTraffic":
            if value is not False:
                raise InvalidRequest(
                    "network.allowPublicTraffic: agentbox serves a sandbox's ports only "
                    "through the gateway with the sandbox's token (get_host); set it to False "
                    "or leave it out",
                    field=f"network.{key}",
                )
        elif key == "denyOut" and value == [ALL_TRAFFIC] and not options.get("allowOut"):
            mode = "none"
        elif (key == "allowOut" and not value) or value in (None, [], {}, ""):
            continue
        else:
            raise InvalidRequest(
                f"network.{key} is not supported by agentbox's E2B API; {_HOW}. "
                "denyOut=[ALL_TRAFFIC] alone (no egress) is",
                field=f"network.{key}",
            )
    return mode
