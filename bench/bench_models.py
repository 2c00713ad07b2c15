"""The gateway's model endpoint: what a request through it adds over calling the provider
directly (the same fake OpenAI server on loopback, same client, same run).

    .venv/bin/python bench/bench_models.py [--quick] [--write]   (as root)

Rows: non-streaming latency p50/p95/p99, and time to first token of a stream, for
chat completions and for the Responses API (``/v1/responses``, translated to chat
completions upstream; its first event leaves with the provider's first token); the
baseline is the chat-completions request sent straight to the fake provider. The gateway path
includes auth, the budget check, the pool (redaction, routing), accounting in SQLite, the
metrics and the audit record (fsync: batch, as in production configs that batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
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
RESPONSES = {"model": "fake-model", "input": "hello", "store": False}


def _is_token(data: str) -> bool:
    chunk = json.loads(data)
    return bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))


def first_token_ms(client: httpx2.Client, url: str, body: dict[str, object] = BODY,
                   first: Callable[[str], bool] = _is_token) -> float:  # fmt: skip
    """Milliseconds to the first ``data:`` line that ``first`` accepts."""
    start = time.perf_counter()
    with client.stream("POST", url, json={**body, "stream": True}) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and line != "data: [DONE]" and first(line[6:]):
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
                    through.post("/v1/responses", json=RESPONSES).raise_for_status()
                base, gateway, responses = [], [], []
                for _ in range(n):  # interleaved: all see the same moment of the host
                    base += timed(lambda: direct.post(direct_url, json=BODY), 1)
                    gateway += timed(lambda: through.post("/v1/chat/completions", json=BODY), 1)
                    responses += timed(lambda: through.post("/v1/responses", json=RESPONSES), 1)
                ttft_base, ttft_gw, ttfe_responses = [], [], []
                for _ in range(n // 2):
                    ttft_base.append(first_token_ms(direct, direct_url))
                    ttft_gw.append(first_token_ms(through, f"{gw.url}/v1/chat/completions"))
                    ttfe_responses.append(first_token_ms(
                        through, f"{gw.url}/v1/responses", RESPONSES, lambda _: True))  # fmt: skip
        finally:
            gw.kill(15)
    rows = [
        ("chat completion (JSON)", gateway, base, "non-streaming"),
        ("stream: time to first token", ttft_gw, ttft_base, "time to first token"),
        ("/v1/responses (JSON)", responses, base, "/v1/responses non-streaming"),
        ("/v1/responses stream: time to first event", ttfe_responses, ttft_base,
         "/v1/responses time to first event"),
    ]  # fmt: skip
    lines = [
        "| request | p50 ms | p95 ms | p99 ms | direct to the provider p50 ms | added p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    targets = [""]
    for name, through_ms, direct_ms, target in rows:
        added = percentile(through_ms, 50) - percentile(direct_ms, 50)
        lines.append(f"| {name} | {percentile(through_ms, 50):.2f} | "
                     f"{percentile(through_ms, 95):.2f} | {percentile(through_ms, 99):.2f} | "
                     f"{percentile(direct_ms, 50):.2f} | +{added:.2f} |")  # fmt: skip
        targets.append(f"- target <= 2 ms added p50 ({target}): +{added:.2f} ms, "
                       f"{'met' if added <= 2 else '**NOT met**'}")  # fmt: skip
    table = "\n".join(lines + targets)
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
