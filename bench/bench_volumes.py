"""Cache volumes: ``pip install`` of a fixed requirement set, cold vs from a warm cache.

    .venv/bin/python bench/bench_volumes.py [--quick] [--write]   (as root)

A PEP 503 index in a network namespace this script creates (tests/nettopo.py +
tests/volumekit.py: no packet leaves the host) serves 8 wheels of 2 MiB each through a
link limited to ``--rate`` (default 100mbit, a tbf qdisc on the namespace's side; ``none``: the
veth's full speed). In the same run, interleaved, each round makes a fresh sandbox and a
venv in it (not timed), then times ``pip install`` of all 8:

* **cold**: with an empty pip cache (a volume emptied before the round, so both sides
  pay the same mount);
* **warm**: with the ``pip-cache`` volume a first install filled, mounted read-write at
  ``/home/user/.cache/pip``.

The index's request log counts the wheels each side downloaded. Writes nothing to docs
unless ``--write`` (the ``<!-- volumes:begin -->`` section of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from agentbox import Sandbox, Volume  # noqa: E402
from common import bench_home, percentile, progress, write_doc_section  # noqa: E402
from volumekit import CACHE, NETWORK, counted_index  # noqa: E402

PACKAGES = 8
PAYLOAD = 2 * 1024**2
SPEC = {"memory": "512MiB", "disk": "1GiB", "network": NETWORK}


def install(home: Path, volume: str, command: str) -> float:
    """Seconds for the install in a fresh sandbox with ``volume`` at the cache path."""
    with Sandbox.create(**SPEC, volumes=[f"{volume}:{CACHE}"], home=home) as sb:  # type: ignore[arg-type]
        made = sb.commands.run("python3 -m venv /tmp/venv", timeout=300)
        if made.exit_code != 0:
            raise SystemExit(f"venv failed: {made.stderr[-2000:]}")
        started = time.perf_counter()
        r = sb.commands.run(command, timeout=600)
        took = time.perf_counter() - started
        if r.exit_code != 0:
            raise SystemExit(f"pip install failed: {r.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 10")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--rate", default="100mbit", help="the index's link (tc rate, or none)")
    args = parser.parse_args()
    rate = None if args.rate == "none" else args.rate
    rounds = 3 if args.quick else 10
    with (
        bench_home("volumes") as home,
        tempfile.TemporaryDirectory() as tmp,
        counted_index(Path(tmp), count=PACKAGES, payload=PAYLOAD, rate=rate) as index,
    ):
        Volume.create("pip-cache", size="1GiB", home=home)
        Volume.create("cold-cache", size="1GiB", home=home)
        command = index.pip_install()
        install(home, "pip-cache", command)  # fills the warm cache
        times: dict[str, list[float]] = {"cold": [], "warm": []}
        downloads = {"cold": 0, "warm": 0}
        for i in range(rounds):
            for side in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
                if side == "cold":  # empty again: nothing of the last round is kept
                    with Sandbox.create(network="none", volumes=[f"cold-cache:{CACHE}"],
                                        home=home) as sb:  # fmt: skip
                        sb.commands.run(f"rm -rf {CACHE}/* {CACHE}/.[!.]*")
                before = index.wheel_downloads()
                volume = "cold-cache" if side == "cold" else "pip-cache"
                times[side].append(install(home, volume, command))
                downloads[side] += index.wheel_downloads() - before
                progress(f"round {i + 1}/{rounds} {side}: {times[side][-1]:.2f} s")
        used = Volume.get("pip-cache", home=home).used_bytes or 0
    cold50, warm50 = percentile(times["cold"], 50), percentile(times["warm"], 50)
    rows = [
        "| measure | cold (empty cache) | warm (pip-cache volume) | ratio p50 |",
        "|---|---|---|---|",
        f"| pip install of {PACKAGES} wheels x {PAYLOAD // 2**20} MiB, p50 / p95 s | "
        f"{cold50:.2f} / {percentile(times['cold'], 95):.2f} | "
        f"{warm50:.2f} / {percentile(times['warm'], 95):.2f} | {cold50 / warm50:.2f}x |",
        f"| wheels downloaded from the index per install | {downloads['cold'] / rounds:.0f} | "
        f"{downloads['warm'] / rounds:.0f} | |",
        f"| pip-cache volume used after the runs, MiB | | {used / 2**20:.1f} | |",
    ]
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "volumes",
            "Cache volumes: pip install, cold vs warm cache",
            "bench_volumes.py",
            " ".join(f for f in ("--quick" if args.quick else "", f"--rate {args.rate}") if f),
            f"{rounds} rounds each way, interleaved, each in a fresh sandbox and venv (the "
            "venv not timed); the index runs in a network namespace of the test internet, "
            f"behind a {args.rate} link, and logs every request. "
            "The host was shared with other engineers' work: the numbers are noisy.",
            table,
        )


if __name__ == "__main__":
    main()
