"""Sandbox networking: what a network costs at create, per request and in throughput.

    .venv/bin/python bench/bench_network.py [--quick] [--write]   (as root)

Everything runs against upstream servers in a network namespace this script creates
(tests/nettopo.py): no packet leaves the host. Baselines are measured in the same run:
a sandbox with ``network none`` for create, and the same client talking to the same
upstream directly from the host for latency and throughput.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from agentbox import Sandbox  # noqa: E402
from agentbox.network.plane import EXPLICIT_PORT, home_net  # noqa: E402
from common import bench_home, percentile, write_doc_section  # noqa: E402
from nettopo import UPSTREAM_A, internet  # noqa: E402

HOSTS = {"allowed.test": UPSTREAM_A}
NETWORK = {"mode": "allowlist", "allow": ["allowed.test"], "hosts": HOSTS}

# Sequential GETs, a new connection each (what the proxy does per absolute-form request).
LATENCY = """
import http.client, json, sys, time
host, port, path, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
out = []
for _ in range(n):
    t = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", path, headers={"Host": "allowed.test"})
    r = c.getresponse(); r.read(); c.close()
    assert r.status == 200, r.status
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""


def timed_creates(home: Path, network: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        sb = Sandbox.create(memory="256MiB", disk="64MiB", network=network, home=home)
        out.append((time.perf_counter() - t) * 1000)
        sb.kill()
    return out


def curl_speed(argv_prefix: list[str], url: str, extra: list[str]) -> float:
    """MB/s of one download, as curl measures it (the body goes to /dev/null)."""
    out = subprocess.run(
        [*argv_prefix, "curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}", *extra, url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(out) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    creates, requests, size = (10, 100, 20 * 2**20) if args.quick else (40, 500, 100 * 2**20)
    with bench_home("net") as home, tempfile.TemporaryDirectory() as tmp, internet(Path(tmp)):
        timed_creates(home, NETWORK, 2)  # warm-up: the egress daemon, the nft table
        with_net = timed_creates(home, NETWORK, creates)
        without = timed_creates(home, "none", creates)
        sb = Sandbox.create(memory="512MiB", disk="256MiB", network=NETWORK, home=home)
        try:
            n = str(requests)
            proxied = json.loads(sb.commands.run(
                ["python3", "-c", LATENCY, home_net(home).proxy_address, str(EXPLICIT_PORT),
                 "http://allowed.test/", n],
                timeout=300).stdout)  # fmt: skip
            transparent = json.loads(sb.commands.run(
                ["python3", "-c", LATENCY, UPSTREAM_A, "80", "/", n], timeout=300).stdout)  # fmt: skip
            direct = json.loads(subprocess.run(
                [sys.executable, "-c", LATENCY, UPSTREAM_A, "80", "/", n],
                capture_output=True, text=True, check=True).stdout)  # fmt: skip
            url = f"http://allowed.test/bytes/{size}"
            speeds = {"proxied": [], "direct": []}  # type: dict[str, list[float]]
            for _ in range(3):
                r = sb.commands.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}",
                                     url], timeout=300)  # fmt: skip
                speeds["proxied"].append(float(r.stdout) / 1e6)
                speeds["direct"].append(
                    curl_speed([], url, ["--resolve", f"allowed.test:80:{UPSTREAM_A}"])
                )
        finally:
            sb.kill()
    added_create = statistics.median(with_net) - statistics.median(without)
    added_request = statistics.median(proxied) - statistics.median(direct)
    ratio = statistics.median(speeds["proxied"]) / statistics.median(speeds["direct"])
    mb = size // 2**20
    rows = [
        "| measure | with the egress path | baseline | difference |",
        "|---|---|---|---|",
        f"| sandbox create p50 / p95 ms | {percentile(with_net, 50):.1f} / {percentile(with_net, 95):.1f} "
        f"| {percentile(without, 50):.1f} / {percentile(without, 95):.1f} (network none) | +{added_create:.1f} ms |",
        f"| HTTP request via HTTP_PROXY, p50 / p95 / p99 ms | {percentile(proxied, 50):.2f} / "
        f"{percentile(proxied, 95):.2f} / {percentile(proxied, 99):.2f} | {percentile(direct, 50):.2f} / "
        f"{percentile(direct, 95):.2f} / {percentile(direct, 99):.2f} (host, direct) | +{added_request:.2f} ms |",
        f"| HTTP request intercepted (no proxy variables), p50 ms | {percentile(transparent, 50):.2f} "
        f"| {percentile(direct, 50):.2f} (host, direct) | "
        f"+{statistics.median(transparent) - statistics.median(direct):.2f} ms |",
        f"| {mb} MB download, MB/s (median of 3) | {statistics.median(speeds['proxied']):.0f} "
        f"| {statistics.median(speeds['direct']):.0f} (host, direct) | {ratio:.0%} of direct |",
    ]
    verdicts = [
        f"- target <= 8 ms added to create: +{added_create:.1f} ms, "
        + ("met" if added_create <= 8 else "**NOT met**"),
        f"- target <= 1 ms added per proxied request p50: +{added_request:.2f} ms, "
        + ("met" if added_request <= 1 else "**NOT met**"),
        f"- target >= 80 % of direct throughput on a {mb} MB download: {ratio:.0%}, "
        + ("met" if ratio >= 0.8 else "**NOT met**"),
    ]
    table = "\n".join(rows) + "\n\n" + "\n".join(verdicts)
    print(table)
    if args.write:
        write_doc_section(
            "network", "Network: the egress path", "bench_network.py",
            "--quick" if args.quick else "",
            "Upstream: Python's http.server in a network namespace made by the run. "
            f"{creates} creates each way; {requests} sequential requests, a new connection "
            "each, from Python's http.client inside a sandbox and, for the baseline, on the "
            "host; downloads with curl.",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
