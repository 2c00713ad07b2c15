"""The SDK's named volumes: caches that outlive sandboxes (``agentbox.volumes``).

    from agentbox import Sandbox, Volume

    Volume.create("pip-cache", size="10GiB")
    with Sandbox.create(volumes=["pip-cache:/home/user/.cache/pip"]) as sb:
        sb.commands.run("pip install -r requirements.txt")

Sizes take ints (bytes) or strings like ``"10GiB"``. Local (in-process runtime) or through
a gateway when ``AGENTBOX_URL`` is set, like ``Sandbox``.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentbox.client.interfaces import Backend


def _backend(home: Path | None) -> Backend:
    from agentbox.client.sandbox import _runtime

    return _runtime(home)


class Volume:
    """A named volume: ``name``, ``size`` (bytes), ``used_bytes``, ``free_bytes`` and
    ``mounts`` (the sandboxes holding it) as of the call that returned it."""

    def __init__(self, info: Mapping[str, Any], backend: Backend) -> None:
        self._backend = backend
        self.info = dict(info)
        self.name: str = str(info["name"])
        self.size: int = int(info["size"])

    @property
    def used_bytes(self) -> int | None:
        return self.info.get("used_bytes")

    @property
    def mounts(self) -> builtins.list[dict[str, str]]:
        return list(self.info.get("mounts") or [])

    @classmethod
    def create(cls, name: str, size: int | str = "10GiB", *, home: Path | None = None) -> Volume:
        """A new empty volume of ``size`` (its quota); VolumeExists if the name is taken."""
        backend = _backend(home)
        return cls(backend.volumes.create(name, size), backend)

    @classmethod
    def get(cls, name: str, *, home: Path | None = None) -> Volume:
        backend = _backend(home)
        return cls(backend.volumes.get(name), backend)

    @classmethod
    def list(cls, *, home: Path | None = None) -> builtins.list[Volume]:
        backend = _backend(home)
        return [cls(info, backend) for info in backend.volumes.list()]

    def refresh(self) -> Volume:
        return Volume(self._backend.volumes.get(self.name), self._backend)

    def remove(self) -> None:
        """Destroy the volume and its data; VolumeInUse while a sandbox mounts it."""
        self._backend.volumes.remove(self.name)

    def __repr__(self) -> str:
        return f"Volume({self.name!r}, size={self.size}, used={self.used_bytes})"


class AsyncVolume:
    """:class:`Volume`, awaited: the same calls in worker threads."""

    def __init__(self, volume: Volume) -> None:
        from agentbox.client.sandbox import _threaded, _threaded_as

        self.volume = volume
        self.name, self.size, self.info = volume.name, volume.size, volume.info
        self.refresh = _threaded_as(volume.refresh, AsyncVolume)
        self.remove = _threaded(volume.remove)

    @staticmethod
    async def create(
        name: str, size: int | str = "10GiB", *, home: Path | None = None
    ) -> AsyncVolume:
        return AsyncVolume(await asyncio.to_thread(Volume.create, name, size, home=home))

    @staticmethod
    async def get(name: str, *, home: Path | None = None) -> AsyncVolume:
        return AsyncVolume(await asyncio.to_thread(Volume.get, name, home=home))

    @staticmethod
    async def list(*, home: Path | None = None) -> builtins.list[AsyncVolume]:
        return [AsyncVolume(v) for v in await asyncio.to_thread(Volume.list, home=home)]
