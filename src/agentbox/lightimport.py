"""Standard modules imported without what they load for a rare use (the SDK's light
path: tests/unit/test_import_weight.py). Standard modules only; nothing of agentbox."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: this module is on the light path
if TYPE_CHECKING:
    from typing import Any


def import_dataclasses() -> None:
    """Import dataclasses without inspect, which it loads (with ast, dis and tokenize: a
    tenth of a one-shot SDK script's start, and its exit tears them down again) for one
    use: giving a class without a docstring its signature as one. Every dataclass an SDK
    call loads has a docstring (tests/unit/test_import_weight.py), so dataclasses sees a
    stand-in that imports the real inspect on first use; everyone else imports the real
    one. (A stand-in only while dataclasses loads, as runtime/quick_exec.py does for
    _sqlite3's functools.)"""
    import sys

    if "dataclasses" in sys.modules or "inspect" in sys.modules:
        return

    class _Inspect(type(sys)):  # type: ignore[misc]
        def __getattr__(self, name: str) -> Any:
            if sys.modules.get("inspect") is self:  # asked while dataclasses loads
                del sys.modules["inspect"]
            import importlib

            return getattr(importlib.import_module("inspect"), name)

    stand_in = _Inspect("inspect")
    sys.modules["inspect"] = stand_in
    try:
        import dataclasses  # noqa: F401
    finally:
        if sys.modules.get("inspect") is stand_in:
            del sys.modules["inspect"]
