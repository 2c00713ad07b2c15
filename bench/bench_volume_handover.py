"""Cache volumes: what handing a volume's tree to a new sandbox costs, by file count.

    .venv/bin/python bench/bench_volume_handover.py [--quick] [--write]   (as root)

When a sandbox attaches a volume the host walks the tree and re-owns every entry to the
sandbox's uid (``volumes/image.py``, ``hand_over``): its cost grows with the number of
files. For trees of 1 000, 10 000 and 50 000 small files (a pip cache's shape: two levels
of directories, 100 files each), interleaved in the same run:

* **hand-over walk**: ``hand_over`` read-write, from one uid to another (so every entry
  is really re-owned);
* **chown -R** (baseline): coreutils re-owning the same tree;
* **idmapped mount** (the alternative, not built): a user namespace mapping one uid to
  the sandbox's, ``open_tree(OPEN_TREE_CLONE)`` of the volume's ``data/``,
  ``mount_setattr(MOUNT_ATTR_IDMAP)``, ``move_mount`` to a directory, then unmounted: a
  constant cost whatever the tree holds;
* **sandbox create + destroy** with the volume mounted read-write (the walk included),
  beside one with an empty volume.

Writes nothing to docs unless ``--write`` (the ``<!-- volume-handover:begin -->``
section of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from agentbox import Sandbox, Volume  # noqa: E402
from agentbox.isolation import disk  # noqa: E402
from agentbox.runtime.runtime import Runtime  # noqa: E402
from agentbox.volumes import image  # noqa: E402
from common import bench_home, percentile, progress, write_doc_section  # noqa: E402

COUNTS = (1_000, 10_000, 50_000)
PER_DIR = 100
UIDS = (61_001, 61_002)  # two host uids no sandbox of this run has
SPEC = {"memory": "256MiB", "disk": "128MiB", "network": "none"}
CACHE = "/home/user/.cache/pip"

_libc = ctypes.CDLL(None, use_errno=True)
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_EMPTY_PATH, AT_FDCWD = 1, 0x1000, -100
MOUNT_ATTR_IDMAP, MOVE_MOUNT_F_EMPTY_PATH = 0x0010_0000, 0x4


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns_fd")]


def _syscall(number: int, *args: object) -> int:
    result = int(_libc.syscall(number, *args))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"syscall {number}: {os.strerror(errno)}")
    return result


def populate(data: Path, count: int) -> None:
    """``count`` files of 100 bytes in directories of ``PER_DIR``, two levels deep."""
    for i in range(count):
        d = data / f"{i // (PER_DIR * PER_DIR):02x}" / f"{i // PER_DIR % PER_DIR:02x}"
        if i % PER_DIR == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:08x}").write_bytes(b"x" * 100)


def idmapped_mount(data: Path, target: Path, uid: int) -> None:
    """Mount ``data`` at ``target`` with on-disk uid/gid 1000 shown as ``uid``, unmount."""
    holder = subprocess.Popen(["unshare", "--user", "sleep", "60"])
    try:
        own = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{holder.pid}/ns/user") == own:  # unshare not done yet
            if time.monotonic() > deadline:
                raise SystemExit("unshare --user did not make a user namespace")
            time.sleep(0.001)
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{holder.pid}/{name}").write_text(f"1000 {uid} 1\n")
        userns = os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        holder.wait()
    try:
        tree = _syscall(SYS_OPEN_TREE, AT_FDCWD, str(data).encode(),
                        OPEN_TREE_CLONE | os.O_CLOEXEC)  # fmt: skip
        try:
            attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns)
            _syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr),
                     ctypes.sizeof(attr))  # fmt: skip
            _syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, str(target).encode(),
                     MOVE_MOUNT_F_EMPTY_PATH)  # fmt: skip
        finally:
            os.close(tree)
    finally:
        os.close(userns)
    if os.stat(target).st_dev == os.stat(target.parent).st_dev:
        raise SystemExit("the idmapped mount is not there")
    disk.unmount(target)


def ways(data: Path, target: Path, uid: int) -> dict[str, Callable[[], object]]:
    """The three ways of giving ``data`` to ``uid``, each a call to time."""
    chown = ["chown", "-R", f"{uid}:{uid}", str(data)]
    return {
        "walk": lambda: image.hand_over(data, uid, uid, writable=True),
        "chown": lambda: subprocess.run(chown, check=True),
        "idmap": lambda: idmapped_mount(data, target, uid),
    }


def ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 10")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    rounds = 3 if args.quick else 10
    rows = [
        "| files in the volume | hand-over walk, p50 / p95 ms | chown -R, p50 / p95 ms "
        "| walk / chown -R p50 | idmapped mount, p50 / p95 ms | sandbox create+destroy, "
        "p50 ms (empty volume: p50 ms) |",
        "|---|---|---|---|---|---|",
    ]
    with bench_home("volume-handover") as home, tempfile.TemporaryDirectory() as tmp:
        runtime = Runtime(home)
        Volume.create("empty", size="64MiB", home=home)
        target = Path(tmp) / "idmapped"
        target.mkdir()
        for count in COUNTS[:2] if args.quick else COUNTS:
            name = f"files-{count}"
            Volume.create(name, size="1GiB", home=home)
            data = home / "volumes" / "mnt" / name / image.DATA
            populate(data, count)
            times: dict[str, list[float]] = {k: [] for k in ("walk", "chown", "idmap")}
            made: dict[str, list[float]] = {"full": [], "empty": []}
            for i in range(rounds):
                steps = ways(data, target, UIDS[i % 2])
                for key in list(steps)[i % 3 :] + list(steps)[: i % 3]:  # rotate the order
                    times[key].append(ms(steps[key]))
                for side in ("full", "empty") if i % 2 == 0 else ("empty", "full"):
                    volume = name if side == "full" else "empty"

                    def create(volume: str = volume) -> None:
                        Sandbox.create(**SPEC, volumes=[f"{volume}:{CACHE}"],  # type: ignore[arg-type]
                                       home=home).kill()  # fmt: skip

                    made[side].append(ms(create))
                progress(f"{count} files, round {i + 1}/{rounds}: walk {times['walk'][-1]:.0f} ms")
            walk50, chown50 = percentile(times["walk"], 50), percentile(times["chown"], 50)
            rows.append(
                f"| {count:,} | {walk50:.0f} / {percentile(times['walk'], 95):.0f} | "
                f"{chown50:.0f} / {percentile(times['chown'], 95):.0f} | "
                f"{walk50 / chown50:.2f}x | {percentile(times['idmap'], 50):.1f} / "
                f"{percentile(times['idmap'], 95):.1f} | {percentile(made['full'], 50):.0f} "
                f"({percentile(made['empty'], 50):.0f}) |"
            )
            runtime.volumes.remove(name)
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "volume-handover",
            "Cache volumes: handing a volume's tree to a new sandbox",
            "bench_volume_handover.py",
            "--quick" if args.quick else "",
            f"{rounds} rounds per size, the three ways interleaved (order rotated each "
            "round); files of 100 bytes, 100 per directory, two levels. The idmapped mount "
            "is measured, not built (docs/design.md, Cache volumes). The host was shared "
            "with other engineers' work: the numbers are noisy.",
            table,
        )


if __name__ == "__main__":
    main()
