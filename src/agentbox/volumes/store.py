"""Volume records in the home's ``state.db``, beside the sandboxes (one transaction can
see both): a volume (name, image, size) and each mount of one (volume, sandbox, path,
mode). A mount whose sandbox record is gone holds nothing: every check joins on the
sandboxes table, so a creator killed between the two writes cannot wedge a volume."""

from __future__ import annotations

import builtins
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbox.errors import LimitExceeded, VolumeExists, VolumeInUse, VolumeNotFound
from agentbox.hints import Hint
from agentbox.state.sqlite import SqliteDB
from agentbox.state.tables import VOLUME_MOUNTS, VOLUMES

# Mounts that count: their sandbox still has a record (any state: a stopped one keeps it).
_HELD = "SELECT m.* FROM volume_mounts m JOIN sandboxes s ON s.id = m.sandbox"


@dataclass
class VolumeRecord:
    name: str
    image: str
    size: int
    created_at: float
    mounts: builtins.list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "created_at": self.created_at,
                "mounts": self.mounts}  # fmt: skip


def not_found(name: str) -> VolumeNotFound:
    return VolumeNotFound(
        f"volume {name!r} does not exist; create it first (agentbox volume create {name} "
        "--size 10GiB)",
        hint=Hint("volume_list", {}, "{call} to list volumes"),
        volume=name,
    )


class VolumeStore:
    def __init__(self, path: Path) -> None:
        # The sandboxes table is the runtime store's; it exists before this one opens.
        self.db = SqliteDB(path, (VOLUMES, VOLUME_MOUNTS))

    def add(self, name: str, image: str, size: int, capacity: int | None) -> VolumeRecord:
        """A new record, if the pool's ``capacity`` (bytes of volume sizes) has room."""
        now = time.time()
        with self.db.tx() as db:
            if db.execute("SELECT 1 FROM volumes WHERE name=?", (name,)).fetchone():
                raise VolumeExists(f"volume {name!r} exists already; use it or remove it first")
            (used,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM volumes").fetchone()
            if capacity is not None and used + size > capacity:
                raise LimitExceeded(
                    f"volumes hold {used / 2**30:.2f} GiB; {size / 2**30:.2f} GiB more would "
                    f"pass the volume pool's {capacity / 2**30:.2f} GiB (volumes.capacity); "
                    "remove a volume or ask for less"
                )
            db.execute(
                "INSERT INTO volumes (name, image, size, created_at) VALUES (?, ?, ?, ?)",
                (name, image, size, now),
            )
        return VolumeRecord(name, image, size, now)

    def exists(self, name: str) -> bool:
        row = self.db.conn().execute("SELECT 1 FROM volumes WHERE name=?", (name,)).fetchone()
        return row is not None

    def get(self, name: str) -> VolumeRecord:
        row = self.db.conn().execute("SELECT * FROM volumes WHERE name=?", (name,)).fetchone()
        if row is None:
            raise not_found(name)
        return VolumeRecord(**dict(row), mounts=self.mounts_of(name))

    def list(self) -> builtins.list[VolumeRecord]:
        rows = self.db.conn().execute("SELECT * FROM volumes ORDER BY name").fetchall()
        return [VolumeRecord(**dict(r), mounts=self.mounts_of(r["name"])) for r in rows]

    def mounts_of(self, name: str) -> builtins.list[dict[str, str]]:
        rows = self.db.conn().execute(_HELD + " WHERE m.volume=? ORDER BY m.sandbox", (name,))
        return [{"sandbox": r["sandbox"], "path": r["path"], "mode": r["mode"]} for r in rows]

    def mounts_for(self, sandbox: str) -> builtins.list[dict[str, str]]:
        rows = self.db.conn().execute(
            "SELECT * FROM volume_mounts WHERE sandbox=? ORDER BY path", (sandbox,)
        )
        return [{"name": r["volume"], "path": r["path"], "mode": r["mode"]} for r in rows]

    def attach(self, sandbox: str, mounts: builtins.list[tuple[str, str, str, bool]]) -> None:
        """Record ``(volume, path, mode)`` mounts for ``sandbox``, all or none: a rw
        mount needs the volume free, a ro one needs no writer (checked in the write
        transaction, so two creators in any processes cannot both win)."""
        with self.db.tx() as db:
            for name, path, mode, skip_busy in mounts:
                if not db.execute("SELECT 1 FROM volumes WHERE name=?", (name,)).fetchone():
                    raise not_found(name)
                held = db.execute(_HELD + " WHERE m.volume=? AND m.sandbox<>?", (name, sandbox))
                holders = [(r["sandbox"], r["mode"]) for r in held]
                writers = [s for s, m in holders if m == "rw"]
                if skip_busy and (writers or (mode == "rw" and holders)):
                    continue
                if writers:
                    raise VolumeInUse(
                        f"volume {name!r} is mounted read-write by {', '.join(writers)}; a "
                        "volume has one writer and no reader beside it: destroy or stop "
                        "that sandbox first",
                        volume=name,
                        sandboxes=writers,
                    )
                if mode == "rw" and holders:
                    readers = [s for s, _ in holders]
                    raise VolumeInUse(
                        f"volume {name!r} is mounted read-only by {', '.join(readers)}; a "
                        "read-write mount needs it free: destroy those sandboxes first, or "
                        "mount it with mode ro",
                        volume=name,
                        sandboxes=readers,
                    )
                db.execute(
                    "INSERT OR REPLACE INTO volume_mounts (volume, sandbox, path, mode)"
                    " VALUES (?, ?, ?, ?)",
                    (name, sandbox, path, mode),
                )

    def detach(self, sandbox: str) -> None:
        with self.db.tx() as db:
            db.execute("DELETE FROM volume_mounts WHERE sandbox=?", (sandbox,))

    def forget_orphan_mounts(self) -> int:
        """Drop mounts whose sandbox has no record (recovery)."""
        with self.db.tx() as db:
            cursor = db.execute(
                "DELETE FROM volume_mounts WHERE sandbox NOT IN (SELECT id FROM sandboxes)"
            )
        return cursor.rowcount

    def remove(self, name: str) -> VolumeRecord:
        """Delete the record unless a sandbox holds the volume."""
        with self.db.tx() as db:
            row = db.execute("SELECT * FROM volumes WHERE name=?", (name,)).fetchone()
            if row is None:
                raise not_found(name)
            holders = [r["sandbox"] for r in db.execute(_HELD + " WHERE m.volume=?", (name,))]
            if holders:
                raise VolumeInUse(
                    f"volume {name!r} is mounted by {', '.join(holders)}; destroy those "
                    "sandboxes first (a volume is removed only when nothing uses it)",
                    volume=name,
                    sandboxes=holders,
                )
            db.execute("DELETE FROM volume_mounts WHERE volume=?", (name,))
            db.execute("DELETE FROM volumes WHERE name=?", (name,))
        return VolumeRecord(**dict(row))
