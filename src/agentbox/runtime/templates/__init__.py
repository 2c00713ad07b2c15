"""Templates: the read-only root filesystems that sandboxes overlay (overview and storage
layout: :mod:`.store`). One module per job: :mod:`.store` (names, digests, reservations,
garbage collection), :mod:`.default`, :mod:`.debian` (mmdebstrap), :mod:`.oci` (image
import) and :mod:`.harden` (finishing a tree). The names other modules use are here."""

from __future__ import annotations

from agentbox.runtime.templates.harden import USER_NAME, USER_UID, Progress
from agentbox.runtime.templates.store import DEFAULT_NAME, Template, TemplateStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agentbox.runtime.templates.debian import DEFAULT_SUITE, host_debian_sources

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_SUITE",
    "USER_NAME",
    "USER_UID",
    "Progress",
    "Template",
    "TemplateStore",
    "host_debian_sources",
]


def __getattr__(name: str) -> object:
    # The Debian builder's names, imported on first use (PEP 562): a create reads a
    # template and never builds one.
    if name in ("DEFAULT_SUITE", "host_debian_sources"):
        from agentbox.runtime.templates import debian

        return getattr(debian, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
