"""The request objects every SDK backend takes: one frozen dataclass per call that carries
more than a path (``commands.run``, ``processes.start``, a session's ``run``,
``files.write``, ``files.download_tar``). The in-process runtime and the gateway client
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
    from collections.abc import Iterable, Mapping, Sequence
    from typing import IO, Any, TypeVar

    from agentbox.runtime.request_types import ExportOptions, SnapshotOptions, WriteMode

    Command = TypeVar("Command", "RunRequest", "StartRequest")

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_TIMEOUT_S",
    "DownloadRequest",
    "ExportOptions",
    "RunRequest",
    "SessionRunRequest",
    "SnapshotOptions",
    "StartRequest",
    "WriteMode",
    "WriteRequest",
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


def _check_run_limits(timeout: float | None, max_output_bytes: int) -> None:
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
        _check_run_limits(self.timeout, self.max_output_bytes)


@dataclass(frozen=True)
class StartRequest:
    """Start ``command`` in the background: ``stdin`` keeps its stdin open for
    ``write_stdin``; ``pty=(cols, rows)`` runs it on a terminal of that size."""

    command: str | Sequence[str]
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    stdin: bool = False
    pty: tuple[int, int] | None = None


@dataclass(frozen=True)
class SessionRunRequest:
    """Run ``command`` in shell session ``session_id`` (its ``cd`` and ``export`` carry
    over between runs)."""

    session_id: str
    command: str
    timeout: float | None = DEFAULT_TIMEOUT_S
    stdin: bytes | str | None = None
    max_output_bytes: int = DEFAULT_MAX_OUTPUT

    def __post_init__(self) -> None:
        _check_run_limits(self.timeout, self.max_output_bytes)

    def run_of(self, argv: Sequence[str]) -> RunRequest:
        """The run of ``argv`` (the session's wrapper) with this request's stdin and
        limits."""
        return RunRequest(
            argv, stdin=self.stdin, timeout=self.timeout, max_output_bytes=self.max_output_bytes
        )


@dataclass(frozen=True)
class WriteRequest:
    """Write ``data`` (bytes, or bytes chunks streamed one at a time) to ``path``:
    ``overwrite`` truncates, ``append`` appends, ``create`` refuses an existing file;
    ``perms`` apply to a file this creates; ``make_parents`` creates missing parents."""

    path: str
    data: bytes | Iterable[bytes]
    mode: WriteMode = "overwrite"
    perms: int = 0o644
    make_parents: bool = True


@dataclass(frozen=True)
class DownloadRequest:
    """A tar of ``path`` streamed into ``fileobj``: what the host would run or trust is
    left out and listed in ``withheld`` (when given) unless ``include_unsafe``."""

    path: str
    fileobj: IO[bytes]
    include_unsafe: bool = False
    withheld: list[tuple[str, str]] | None = None


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
    return kind(value, **fields)  # type: ignore[arg-type]  # a command, not a request
