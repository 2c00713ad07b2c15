"""The names of :mod:`agentbox.runtime.requests` built with typing at run time, apart so
that building a request loads no typing (imported from there, or from here)."""

from __future__ import annotations

from typing import Literal, TypedDict

WriteMode = Literal["overwrite", "append", "create"]


class ExportOptions(TypedDict, total=False):
    """``download_tar``'s keywords, in the SDK and the runtime alike."""

    include_unsafe: bool  # also what the host would run or trust (default False)
    withheld: list[tuple[str, str]] | None  # appended: (path in the tar, why left out)


class SnapshotOptions(TypedDict, total=False):
    """``snapshot``'s keywords, in the SDK's backends and the runtime alike."""

    redact: bool  # replace found secrets instead of refusing (default False)
    allowlist: str | None  # allow-list text (see storage.secretscan.AllowList)
    memory: bool  # its running processes too (isolation gvisor; default False)
