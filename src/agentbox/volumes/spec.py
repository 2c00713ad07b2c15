"""The ``volumes`` entries of a sandbox spec: which named volume, where, read-write or not.

Paths are checked here, before anything is made: absolute, canonical, and not on a path
the sandbox's own mounts own (its /proc, /dev, /tmp, /workspace, the system directories,
the agentbox init), so a volume can only add a directory, never shadow the machinery.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
# Mounted by the sandbox itself (host.bwrap_argv) or its system tree: a volume there
# would hide or replace them.
RESERVED = ("/proc", "/dev", "/sys", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
            "/libx32", "/tmp", "/var/tmp", "/workspace", "/.agentbox", "/etc/agentbox")  # fmt: skip


def check_name(name: str) -> str:
    """A volume name: lower-case letters, digits, ``_.-``, at most 63 characters."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"volume name {name!r} is not valid: use 1-63 lower-case letters, digits, "
            "'_', '.' or '-', starting with a letter or digit"
        )
    return name


def check_path(path: str) -> str:
    """A mount path inside the sandbox: absolute, canonical, outside :data:`RESERVED`."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ValueError(f"volume path {path!r} must be an absolute path")
    if posixpath.normpath(path) != path or "//" in path or path == "/":
        raise ValueError(f"volume path {path!r} must be canonical (no '..', '.', '//', '/')")
    for reserved in RESERVED:
        if path == reserved or path.startswith(reserved + "/"):
            raise ValueError(f"volume path {path!r} lies on {reserved}, which the sandbox owns")
    if len(path) > 1024:
        raise ValueError("volume path is longer than 1024 characters")
    return path


class VolumeMount(BaseModel):
    """One volume in a sandbox: ``name`` mounted at ``path``, ``mode`` rw (one sandbox at
    a time) or ro (any number, none writing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="a volume made by `agentbox volume create`")
    path: str = Field(description="absolute path inside the sandbox, e.g. /home/user/.cache/pip")
    mode: Literal["rw", "ro"] = Field(
        default="rw", description="rw: read-write, one sandbox at a time; ro: read-only, many"
    )
    if_busy: Literal["fail", "skip"] = Field(
        default="fail",
        description="when another sandbox holds it in the way: fail the create "
        "(volume_in_use) or skip this volume (the config's default cache volumes do)",
    )

    _name = field_validator("name")(classmethod(lambda cls, v: check_name(v)))
    _path = field_validator("path")(classmethod(lambda cls, v: check_path(v)))

    @classmethod
    def parse(cls, text: str) -> VolumeMount:
        """The CLI's ``NAME:PATH[:ro|:rw]``."""
        name, sep, rest = text.partition(":")
        path, _, mode = rest.partition(":") if rest.count(":") else (rest, "", "")
        if not sep or not path:
            raise ValueError(f"--volume {text!r}: expected NAME:PATH or NAME:PATH:ro")
        return cls.model_validate({"name": name, "path": path, "mode": mode or "rw"})


def check_mounts(mounts: Sequence[VolumeMount]) -> Sequence[VolumeMount]:
    """One entry per volume and per path, and no path inside another's."""
    names = [m.name for m in mounts]
    if len(set(names)) != len(names):
        raise ValueError("a volume may be mounted once per sandbox")
    paths = sorted(m.path for m in mounts)
    for a, b in itertools.pairwise(paths):
        if b == a or b.startswith(a + "/"):
            raise ValueError(f"volume paths {a!r} and {b!r} overlap")
    return mounts
