"""The request objects every SDK backend takes: one frozen dataclass per call that carries
more than a path (``commands.run`` here; ``processes.start``, a session's ``run``,
``files.write`` and ``files.download_tar`` in ``requests_extra``, which a one-shot
script does not load). The in-process runtime and the gateway client
(``agentbox.client.remote``) implement ``agentbox.client.interfaces`` over these, so an
argument is declared once and neither backend can drop one silently; the SDK's public
methods (``Sandbox.commands.run(cmd, timeout=...)``) build them.

Units: ``timeout`` in **seconds**; sizes in **bytes**. The checks that need no sandbox run
here, when the request is built, so both backends refuse the same values the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# typing only where a type is used (a call over the home's socket never loads it:
# tests/unit/test_import_weight.py); the names built with it at run time (WriteMode,
# ExportOptions, SnapshotOptions) live in request_types and are served from there.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, TypeVar

    from _typeshed import DataclassInstance

    from agentbox.runtime.request_types import ExportOptions, SnapshotOptions, WriteMode

    Command = TypeVar("Command", bound=DataclassInstance)

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_TIMEOUT_S",
    "ExportOptions",
    "RunRequest",
    "SnapshotOptions",
    "WriteMode",
    "check_run_limits",
    "coerce",
]
_TYPED = ("WriteMode", "ExportOptions", "SnapshotOptions")


def __getattr__(name: str) -> object:
    if name in _TYPED:
        from agentbox.runtime import request_types

        return getattr(request_types, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT = 1 << 20


def check_run_limits(timeout: float | None, max_output_bytes: int) -> None:
    # errors (with hints) only when refusing: a call over the home's socket never loads it
    if timeout is not None and timeout <= 0:
        from agentbox.errors import InvalidRequest

        raise InvalidRequest("timeout must be positive (seconds)")
    if max_output_bytes < 0:
        from agentbox.errors import InvalidRequest

        raise InvalidRequest("max_output_bytes must be >= 0")


@dataclass(frozen=True)
class RunRequest:
    """Run ``command`` (a bash string, or an argv run without a shell) and wait:
    ``stdin`` fed to it, ``timeout`` its wall-clock limit (None: none), output beyond
    ``max_output_bytes`` per stream cut (head and tail kept), ``pty`` on a terminal."""

    command: str | Sequence[str]
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    stdin: bytes | str | None = None
    timeout: float | None = DEFAULT_TIMEOUT_S
    max_output_bytes: int = DEFAULT_MAX_OUTPUT
    pty: bool = False

    def __post_init__(self) -> None:
        check_run_limits(self.timeout, self.max_output_bytes)


def coerce(
    kind: type[Command], value: Command | str | Sequence[str], options: dict[str, Any]
) -> Command:
    """The runtime's short form for its own callers (``runner.run(["true"], timeout=5)``):
    ``value`` as is when it is a request, else a request of ``kind`` built from a command
    and those ``options`` that are its fields, which are taken out of ``options`` (what
    remains are the call's own, such as ``on_output``)."""
    names = {f.name for f in dataclasses.fields(kind)} & options.keys()
    fields = {name: options.pop(name) for name in names}
    if isinstance(value, kind):
        if fields:
            raise TypeError(f"{', '.join(sorted(fields))} given twice: in the request and apart")
        return value
    return kind(value, **fields)  # type: ignore[call-arg]  # a request type's own fields
