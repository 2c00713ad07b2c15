"""Row 1: create -> first command result, and destroy, beside plain bwrap and a bare spawn.

Each iteration runs, back to back: agentbox (``Sandbox.create()`` then
``commands.run(["true"])``, then ``kill()`` timed apart), plain bwrap with agentbox's
mount set running ``true``, ``subprocess.run(["true"])`` and, when podman is installed
(``scripts/install.sh --bench``), ``podman run --rm`` of ``true`` on the default
template's rootfs tree. Interleaving puts the same host noise on every column. A second, shorter pass wraps agentbox's internals to say where
the time goes.

The default-network rows are measured twice: cold (no warm sandbox: the create launches
one) and from a warm pool (a real ``agentbox serve`` on the bench's home with
``sandbox.warm_pool: 2`` keeps two default sandboxes ready; the SDK's create in this
process claims one in a database transaction and the gateway, woken by the claim, makes
the next). The pooled pass is paced, one create every ``POOL_PACE_S``, the way an agent
harness starts sandboxes as work arrives; a create that finds the pool empty is cold and
counts in the row as it is (the row says how many were served warm).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime
from baselines import PlainBwrap, Podman, bare_true, podman_path, template_rootfs
from common import BenchResult, Row, Stats, bench_home, now_ns, progress, ratio
from phases import CREATE_PHASES, NETWORK_PHASES, PhaseTimer

TARGET_MS = 20.0
TARGET_RATIO = 2.0
TARGET_NET_MS = 12.0  # issue 20.2: the default network (allowlist through the egress proxy)
BASELINE_IFNAME = "abbench0"  # not abh*: outside agentbox's rules and its sandboxes' names
POOL_SIZE = 2
POOL_PACE_S = 0.5  # one pooled create per 500 ms: the keeper refills once calls pause


def _create_and_run(home: Path) -> tuple[int, int, int, int]:
    """(create ns, first command ns, create->result ns, destroy ns) of one sandbox."""
    t0 = now_ns()
    sb = Sandbox.create(home=home, network="none")  # the baselines have no network either
    try:
        t1 = now_ns()
        result = sb.commands.run(["true"])
        t2 = now_ns()
    finally:
        t3 = now_ns()
        sb.kill()
        t4 = now_ns()
    if result.exit_code != 0:
        raise RuntimeError(f"`true` exited {result.exit_code} in a fresh sandbox")
    return t1 - t0, t2 - t1, t2 - t0, t4 - t3


def _create_networked_and_run(home: Path, pooled: list[bool] | None = None) -> tuple[int, int]:
    """(create->first result ns, destroy ns) of one sandbox with the default network;
    whether a warm pool served it goes to ``pooled`` (read outside the timings)."""
    t0 = now_ns()
    sb = Sandbox.create(home=home)
    try:
        result = sb.commands.run(["true"])
        elapsed = now_ns() - t0
    finally:
        if pooled is not None:
            pooled.append(sb.info().from_pool)
        t1 = now_ns()
        sb.kill()
        destroyed = now_ns() - t1
    if result.exit_code != 0:
        raise RuntimeError(f"`true` exited {result.exit_code} in a fresh networked sandbox")
    return elapsed, destroyed


def _network_rows(home: Path, plain: PlainBwrap, n: int, warmup: int) -> list[Row]:
    progress(f"1 create->first result, default network: {warmup} warm-up + {n} iterations")
    ours: list[int] = []
    kills: list[int] = []
    base: list[int] = []
    for i in range(warmup + n):
        o, k = _create_networked_and_run(home)
        b = plain.run_true_with_veth(BASELINE_IFNAME)
        if i >= warmup:
            ours.append(o)
            kills.append(k)
            base.append(b)
    return _net_rows(
        "agentbox: Sandbox.create() (default network: allowlist via the egress proxy), "
        "cold (no warm pool) -> commands.run(['true']) result",
        (ours, kills, base),
        "agentbox: sb.kill() with the default network (timed apart)",
        "baseline: plain bwrap in its own netns with a veth pair (ip + nsenter ip), runs `true`",
    )


def _net_rows(
    what: str, samples: tuple[list[int], list[int], list[int]], kill_what: str, base_what: str
) -> list[Row]:
    """A default-network create row judged on target 20.2, its kills and its baseline."""
    ours, kills, base = samples
    st_ours, st_base = Stats.of_ns(ours), Stats.of_ns(base)
    return [
        Row(
            "1",
            what,
            st_ours,
            ratio=f"{ratio(st_ours.p50, st_base.p50)} plain bwrap + veth (p50)",
            target=f"p50 <= {TARGET_NET_MS:g} ms and <= {TARGET_RATIO:g}x plain bwrap + veth",
            met=st_ours.p50 <= TARGET_NET_MS and st_ours.p50 <= TARGET_RATIO * st_base.p50,
        ),
        Row("1", kill_what, Stats.of_ns(kills)),
        Row("1", base_what, st_base, target="baseline"),
    ]


GATEWAY_CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: BENCH_OPERATOR_TOKEN}}
sandbox:
  warm_pool: {pool}
"""


@contextmanager
def pool_gateway(home: Path, pool: int) -> Iterator[None]:
    """``agentbox serve`` on ``home`` (embedded defaults: its pool's sandboxes are what a
    plain ``Sandbox.create()`` asks for) keeping ``pool`` warm sandboxes; returns once
    they are ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = home / "gateway-pool.yaml"
    config.write_text(GATEWAY_CONFIG.format(port=port, pool=pool))
    env = {**os.environ, "AGENTBOX_HOME": str(home), "BENCH_OPERATOR_TOKEN": secrets.token_hex(24)}
    agentbox = str(Path(sys.executable).parent / "agentbox")
    proc = subprocess.Popen([agentbox, "serve", "--config", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"agentbox serve exited {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    pass
                if _warm(home) >= pool:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError(f"the gateway did not fill its warm pool of {pool} in 120 s")
        yield
    finally:
        proc.terminate()
        proc.wait(60)


def _warm(home: Path) -> int:
    return sum(r.state == "pooled" for r in Runtime(home).store.list())


def _pooled_rows(home: Path, plain: PlainBwrap, n: int, warmup: int) -> list[Row]:
    progress(
        f"1 create->first result from a warm pool of {POOL_SIZE} (a gateway keeps it), "
        f"one create per {POOL_PACE_S * 1000:g} ms: {warmup} warm-up + {n} iterations"
    )
    ours: list[int] = []
    kills: list[int] = []
    base: list[int] = []
    pooled: list[bool] = []
    with pool_gateway(home, POOL_SIZE):
        for i in range(warmup + n):
            started = time.monotonic()
            elapsed, destroyed = _create_networked_and_run(home, pooled)
            b = plain.run_true_with_veth(BASELINE_IFNAME)
            if i >= warmup:
                ours.append(elapsed)
                kills.append(destroyed)
                base.append(b)
            time.sleep(max(0.0, POOL_PACE_S - (time.monotonic() - started)))
    warm = sum(pooled[warmup:])
    return _net_rows(
        f"agentbox: Sandbox.create() (default network) from a warm pool of {POOL_SIZE} "
        f"kept by `agentbox serve` -> commands.run(['true']) result; "
        f"{warm} of {n} served warm (one that found the pool empty counts as it ran)",
        (ours, kills, base),
        "agentbox: sb.kill() of a claimed sandbox (timed apart)",
        "baseline: plain bwrap in its own netns with a veth pair, runs `true` "
        "(same paced iterations)",
    )


PODMAN_WHAT = "baseline: podman run --rm --network=none --rootfs (default template's tree) true"


def _podman(home: Path) -> tuple[Podman | None, str]:
    """podman on the default template's tree (made by the first create), after one
    warm-up run; or None and why not."""
    path = podman_path()
    if path is None:
        return None, "podman is not installed here (scripts/install.sh --bench)"
    podman = Podman(path, template_rootfs(home))
    try:
        podman.run_true()
    except (OSError, RuntimeError) as e:
        return None, f"podman failed: {e}"[:120]
    return podman, ""


def run(quick: bool) -> BenchResult:
    n, warmup, n_phases = (40, 5, 20) if quick else (300, 15, 60)
    create: list[int] = []
    first: list[int] = []
    total: list[int] = []
    destroy: list[int] = []
    bwrap: list[int] = []
    bare: list[int] = []
    pods: list[int] = []
    with bench_home("create") as home:
        plain = PlainBwrap(home / "baseline", home / "lib")
        progress(f"1 create->first result: {warmup} warm-up + {n} measured iterations")
        podman: Podman | None = None
        why_not = ""
        for i in range(warmup + n):
            c, f, t, d = _create_and_run(home)
            if i == 0:  # the default template's tree exists now
                podman, why_not = _podman(home)
            b = plain.run_true()
            s = bare_true()
            pod = podman.run_true() if podman is not None else 0
            if i >= warmup:
                for samples, v in ((create, c), (first, f), (total, t), (destroy, d)):
                    samples.append(v)
                bwrap.append(b)
                bare.append(s)
                pods.append(pod)
        network_rows = _network_rows(home, plain, n // 2, warmup)
        network_rows += _pooled_rows(home, plain, n // 2, warmup)
        progress(f"1 create->first result: phase breakdown over {n_phases} iterations")
        timer = PhaseTimer(CREATE_PHASES)
        with timer.active():
            for _ in range(n_phases):
                _create_and_run(home)
        net_timer = network_breakdown(home, n_phases)

    st_total, st_bwrap, st_bare = Stats.of_ns(total), Stats.of_ns(bwrap), Stats.of_ns(bare)
    st_destroy = Stats.of_ns(destroy)
    met = st_total.p50 <= TARGET_MS and st_total.p50 <= TARGET_RATIO * st_bwrap.p50
    rows = [
        Row(
            "1",
            "agentbox: Sandbox.create(network=\"none\") -> commands.run(['true']) result",
            st_total,
            ratio=f"{ratio(st_total.p50, st_bwrap.p50)} plain bwrap, "
            f"{ratio(st_total.p50, st_bare.p50)} bare"
            + (f", {ratio(st_total.p50, Stats.of_ns(pods).p50)} podman run" if podman else "")
            + " (p50)",
            target=f"p50 <= {TARGET_MS:g} ms and <= {TARGET_RATIO:g}x plain bwrap",
            met=met,
        ),
        Row("1", "  of which Sandbox.create()", Stats.of_ns(create)),
        Row("1", "  of which first commands.run(['true'])", Stats.of_ns(first)),
        Row("1", "agentbox: sb.kill() (destroy, timed apart)", st_destroy),
        Row(
            "1",
            "baseline: plain bwrap, same mounts + seccomp, unprivileged uid, runs `true`",
            st_bwrap,
            target="baseline",
        ),
        Row("1", "baseline: bare subprocess.run(['true'])", st_bare, target="baseline"),
        Row("1", PODMAN_WHAT, Stats.of_ns(pods), target="baseline")
        if podman is not None
        else Row("1", PODMAN_WHAT, None, target="baseline", ratio=why_not),
        *network_rows,
    ]
    result = BenchResult(rows=rows)
    result.sections.append(
        (
            f"Row 1 breakdown: where create -> first result -> destroy goes "
            f"({n_phases} wrapped iterations, default template, default sizes)",
            timer.table(n_phases),
        )
    )
    result.sections.append(
        (
            f"Row 1 breakdown, default network: where a networked create goes "
            f"({n_phases} wrapped iterations)",
            net_timer.table(n_phases),
        )
    )
    return result


def network_breakdown(home: Path, n: int) -> PhaseTimer:
    """The phases of ``n`` creates with the default network (each run and destroyed)."""
    progress(f"1 create->first result, default network: phase breakdown over {n} iterations")
    timer = PhaseTimer(NETWORK_PHASES)
    with timer.active():
        for _ in range(n):
            _create_networked_and_run(home)
    return timer
