"""User input into a sandbox spec: apart from the runtime so that what builds on the
runtime (snapshots restore) needs not import it for this."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentbox.config.specs import SandboxSpec


def spec_from(values: Mapping[str, object] | SandboxSpec | None) -> SandboxSpec:
    """Validate user input into a spec; errors name the field and what was expected."""
    # pydantic is imported here, not at the top: commands on existing sandboxes never
    # validate a spec and so skip its import (tests/unit/test_import_weight.py).
    from pydantic import ValidationError

    from agentbox.config.specs import SandboxSpec, invalid_request

    if isinstance(values, SandboxSpec):
        return values
    try:
        return SandboxSpec.model_validate(dict(values or {}))
    except ValidationError as e:
        raise invalid_request(e.errors(), "invalid sandbox settings") from None
