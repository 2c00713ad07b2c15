"""A real PgBouncer (Debian's ``pgbouncer``: scripts/install.sh --dev) in front of a test
PostgreSQL: transaction pooling on a free 127.0.0.1 port, its files in a temp directory,
run as the ``postgres`` user (PgBouncer refuses root), stopped by its own pid.

``server_round_robin``: each transaction takes the next server connection rather than the
last one used, so a client whose statements depended on one server connection (a
prepared statement, a session setting) fails at once instead of now and then.

``connections_of(pid, port)``: how many TCP connections a process holds to a port, read
from /proc (the cluster's connection counts in docs/scale.md and the tests).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from s3kit import free_port

BIN = Path("/usr/sbin/pgbouncer")
USER = "postgres"
START_TIMEOUT_S = 30


class PgBouncer:
    def __init__(self, base: Path, pg_port: int, pool_size: int, proc: subprocess.Popen[bytes]):
        self.base, self.pg_port, self.pool_size, self.proc = base, pg_port, pool_size, proc
        self.port = 0

    def url(self, database: str) -> str:
        """The database through the pooler, as ``gateway.state`` names it."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}?pooler=transaction"

    def log(self) -> str:
        path = self.base / "pgbouncer.log"
        return path.read_text()[-3000:] if path.exists() else ""


@contextmanager
def running_pgbouncer(pg_port: int, pool_size: int = 5) -> Iterator[PgBouncer]:
    if not BIN.exists():
        raise AssertionError(
            f"{BIN} is missing: install Debian's pgbouncer (scripts/install.sh --dev)"
        )
    entry = pwd.getpwnam(USER)
    base = Path(tempfile.mkdtemp(prefix="agentbox-pgbouncer-", dir="/var/tmp"))
    port = free_port()
    (base / "users.txt").write_text(f'"{USER}" ""\n')
    (base / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={pg_port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {base}/users.txt\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 2000\n"
        "server_round_robin = 1\nadmin_users = postgres\n"
        f"logfile = {base}/pgbouncer.log\npidfile = {base}/pgbouncer.pid\n"
    )
    for path in (base, *base.iterdir()):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    with (base / "stderr.log").open("ab") as err:
        proc = subprocess.Popen(
            [str(BIN), str(base / "pgbouncer.ini")],
            user=entry.pw_uid,
            group=entry.pw_gid,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    bouncer = PgBouncer(base, pg_port, pool_size, proc)
    bouncer.port = port
    try:
        _wait_listening(bouncer)
        yield bouncer
    finally:
        proc.terminate()  # PgBouncer's immediate shutdown: it closes every connection
        proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def _wait_listening(bouncer: PgBouncer) -> None:
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if bouncer.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {bouncer.log()}")
        try:
            # The admin console answers without a server connection.
            psycopg.connect(
                f"postgresql://{USER}@127.0.0.1:{bouncer.port}/pgbouncer", autocommit=True
            ).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise AssertionError(f"pgbouncer did not listen: {bouncer.log()}") from None
        time.sleep(0.05)  # polling a condition, bounded by the deadline above


def connections_of(pid: int, port: int) -> int:
    """How many established TCP connections process ``pid`` holds to ``port``."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return 0
    count = 0
    for line in lines:
        f = line.split()
        if f[3] == "01" and int(f[2].rsplit(":", 1)[1], 16) == port and f[9] in inodes:
            count += 1
    return count
