"""The shell command corpus (tests/data/shell_corpus.jsonl) run through the command analysis.

Shared by the corpus test (counts) and bench/bench_shell_corpus.py (counts and timings).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agentbox.policy.shell_analysis import RULE_UNPARSEABLE, UnparseableCommand, analyse_command

CORPUS = Path(__file__).resolve().parent / "data" / "shell_corpus.jsonl"


def load() -> list[dict[str, str]]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


@dataclass
class Outcome:
    """What the analysis made of the corpus."""

    total: int = 0
    rules: Counter[str] = field(default_factory=Counter)
    """Refusals by rule (``unparseable`` is the parser's; the others are policy rules)."""
    crashes: list[tuple[str, str]] = field(default_factory=list)
    """Commands whose analysis raised something other than a refusal, and what."""
    parser_refused: list[str] = field(default_factory=list)
    wall_ns: list[int] = field(default_factory=list)
    """Per command, the fastest of the runs (wall clock): preemption on a shared host removed."""
    cpu_ns: list[int] = field(default_factory=list)
    """Per command, the fastest of the runs (this thread's CPU time)."""

    @property
    def analysed(self) -> int:
        return self.total - self.rules[RULE_UNPARSEABLE] - len(self.crashes)

    @property
    def analysed_share(self) -> float:
        return self.analysed / self.total if self.total else 0.0


def run(commands: list[str], repeat: int = 1) -> Outcome:
    out = Outcome(total=len(commands))
    for command in commands:
        best_wall = best_cpu = 0
        for attempt in range(repeat):
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            rule = None
            try:
                analyse_command(command)
            except UnparseableCommand as exc:
                rule = exc.rule
            except Exception as exc:  # a crash: what the test exists to catch
                rule = "crash"
                if attempt == 0:
                    out.crashes.append((command, f"{type(exc).__name__}: {exc}"))
            wall, cpu = time.perf_counter_ns() - wall, time.thread_time_ns() - cpu
            best_wall = wall if attempt == 0 else min(best_wall, wall)
            best_cpu = cpu if attempt == 0 else min(best_cpu, cpu)
            if attempt == 0 and rule not in (None, "crash"):
                out.rules[rule] += 1
                if rule == RULE_UNPARSEABLE:
                    out.parser_refused.append(command)
        out.wall_ns.append(best_wall)
        out.cpu_ns.append(best_cpu)
    return out
