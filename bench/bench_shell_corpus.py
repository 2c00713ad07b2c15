"""The command policy's shell analysis on real-world commands (tests/data/shell_corpus.jsonl).

    .venv/bin/python bench/bench_shell_corpus.py [--write]

Counts: commands analysed, refused by the parser (rule ``unparseable``), refused by a policy
rule on an analysed command (dynamic code or names: by design), and crashes. Timings: each
command is analysed 5 times and its fastest run counts (wall clock and this thread's CPU
time), so that preemption on a shared host does not masquerade as parser cost.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from agentbox.policy.shell_analysis import RULE_UNPARSEABLE  # noqa: E402
from common import percentile, write_doc_section  # noqa: E402
from shell_corpus import load, run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    rows = load()
    run([r["cmd"] for r in rows[:200]])  # warm up
    outcome = run([r["cmd"] for r in rows], repeat=5)
    sources = Counter(r["source"].split(" ", 1)[0] for r in rows)
    wall = [ns / 1e6 for ns in outcome.wall_ns]
    cpu = [ns / 1e6 for ns in outcome.cpu_ns]
    policy = {rule: n for rule, n in outcome.rules.items() if rule != RULE_UNPARSEABLE}
    share = 100 * outcome.analysed_share
    p99 = percentile(wall, 99)
    table = "\n".join([
        "| commands | analysed | refused by the parser | refused by a policy rule | crashes |",
        "|---|---|---|---|---|",
        f"| {outcome.total} | {outcome.analysed} ({share:.2f} %) | "
        f"{outcome.rules[RULE_UNPARSEABLE]} | {sum(policy.values())} | {len(outcome.crashes)} |",
        "",
        "| per command (ms) | p50 | p95 | p99 | max |",
        "|---|---|---|---|---|",
        f"| wall clock | {percentile(wall, 50):.3f} | {percentile(wall, 95):.3f} | {p99:.3f} "
        f"| {max(wall):.3f} |",
        f"| thread CPU time | {percentile(cpu, 50):.3f} | {percentile(cpu, 95):.3f} | "
        f"{percentile(cpu, 99):.3f} | {max(cpu):.3f} |",
        "",
        "Sources: " + ", ".join(f"{name} {n}" for name, n in sources.most_common()) + ".",
        "Policy-rule refusals: " + ", ".join(f"{rule} {n}" for rule, n in sorted(policy.items()))
        + " (`bash` alone reads code from stdin, `curl … | sh`, `eval \"$(…)\"`, `\"$@\"` as a "
        "program).",
        "Refused by the parser: " + "; ".join(f"`{c}`" for c in outcome.parser_refused) + ".",
        "",
        f"- target >= 99.5 % analysed: {share:.2f} %, {'met' if share >= 99.5 else '**NOT met**'}",
        f"- target 0 parser crashes: {len(outcome.crashes)}, "
        f"{'met' if not outcome.crashes else '**NOT met**'}",
        f"- target p99 <= 1 ms per command: {p99:.3f} ms, {'met' if p99 <= 1 else '**NOT met**'}",
    ])  # fmt: skip
    print(table)
    if args.write:
        write_doc_section(
            "shell-corpus", "Command policy: shell analysis of real-world commands",
            "bench_shell_corpus.py", "",
            "tree-sitter-bash; the corpus and how it was made: tests/data/README.md. Each "
            "command is analysed 5 times, its fastest run counts.",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
