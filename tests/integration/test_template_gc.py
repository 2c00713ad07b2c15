"""Template collection never takes the root of a sandbox: a tree stays while a sandbox
record (running, stopped, a fork's source) or a snapshot refers to its digest, and goes
with the last of them. Covers a new default (the host's CA bundle changed), a re-import
of a name in use, and `agentbox template rm` of a name in use (from another process)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime, pool_key
from agentbox.runtime.spec_input import spec_from
from agentbox.runtime.templates import TemplateStore
from agentbox.runtime.templates import default as template_default
from agentbox.runtime.warmpool import Pool, PoolKeeper
from imagekit import docker_save, static_binary

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
# Prints /etc/which: a binary and a file, both from the template's tree.
WHICH_C = r"""
#include <stdio.h>
int main(void) {
    FILE *f = fopen("/etc/which", "r");
    int c;
    if (!f) { perror("/etc/which"); return 1; }
    while ((c = fgetc(f)) != EOF) putchar(c);
    return 0;
}
"""


@pytest.fixture
def made(agentbox_home: Path, runtime: Runtime) -> Iterator[list[Sandbox]]:
    sandboxes: list[Sandbox] = []
    yield sandboxes
    for sb in sandboxes:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


@pytest.fixture
def images(tmp_path: Path) -> tuple[Path, Path]:
    """Two images with the same binary and different /etc/which: one\\n, two\\n."""
    binary = static_binary(tmp_path, "which", WHICH_C)
    return tuple(  # type: ignore[return-value]
        docker_save(
            tmp_path / f"{word}.tar",
            {"bin/which": (binary, 0o755), "etc/which": (f"{word}\n".encode(), 0o644)},
        )
        for word in ("one", "two")
    )


def new(made: list[Sandbox], home: Path, template: str = "default") -> Sandbox:
    sb = Sandbox.create(template, memory="128MiB", disk="64MiB", network="none", home=home)
    made.append(sb)
    return sb


def test_a_new_default_leaves_running_sandboxes_their_root(
    made: list[Sandbox], agentbox_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TemplateStore(agentbox_home)
    # The default is made from host files, the CA bundle among them: a copy of it with a
    # line of our own gives a default digest no other test's snapshot or sandbox uses.
    real = template_default._CA_BUNDLE.read_bytes()
    bundle = tmp_path / "ca-certificates.crt"
    bundle.write_bytes(real + b"# installed\n")
    monkeypatch.setattr(template_default, "_CA_BUNDLE", bundle)
    old = new(made, agentbox_home)
    old_digest = old.info().template_digest
    old_tree = store.exact("default", old_digest).rootfs
    shell = old.shell()
    assert shell.run("cd /etc && export MARK=kept").exit_code == 0
    sleeper = old.commands.start(["sleep", "600"])

    # The host's CA bundle changes (an upgrade of ca-certificates): a new default digest.
    rotated = tmp_path / "rotated.crt"
    rotated.write_bytes(real + b"# rotated by the test\n")
    monkeypatch.setattr(template_default, "_CA_BUNDLE", rotated)
    fresh = new(made, agentbox_home)
    assert fresh.info().template_digest != old_digest
    assert fresh.commands.run("tail -n 1 /etc/ssl/certs/ca-certificates.crt").stdout == (
        "# rotated by the test\n"
    )

    # The old sandbox keeps its whole root: commands, /usr/bin/env, its shell, its processes.
    assert old_tree.is_dir()
    r = old.commands.run("ls / && /usr/bin/env true && cat /etc/hostname")
    assert r.exit_code == 0 and "etc" in r.stdout.split() and r.stdout.endswith("\nagentbox\n")
    assert old.files.read_bytes("/usr/bin/env")[:4] == b"\x7fELF"
    tail = old.commands.run("tail -n 1 /etc/ssl/certs/*.crt")
    assert tail.ok and tail.stdout.strip() and "rotated" not in tail.stdout, tail
    assert shell.run("echo $MARK $PWD").stdout == "kept /etc\n"
    assert sleeper.info().running

    # A fork made now is on the digest its source was made from, not the new default.
    fork = old.fork()
    made.append(fork)
    assert fork.info().template_digest == old_digest
    assert fork.commands.run("ls /etc/passwd").exit_code == 0

    old.kill()
    assert old_tree.is_dir()  # the fork still runs on it
    fork.kill()
    assert not old_tree.exists()  # its last user went: collected
    assert store.exact("default", fresh.info().template_digest).rootfs.is_dir()


def test_reimporting_a_name_in_use_keeps_the_tree_for_sandboxes_forks_and_snapshots(
    made: list[Sandbox], agentbox_home: Path, images: tuple[Path, Path]
) -> None:
    store = TemplateStore(agentbox_home)  # another instance, as the CLI would have
    first = store.import_image("gc-reimport", images[0])
    sb = new(made, agentbox_home, "gc-reimport")
    sb.files.write("/workspace/note", "kept")
    snap = sb.snapshot()

    second = store.import_image("gc-reimport", images[1])  # the name now means "two"
    assert second.digest != first.digest and first.rootfs.is_dir()
    assert sb.commands.run(["/bin/which"]).stdout == "one\n"
    fresh = new(made, agentbox_home, "gc-reimport")
    assert fresh.commands.run(["/bin/which"]).stdout == "two\n"
    fork = sb.fork()
    made.append(fork)
    assert fork.info().template_digest == first.digest
    assert fork.commands.run(["/bin/which"]).stdout == "one\n"

    sb.kill()
    fork.kill()
    assert first.rootfs.is_dir()  # the snapshot restores onto it
    restored = Sandbox.restore(snap.id, home=agentbox_home)
    made.append(restored)
    assert restored.info().template_digest == first.digest
    assert restored.commands.run(["/bin/which"]).stdout == "one\n"
    assert restored.files.read("/workspace/note") == "kept"
    restored.kill()
    assert first.rootfs.is_dir()
    Sandbox.delete_snapshot(snap.id, home=agentbox_home)
    assert not first.rootfs.exists()  # no sandbox, no snapshot, no name: collected
    assert second.rootfs.is_dir()
    fresh.kill()
    store.remove("gc-reimport")
    assert not second.rootfs.exists()


def test_template_rm_of_a_name_in_use_keeps_it_for_its_stopped_sandbox(
    made: list[Sandbox], agentbox_home: Path, images: tuple[Path, Path]
) -> None:
    tree = TemplateStore(agentbox_home).import_image("gc-rm", images[0]).rootfs
    sb = new(made, agentbox_home, "gc-rm")
    sb.stop()  # its overlay stays mounted, its processes end
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    rm = subprocess.run([AGENTBOX, "template", "rm", "gc-rm"], env=env, capture_output=True,
                        text=True, check=False)  # fmt: skip
    assert rm.returncode == 0, rm.stderr
    assert tree.is_dir()
    sb.resume()  # starts again on the digest it was made from, though the name is gone
    assert sb.commands.run(["/bin/which"]).stdout == "one\n"
    sb.kill()
    assert not tree.exists()


def test_a_warm_sandbox_keeps_its_tree_until_the_keeper_replaces_it(
    runtime: Runtime, agentbox_home: Path, images: tuple[Path, Path]
) -> None:
    store = TemplateStore(agentbox_home)
    first = store.import_image("gc-pool", images[0])
    spec = spec_from({"template": "gc-pool", "memory": "64MiB", "disk": "32MiB",
                      "network": "none", "idle_timeout": 0})  # fmt: skip
    keeper = PoolKeeper(runtime, [Pool(spec, 1)])
    try:
        assert keeper.refill_once(keeper.pools[0])
        (warm,) = runtime.store.pooled(pool_key(spec))
        store.import_image("gc-pool", images[1])
        assert first.rootfs.is_dir()  # a pooled sandbox overlays it
        assert keeper.refill_once(keeper.pools[0])  # stale: replaced
        assert runtime.store.get(warm.id) is None
        assert not first.rootfs.exists()
        claimed = runtime.create(spec)
        assert runtime.commands(claimed.id).run(["/bin/which"]).stdout == "two\n"
        runtime.destroy(claimed.id)
    finally:
        for record in runtime.store.pooled(pool_key(spec)):
            runtime.recycle(record.id)
        store.remove("gc-pool")
