"""agentbox: isolated sandboxes for AI coding agents behind an audited tool gateway.

from agentbox import Sandbox

with Sandbox.create(memory="512MiB") as sb:
    print(sb.commands.run("echo hello").stdout)
"""

from __future__ import annotations

# Not ``typing.TYPE_CHECKING``: every agentbox import runs this file, and typing (with re,
# which it imports) is a tenth of a CLI call's start-up (tests/unit/test_import_weight.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from agentbox.client.sandbox import AsyncSandbox, CommandHandle, Sandbox, Shell
    from agentbox.client.volumes import AsyncVolume, Volume
    from agentbox.errors import AgentboxError
    from agentbox.runtime.output import CommandResult

__all__ = [
    "AgentboxError",
    "AsyncSandbox",
    "AsyncVolume",
    "CommandHandle",
    "CommandResult",
    "Sandbox",
    "Shell",
    "Volume",
]
__version__ = "0.1.0"

# Public name -> the module defining it. Imported on first use (PEP 562): importing any
# agentbox submodule runs this file first, so an eager import here would make every CLI
# command and every submodule user pay for the whole SDK.
_PUBLIC = {
    "AgentboxError": "agentbox.errors",
    "AsyncSandbox": "agentbox.client.sandbox",
    "AsyncVolume": "agentbox.client.volumes",
    "CommandHandle": "agentbox.client.sandbox",
    "CommandResult": "agentbox.runtime.output",
    "Sandbox": "agentbox.client.sandbox",
    "Shell": "agentbox.client.sandbox",
    "Volume": "agentbox.client.volumes",
}

# Modules that import no dataclass as they load (their calls run
# lightimport.import_dataclasses first): ``from agentbox import Sandbox`` then loads next
# to nothing, and a script over the home's socket pays for what its calls use.
_NO_DATACLASSES = {"agentbox.client.sandbox"}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'agentbox' has no attribute {name!r}")
    import sys

    if module not in _NO_DATACLASSES:
        from agentbox.lightimport import import_dataclasses

        import_dataclasses()

    __import__(module)  # not importlib: its package is one more module to load
    value = getattr(sys.modules[module], name)
    globals()[name] = value  # the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
