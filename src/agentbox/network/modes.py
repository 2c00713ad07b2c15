"""The egress modes, declared once: every surface (the network spec, the egress policy,
the CLI's ``--network``) takes its list from here. Add a mode to the Literal, then teach
``decision.decide`` what it means."""

from __future__ import annotations

from typing import Literal, get_args

EgressMode = Literal["none", "allowlist", "open", "ask"]
EGRESS_MODES: tuple[str, ...] = get_args(EgressMode)
