"""Validated sandbox settings remembered on disk, so a create need not import pydantic.

Validating a create's settings (``specs.SandboxSpec``) imports pydantic and builds its
models: most of what a one-shot script (import, create, run, kill) spent. The result is a
pure function of the settings given and of the code that validates them, so the first
validation of some settings writes its result under ``$AGENTBOX_HOME/cache/specs``,
named by a hash of both (the settings as canonical JSON; size and mtime of ``specs.py``,
``units.py``, ``config.py``, this file and pydantic's ``__init__``). A later create with
the same settings, in any process, reads it back as a :class:`StoredSpec`, which answers
what ``Runtime.create`` asks of a spec. Settings that fail validation are never stored;
any other create (a fork, a restore, a resume, a gateway's own spec) validates as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from agentbox.config.specs import SandboxSpec

_CODE = ("specs.py", "units.py", "config.py", "runtime/spec_cache.py")


class StoredNetwork:
    """``spec.network`` of a :class:`StoredSpec` (what create reads of it)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    @property
    def mode(self) -> str:
        return str(self._values["mode"])

    @property
    def credentials(self) -> list[Any]:
        return list(self._values.get("credentials") or [])


class StoredSpec:
    """A validated spec read back from the cache: its dump, with the attributes create
    uses (``tests/unit/test_spec_cache.py`` checks they equal the validated model's)."""

    def __init__(self, dump: dict[str, Any]) -> None:
        self._dump = dump
        self.network = StoredNetwork(dump["network"])

    @property
    def template(self) -> str:
        return str(self._dump["template"])

    @property
    def isolation(self) -> str:
        return str(self._dump["isolation"])

    @property
    def on_idle(self) -> str:
        return str(self._dump["on_idle"])

    @property
    def memory(self) -> int:
        return int(self._dump["memory"])

    @property
    def pids(self) -> int:
        return int(self._dump["pids"])

    @property
    def cpus(self) -> float:
        return float(self._dump["cpus"])

    @property
    def disk(self) -> int:
        return int(self._dump["disk"])

    @property
    def lifetime(self) -> float:
        return float(self._dump["lifetime"])

    @property
    def volumes(self) -> tuple[()]:
        return ()

    @property
    def project(self) -> str | None:
        project = self._dump.get("project")
        return None if project is None else str(project)

    def model_dump(self, *, include: set[str] | None = None, mode: str = "json") -> dict[str, Any]:
        """As ``SandboxSpec.model_dump`` after a JSON round trip (lists for tuples): the
        form a record stores."""
        dump = json.loads(json.dumps(self._dump))
        return dump if include is None else {k: v for k, v in dump.items() if k in include}


def validated(home: Path, values: Mapping[str, object] | None) -> SandboxSpec | StoredSpec:
    """``values`` validated: from the cache when these settings were validated before by
    this code, else by ``spec_from`` (then remembered)."""
    from agentbox.runtime.spec_input import spec_from

    try:
        key = _key(dict(values or {}))
    except (TypeError, ValueError):  # not JSON (e.g. a NetworkSpec inside): no caching
        return spec_from(values)
    path = home / "cache" / "specs" / f"{key}.json"
    try:
        return StoredSpec(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        pass
    spec = spec_from(values)
    if not spec.volumes:  # a StoredSpec has no volumes (they need the typed mounts)
        _remember(path, spec.model_dump(mode="json"))
    return spec


def _remember(path: Path, dump: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(dump))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
    except OSError:
        tmp.unlink(missing_ok=True)  # only a later create pays the validation again


def _key(values: dict[str, object]) -> str:
    from importlib.machinery import PathFinder

    from agentbox.digest import sha256_hex

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [os.path.join(package, name) for name in _CODE]
    pydantic = PathFinder.find_spec("pydantic")
    files.append(pydantic.origin if pydantic is not None and pydantic.origin else "-")
    parts = [json.dumps(values, sort_keys=True, allow_nan=False)]
    for name in files:
        try:
            st = os.stat(name)
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    return sha256_hex("\0".join(parts).encode())[:32]
