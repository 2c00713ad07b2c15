"""The gateway's model endpoint: what a request through it adds over calling the provider
directly (the same fake OpenAI server on loopback, same client, same run).

    .venv/bin/python bench/bench_models.py [--quick] [--write]   (as root)

Rows: non-streaming latency p50/p95/p99, and time to first token of a stream; the
baseline is the same request sent straight to the fake provider. The gateway path
includes auth, the budget check, the pool (redaction, routing), accounting in SQLite, the
metrics and the audit record (fsync: batch, as in production configs that batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from common import bench_home, percentile, timed, write_doc_section  # noqa: E402
from fakeproviders import FakeProvider  # noqa: E402
from gateway_harness import GatewayProcess  # noqa: E402

CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: GATEWAY_PROCESS_TOKEN, rate_limit_per_minute: 100000000}}
audit:
  path: {home}/audit/audit.jsonl
  fsync: batch
providers:
  - name: fake
    kind: openai
    base_url: BASE_URL
    api_key_env: FAKE_KEY
    models: [fake-model]
"""
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}


def first_token_ms(client: httpx2.Client, url: str) -> float:
    start = time.perf_counter()
    with client.stream("POST", url, json={**BODY, "stream": True}) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    took = (time.perf_counter() - start) * 1000
                    for _ in lines:  # read it to the end (the connection is reused)
                        pass
                    return took
    raise RuntimeError("no token in the stream")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    n = 100 if args.quick else 500
    with bench_home("models") as home, FakeProvider("openai") as fake:
        gw = GatewayProcess(home, CONFIG.replace("BASE_URL", fake.base_url), {"FAKE_KEY": "k"})
        gw.start()
        try:
            direct_url = f"{fake.base_url}/chat/completions"
            headers = {"Authorization": f"Bearer {gw.token}"}
            with (
                httpx2.Client(timeout=30) as direct,
                httpx2.Client(base_url=gw.url, timeout=30, headers=headers) as through,
            ):
                for _ in range(20):  # warm-up: connections, caches
                    direct.post(direct_url, json=BODY)
                    through.post("/v1/chat/completions", json=BODY)
                base, gateway = [], []
                for _ in range(n):  # interleaved: both see the same moment of the host
                    base += timed(lambda: direct.post(direct_url, json=BODY), 1)
                    gateway += timed(lambda: through.post("/v1/chat/completions", json=BODY), 1)
                ttft_base, ttft_gw = [], []
                for _ in range(n // 2):
                    ttft_base.append(first_token_ms(direct, direct_url))
                    ttft_gw.append(first_token_ms(through, f"{gw.url}/v1/chat/completions"))
        finally:
            gw.kill(15)
    added = percentile(gateway, 50) - percentile(base, 50)
    added_ttft = percentile(ttft_gw, 50) - percentile(ttft_base, 50)
    table = "\n".join([
        "| request | p50 ms | p95 ms | p99 ms | direct to the provider p50 ms | added p50 ms |",
        "|---|---|---|---|---|---|",
        f"| chat completion (JSON) | {percentile(gateway, 50):.2f} | {percentile(gateway, 95):.2f} "
        f"| {percentile(gateway, 99):.2f} | {percentile(base, 50):.2f} | +{added:.2f} |",
        f"| stream: time to first token | {percentile(ttft_gw, 50):.2f} | "
        f"{percentile(ttft_gw, 95):.2f} | {percentile(ttft_gw, 99):.2f} | "
        f"{percentile(ttft_base, 50):.2f} | +{added_ttft:.2f} |",
        "",
        f"- target <= 2 ms added p50 (non-streaming): +{added:.2f} ms, "
        f"{'met' if added <= 2 else '**NOT met**'}",
        f"- target <= 2 ms added to time to first token: +{added_ttft:.2f} ms, "
        f"{'met' if added_ttft <= 2 else '**NOT met**'}",
    ])  # fmt: skip
    print(table)
    if args.write:
        write_doc_section(
            "models", "Model endpoint: overhead over the provider", "bench_models.py",
            "--quick" if args.quick else "",
            f"{n} requests each way, interleaved, one keep-alive client each; the provider is "
            "the tests' fake OpenAI server on loopback (its own latency is the baseline).",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
