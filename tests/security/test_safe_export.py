"""Safe export: a workspace download withholds (and reports) what the host would run or
trust, unless asked for everything; the rest arrives intact."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.export_safety import git_config_reason, withhold_reason

PLANT = r"""
set -e
cd /workspace && mkdir -p proj/.git/hooks proj/.vscode proj/.idea proj/.claude proj/.codex proj/src
cd proj
echo 'print(1)' > src/main.py
echo '#!/bin/sh' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
echo 'sample' > .git/hooks/pre-commit.sample
printf '[core]\n\trepositoryformatversion = 0\n' > .git/HEAD-config-ok
printf '[core]\n\tfsmonitor = /tmp/x\n' > .git/config
echo '{}' > .vscode/settings.json; echo x > .idea/workspace.xml
echo '{}' > .claude/settings.json; echo x > .codex/config.toml
echo '{}' > .mcp.json; echo 'export A=1' > .envrc; echo 'alias ls=rm' > .bashrc
echo x > tool; chmod 4755 tool
ln -s /etc/passwd abs-link; ln -s ../../etc/shadow rel-out; ln -s src/main.py rel-in
"""

EXPECTED_WITHHELD = {
    "proj/.git/hooks/pre-commit", "proj/.git/config", "proj/.vscode", "proj/.idea",
    "proj/.claude", "proj/.codex", "proj/.mcp.json", "proj/.envrc", "proj/.bashrc",
    "proj/tool", "proj/abs-link", "proj/rel-out",
}  # fmt: skip


@pytest.fixture(scope="module")
def box(agentbox_home: Path, host_ready: None) -> Iterator[Sandbox]:
    sb = Sandbox.create(memory="128MiB", disk="64MiB", network="none", home=agentbox_home)
    try:
        r = sb.commands.run(PLANT)
        assert r.exit_code == 0, r.stderr
        yield sb
    finally:
        sb.kill()


def _names(data: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return set(tar.getnames())


def test_download_withholds_and_reports_what_the_host_would_run(box: Sandbox) -> None:
    buf, withheld = io.BytesIO(), []
    box.files.download_tar("/workspace/proj", buf, withheld=withheld)
    names = _names(buf.getvalue())
    reported = {path for path, _ in withheld}
    assert reported == EXPECTED_WITHHELD, reported ^ EXPECTED_WITHHELD
    assert not any(n == w or n.startswith(w + "/") for n in names for w in EXPECTED_WITHHELD)
    assert {"proj/src/main.py", "proj/rel-in", "proj/.git/hooks/pre-commit.sample",
            "proj/.git/HEAD-config-ok"} <= names  # fmt: skip
    reasons = dict(withheld)
    assert (
        "fsmonitor" in reasons["proj/.git/config"] and "/tmp/x" not in reasons["proj/.git/config"]
    )
    assert "setuid" in reasons["proj/tool"] and "leaving the tree" in reasons["proj/rel-out"]


def test_include_unsafe_gives_everything(box: Sandbox) -> None:
    buf, withheld = io.BytesIO(), []
    box.files.download_tar("/workspace/proj", buf, include_unsafe=True, withheld=withheld)
    names = _names(buf.getvalue())
    assert withheld == [] and names >= EXPECTED_WITHHELD


@pytest.mark.parametrize(
    ("config", "flagged"),
    [
        ("[core]\n\trepositoryformatversion = 0\n\tbare = false\n", False),
        ('[remote "origin"]\n\turl = https://example.test/x.git\n', False),
        ("[core]\n\thooksPath = .githooks\n", True),
        ("[CORE]\n  SSHCommand = ssh -o ProxyCommand=evil\n", True),
        ('[credential "https://x.test"]\n\thelper = !sh -c evil\n', True),
        ('[filter "lfs"]\n\tprocess = evil\n', True),
        ("[include]\n\tpath = ../../elsewhere\n", True),
        ("# [core]\n# hooksPath = x\n", False),
    ],
)
def test_git_config_keys_that_run_programs(config: str, flagged: bool) -> None:
    assert (git_config_reason(config.encode()) is not None) is flagged


def test_names_anywhere_in_the_tree() -> None:
    reg = 0o100644
    assert withhold_reason("a/b/.envrc", reg) is not None
    assert withhold_reason("a/.vscode/x/y.json", reg) is not None
    assert withhold_reason("a/not.vscode/y.json", reg) is None
    assert withhold_reason("./.git/hooks/post-checkout", reg) is not None
    assert withhold_reason("./link", 0o120777, "../x") is not None
    assert withhold_reason("./link", 0o120777, "x/../y") is None
