"""Where a snapshot's and a restore's time goes: phase timers around their steps, CPU
time of this process and its children, beside ``tar | zstd`` on the same files.

    .venv/bin/python bench/profile_snapshot.py [--mb 100] [--rounds 3]   (as root)

A diagnostic (no document section): run it before and after a change to see which
phase moved.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from agentbox import Sandbox  # noqa: E402
from agentbox.isolation import disk  # noqa: E402
from agentbox.runtime import snapshots  # noqa: E402
from agentbox.runtime.host import SandboxHost  # noqa: E402
from agentbox.runtime.runtime import Runtime  # noqa: E402
from agentbox.runtime.templates.store import TemplateStore  # noqa: E402
from agentbox.storage import hashedzstd, objectstore, scanarchive, secretscan  # noqa: E402
from common import bench_home, progress  # noqa: E402
from phases import PhaseTimer  # noqa: E402

MB = 1_000_000


class _TimedOs:
    """secretscan's ``os`` with a ``pread`` that the phase timer can wrap."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return os.pread(fd, n, offset)


setattr(secretscan, "os", _TimedOs())  # noqa: B010 - a module global, for the timer

PHASES = [
    ("Snapshots.create (total)", snapshots.Snapshots, "create"),
    ("  freeze + clone (FIFREEZE, FICLONE, thaw)", disk, "clone_file"),
    ("  mount the clone (loop, direct I/O)", disk, "mount_disk"),
    ("  scanarchive.archive (read, scan, tar; hash+zstd beside)", scanarchive, "archive"),
    ("    FileScan.feed (the secret scan)", secretscan.FileScan, "feed"),
    ("    os.pread (reading the clone)", _TimedOs, "pread"),
    ("    HashingZstdWriter.write (hand-over)", hashedzstd.HashingZstdWriter, "write"),
    ("  HashingZstdWriter.close (the rest of hash + zstd)", hashedzstd.HashingZstdWriter, "close"),
    ("  unmount", disk, "unmount"),
    ("  FolderStore.put_file (fsync, rename)", objectstore.FolderStore, "put_file"),
    ("  templates pin", TemplateStore, "pin"),
    ("Snapshots.restore (total)", snapshots.Snapshots, "restore"),
    ("  Snapshots.get (metadata)", snapshots.Snapshots, "get"),
    ("  _extract (zstd -d, hash, write files)", snapshots, "_extract"),
]


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-restore", action="store_true")
    parser.add_argument("--memory", default="512MiB")
    parser.add_argument("--settle", action="store_true", help="sync before each step")
    parser.add_argument("--cprofile", action="store_true", help="cProfile the last restore")
    parser.add_argument("--cprofile-snapshot", action="store_true", help="... the last snapshot")
    args = parser.parse_args()
    timer = PhaseTimer(PHASES)

    def settle() -> None:
        if args.settle:
            os.sync()

    rows: dict[str, list[tuple[float, float]]] = {"snapshot": [], "tar": [], "restore": []}
    with bench_home("profile") as home, tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        runtime = Runtime(home)
        sb = Sandbox.create(memory=args.memory, disk="2GiB", network="none", home=home)
        try:
            sb.commands.run(f"head -c {args.mb * MB} /dev/urandom > /workspace/data && sync",
                            timeout=600)  # fmt: skip
            record = runtime.get(sb.id)
            host = SandboxHost(home, sb.id, record.slot)
            archive = Path(tmp) / "baseline.tar.zst"
            with timer.active():
                for i in range(args.rounds):
                    progress(f"round {i + 1}")
                    settle()
                    c0, t0 = cpu(), time.perf_counter()
                    if args.cprofile_snapshot and i == args.rounds - 1:
                        profile = cProfile.Profile()
                        info = profile.runcall(sb.snapshot, allowlist="/workspace/data")
                        pstats.Stats(profile).sort_stats("cumtime").print_stats(40)
                    else:  # random bytes: a chance "finding", allowed (still scanned)
                        info = sb.snapshot(allowlist="/workspace/data")
                    rows["snapshot"].append((time.perf_counter() - t0, cpu() - c0))
                    settle()
                    c0, t0 = cpu(), time.perf_counter()
                    subprocess.run(
                        f"tar -C {host.disk} -cf - upper workspace | zstd -q -3 -T0 -o {archive}",
                        shell=True, check=True,
                    )  # fmt: skip
                    rows["tar"].append((time.perf_counter() - t0, cpu() - c0))
                    if not args.no_restore:
                        settle()
                        c0, t0 = cpu(), time.perf_counter()
                        if args.cprofile and i == args.rounds - 1:
                            profile = cProfile.Profile()
                            restored = profile.runcall(Sandbox.restore, info.id, home=home)
                            pstats.Stats(profile).sort_stats("tottime").print_stats(15)
                        else:
                            restored = Sandbox.restore(info.id, home=home)
                        rows["restore"].append((time.perf_counter() - t0, cpu() - c0))
                        restored.kill()
                    archive.unlink()
                    Sandbox.delete_snapshot(info.id, home=home)
        finally:
            sb.kill()
            shutil.rmtree(Path(tmp) / "unpacked", ignore_errors=True)
    for name, samples in rows.items():
        if samples:
            walls = ", ".join(f"{w:.2f}" for w, _ in samples)
            cpus = ", ".join(f"{c:.2f}" for _, c in samples)
            print(f"{name}: wall s [{walls}]  cpu s [{cpus}]  ({args.mb} MB)")
    print("\n".join(timer.table(args.rounds)))


if __name__ == "__main__":
    main()
