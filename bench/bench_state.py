"""The state stores on SQLite (one host) and PostgreSQL (shared), in the same run.

    .venv/bin/python bench/bench_state.py [--rounds N] [--write]

What a gateway asks of its state per thing it does: authenticate a session token (every
request), reserve and free a sandbox record (every create and destroy), claim a task and
finish it (each batch task), check a budget and record a model call (each model call).
PostgreSQL is a real server started here (tests/pgkit.py: its own cluster on a loopback
port, fsync on, default synchronous_commit); SQLite is WAL as in a home (synchronous=FULL
for tokens, NORMAL for the rest). Rounds alternate the backends so both see the same host load. Statements per
operation count every round trip to PostgreSQL (BEGIN, locks and COMMIT included).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import psycopg  # noqa: E402

from agentbox.config.host import Admission  # noqa: E402
from agentbox.config.settings import BudgetSettings, ModelPrice  # noqa: E402
from agentbox.config.specs import SandboxSpec  # noqa: E402
from agentbox.gateway.auth import TokenStore  # noqa: E402
from agentbox.models.providers.budget import BudgetLedger  # noqa: E402
from agentbox.models.providers.types import Usage  # noqa: E402
from agentbox.runtime.store import Store  # noqa: E402
from agentbox.state.db import Database  # noqa: E402
from agentbox.state.postgres import PostgresDB, migrate  # noqa: E402
from agentbox.tasks.store import TaskStore  # noqa: E402
from common import percentile, write_doc_section  # noqa: E402
from pgkit import USER, PgServer  # noqa: E402

OPERATOR = "operator-token-0123456789abcdef"
STATEMENTS = [0]
_execute = psycopg.Connection.execute


def _counting(self: Any, *args: Any, **kwargs: Any) -> Any:
    STATEMENTS[0] += 1
    return _execute(self, *args, **kwargs)


class Backend:
    def __init__(self, name: str, where: Callable[[str], Path | Database]) -> None:
        self.name = name
        self.tokens = TokenStore(where("gateway"), OPERATOR, 3600)
        self.token, _ = self.tokens.issue("sb-bench")
        self.registry = Store(where("state"))
        self.tasks = TaskStore(where("tasks"))
        budget = BudgetSettings(project="p", tokens_per_day=10**12, alert_at=[0.5])
        prices = {"x": {"m": ModelPrice(input_per_mtok=1, output_per_mtok=2)}}
        self.ledger = BudgetLedger(where("usage"), [budget], prices)
        self.n = 0

    def ops(self) -> dict[str, Callable[[], None]]:
        spec = SandboxSpec(memory="16MiB", project="p")

        def create() -> None:
            self.n += 1
            sid = f"sb-{self.n}"
            self.registry.reserve(sid, "default", "d", spec, None,
                                  4096, Admission(max_sandboxes=1000, max_per_project=1000))  # fmt: skip
            self.registry.delete(sid)

        def task() -> None:
            submitted = self.tasks.submit("goal", "default", "p", 5)
            claimed = self.tasks.claim("w", 30)
            assert claimed is not None and claimed.id == submitted.id
            self.tasks.finish(claimed.id, "succeeded")

        def model_call() -> None:
            self.ledger.check("p")
            self.ledger.record("p", None, None, "x", "m", Usage(10, 5))

        return {
            "authenticate a session token": lambda: self.tokens.authenticate(self.token),
            "issue a session token": lambda: self.tokens.issue("sb-bench"),
            "reserve + delete a sandbox record": create,
            "submit + claim + finish a task": task,
            "budget check + record a model call": model_call,
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="agentbox-bench-pg-", dir="/var/tmp"))
    entry = pwd.getpwnam(USER)
    os.chown(base, entry.pw_uid, entry.pw_gid)
    server = PgServer(base, durable=True)
    server.init()
    server.start()
    try:
        url = server.new_database()
        migrate(url)
        shared = PostgresDB(url)
        sqlite_dir = Path(tempfile.mkdtemp(prefix="agentbox-bench-sqlite-", dir="/var/tmp"))
        backends = [
            Backend("SQLite", lambda name: sqlite_dir / f"{name}.db"),
            Backend("PostgreSQL", lambda name: shared),
        ]
        psycopg.Connection.execute = _counting  # type: ignore[method-assign]
        samples: dict[tuple[str, str], list[float]] = {}
        statements: dict[str, int] = {}
        names = list(backends[0].ops())
        for _ in range(args.rounds):
            for backend in backends:
                for name, op in backend.ops().items():
                    op()  # warm: connections, caches
                    before = STATEMENTS[0]
                    for _ in range(args.per_round):
                        start = time.perf_counter_ns()
                        op()
                        samples.setdefault((backend.name, name), []).append(
                            (time.perf_counter_ns() - start) / 1e6
                        )
                    if backend.name == "PostgreSQL":
                        statements[name] = (STATEMENTS[0] - before) // args.per_round
        shutil.rmtree(sqlite_dir, ignore_errors=True)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    rows = [
        "| operation | SQLite p50 / p95 (ms) | PostgreSQL p50 / p95 (ms) | ratio (p50) | "
        "PostgreSQL statements |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        lite, pg = samples["SQLite", name], samples["PostgreSQL", name]
        rows.append(
            f"| {name} | {percentile(lite, 50):.3f} / {percentile(lite, 95):.3f} | "
            f"{percentile(pg, 50):.3f} / {percentile(pg, 95):.3f} | "
            f"{percentile(pg, 50) / percentile(lite, 50):.2f}x | {statements[name]} |"
        )
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "state",
            "State stores: SQLite vs PostgreSQL per operation",
            "bench_state.py",
            f"--rounds {args.rounds}",
            f"{args.rounds} interleaved rounds of {args.per_round} per operation and backend, "
            "one thread; PostgreSQL 15 on 127.0.0.1 (fsync on), SQLite files in /var/tmp "
            "(WAL). Each PostgreSQL commit waits for its WAL fsync (synchronous_commit on); "
            "SQLite's NORMAL commits do not (its FULL token issue does, hence the small gap there): "
            "that is most of the gap on writes; the token read is one loopback round trip. "
            "The host is shared with other engineers' work: numbers are noisy.",
            table,
        )


if __name__ == "__main__":
    main()
