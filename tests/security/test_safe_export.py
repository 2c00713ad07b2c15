"""Safe export: a workspace download withholds (and reports) what the host would run or
trust, unless asked for everything; the rest arrives intact.

The git cases are built on the host with real git, each with a payload that creates a
marker file, uploaded into a sandbox and downloaded through the SDK (in-process), the
REST route and the SDK through the gateway. Each tar is extracted on the host and real git
run in every case (status, diff, add, commit, log -p, stdout a terminal so pagers run):
the download with ``include_unsafe`` runs every payload (the control: the cases are live),
the safe ones run none.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.export_safety import (
    content_reason,
    git_config_reason,
    host_name,
    vets_content,
    withhold_reason,
)
from gateway_harness import RunningGateway, running_gateway

GIT_ENV = {"PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "TERM": "xterm",
           "PAGER": "cat",  # no pager unless the tree's git config names one
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.test",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.test"}  # fmt: skip
GIT_COMMANDS = (["status"], ["diff"], ["add", "-A"], ["commit", "-qm", "x"], ["log", "-p"])


def git(cwd: Path, *args: str, home: Path, ceiling: Path | None = None) -> int:
    """Real git, its stdout a terminal (git only starts a pager for one), drained as it
    writes so that git never blocks on a full terminal."""
    env = {**GIT_ENV, "HOME": str(home)}
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    leader, follower = pty.openpty()
    drain = threading.Thread(target=_drain, args=(leader,), daemon=True)
    drain.start()
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              stdout=follower, stderr=subprocess.DEVNULL, timeout=60)  # fmt: skip
    finally:
        os.close(follower)
        drain.join(60)
    return done.returncode


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 1 << 16):
            pass
    except OSError:  # EIO: the terminal's other side is closed
        pass
    finally:
        os.close(fd)


Builder = Callable[[Path, str, Path], None]  # (case dir, payload command, git home)


def _repo(d: Path, home: Path) -> Path:
    """A repo with one commit and a modified tracked file (so diff drivers have work)."""
    d.mkdir(parents=True)
    assert git(d, "init", "-q", "--template=", "-b", "main", home=home) == 0
    (d / "a.txt").write_text("one\n")
    assert git(d, "add", "a.txt", home=home) == 0
    assert git(d, "commit", "-qm", "init", home=home) == 0
    (d / "a.txt").write_text("two\n")
    return d


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def _hook(hooks: Path, cmd: str) -> None:
    hooks.mkdir()
    (hooks / "pre-commit").write_text(f"#!/bin/sh\n{cmd}\n")
    (hooks / "pre-commit").chmod(0o755)


def case_hook(d: Path, cmd: str, home: Path) -> None:
    _hook(_repo(d, home) / ".git" / "hooks", cmd)


def case_hooks_symlink(d: Path, cmd: str, home: Path) -> None:
    _hook(_repo(d, home) / "myhooks", cmd)
    (d / ".git" / "hooks").symlink_to("../myhooks")


def case_gitfile(d: Path, cmd: str, home: Path) -> None:
    (_repo(d, home) / ".git").rename(d / "gd")
    (d / ".git").write_text("gitdir: gd\n")
    _append(d / "gd" / "config", f"[core]\n\tfsmonitor = {cmd}\n")


def case_git_symlink(d: Path, cmd: str, home: Path) -> None:
    (_repo(d, home) / ".git").rename(d / "gd")
    (d / ".git").symlink_to("gd")
    _append(d / "gd" / "config", f"[core]\n\tfsmonitor = {cmd}\n")


def case_commondir(d: Path, cmd: str, home: Path) -> None:
    gd = _repo(d, home) / ".git"
    (d / "cd").mkdir()
    for name in ("objects", "refs", "config"):
        (gd / name).rename(d / "cd" / name)
    (gd / "commondir").write_text("../cd\n")
    _append(d / "cd" / "config", f"[core]\n\tfsmonitor = {cmd}\n")


def case_worktree(d: Path, cmd: str, home: Path) -> None:
    """A linked worktree (its gitfile made relative, as an agent may): its own git dir
    under worktrees/ holds config.worktree."""
    main = _repo(d / "main", home)
    assert git(main, "worktree", "add", "-q", "../wt", home=home) == 0
    _append(main / ".git" / "config", "[core]\n\trepositoryformatversion = 1\n"
                                      "[extensions]\n\tworktreeConfig = true\n")  # fmt: skip
    (main / ".git/worktrees/wt/config.worktree").write_text(f"[core]\n\tfsmonitor = {cmd}\n")
    (d / "wt" / ".git").write_text("gitdir: ../main/.git/worktrees/wt\n")
    (d / "wt" / "a.txt").write_text("three\n")


def case_config_worktree(d: Path, cmd: str, home: Path) -> None:
    gd = _repo(d, home) / ".git"
    _append(gd / "config", "[core]\n\trepositoryformatversion = 1\n"
                           "[extensions]\n\tworktreeConfig = true\n")  # fmt: skip
    (gd / "config.worktree").write_text(f"[core]\n\tfsmonitor = {cmd}\n")


def case_bom(d: Path, cmd: str, home: Path) -> None:
    config = _repo(d, home) / ".git" / "config"
    config.write_bytes(b"\xef\xbb\xbf[core]\n\tfsmonitor = " + cmd.encode() + b"\n")


def case_pager(d: Path, cmd: str, home: Path) -> None:
    _append(_repo(d, home) / ".git" / "config", f"[pager]\n\tstatus = {cmd}\n")


def _driver(d: Path, home: Path, config: str, attribute: str) -> None:
    _append(_repo(d, home) / ".git" / "config", config)
    (d / ".gitattributes").write_text(f"a.txt {attribute}\n")


def case_diff_command(d: Path, cmd: str, home: Path) -> None:
    _driver(d, home, f'[diff "x"]\n\tcommand = {cmd}\n', "diff=x")


def case_textconv(d: Path, cmd: str, home: Path) -> None:
    _driver(d, home, f'[diff "x"]\n\ttextconv = {cmd}\n', "diff=x")


def case_filter_hash(d: Path, cmd: str, home: Path) -> None:
    _driver(d, home, f'[filter "a#b"]\n\tclean = {cmd}\n', "filter=a#b")


def case_include_if(d: Path, cmd: str, home: Path) -> None:
    _append(_repo(d, home) / ".git" / "config", '[includeIf "onbranch:main"]\n\tpath = ../x.cfg\n')
    (d / "x.cfg").write_text(f"[core]\n\tfsmonitor = {cmd}\n")


def case_config_symlink(d: Path, cmd: str, home: Path) -> None:
    config = _repo(d, home) / ".git" / "config"
    (d / "notes.cfg").write_text(config.read_text() + f"[core]\n\tfsmonitor = {cmd}\n")
    config.unlink()
    config.symlink_to("../notes.cfg")


def case_bare(d: Path, cmd: str, home: Path) -> None:
    """A bare repository under any name: git finds it by its shape (cwd inside it)."""
    _repo(d / "src", home)
    assert git(d, "clone", "-q", "--bare", "--template=", "src", "store", home=home) == 0
    _append(d / "store" / "config", f"[pager]\n\tlog = {cmd}\n")


# name: (builder, where git runs, the paths (in the case) the safe export withholds)
CASES: dict[str, tuple[Builder, str, set[str]]] = {
    "hook": (case_hook, ".", {".git/hooks"}),
    "hooks_symlink": (case_hooks_symlink, ".", {".git/hooks"}),
    "gitfile": (case_gitfile, ".", {"gd/config"}),
    "git_symlink": (case_git_symlink, ".", {".git", "gd/config"}),
    "common_dir": (case_commondir, ".", {"cd/config"}),
    "config_worktree": (case_config_worktree, ".", {".git/config.worktree"}),
    "worktree": (case_worktree, "wt", {"main/.git/worktrees/wt/config.worktree"}),
    "bom": (case_bom, ".", {".git/config"}),
    "pager": (case_pager, ".", {".git/config"}),
    "diff_command": (case_diff_command, ".", {".git/config"}),
    "textconv": (case_textconv, ".", {".git/config"}),
    "filter_hash": (case_filter_hash, ".", {".git/config"}),
    "include_if": (case_include_if, ".", {".git/config"}),
    "config_symlink": (case_config_symlink, ".", {".git/config"}),
    "bare": (case_bare, "store", {"store/config"}),
}

# Planted by the agent (setuid bits do not survive an upload) next to the git cases:
# host-trusted names (in other letter cases, and as symlinks to an in-tree directory),
# symlinks that leave the tree, and names that only Windows reads as paths.
PLANT = r"""
set -e
mkdir -p /workspace/cases/other && cd /workspace/cases/other
mkdir -p .cursor .gemini .devcontainer .hg .VSCode conf sub .Git/hooks .idea src/hooks
echo '{}' > .cursor/mcp.json; echo '{}' > .gemini/settings.json
echo '{}' > .devcontainer/devcontainer.json; printf '[hooks]\nupdate = x\n' > .hg/hgrc
echo 'script-shell=/x' > .npmrc; echo 'yarnPath: x.js' > .yarnrc.yml; echo 'x' > .envrc
echo '{}' > .VSCode/settings.json; echo x > .Git/hooks/pre-commit; echo x > .idea/w.xml
echo '{}' > conf/settings.json; ln -s conf .vscode; ln -s conf .Claude; ln -s conf hooks
echo x > src/hooks/useThing.ts; echo '{}' > sub/.mcp.json; echo x > .bashrc
echo x > tool; chmod 4755 tool
ln -s . m; ln -s m/m/../../../../../etc/passwd esc; ln -s /etc/passwd abs
ln -s ../../../../etc/shadow up; ln -s conf/settings.json ok; ln -s ../other/conf sub/ok
ln -s x/../../y sub/down-up; echo x > '.git\hooks\pre-commit'
mkdir -p .jj/repo; echo x > .jj/repo/config.toml; echo x > .Rprofile; echo x > .gdbinit
"""
OTHER_WITHHELD = {
    ".cursor", ".gemini", ".devcontainer", ".hg", ".npmrc", ".yarnrc.yml", ".envrc",
    ".VSCode", ".Git/hooks", ".idea", ".vscode", ".Claude", "hooks", "sub/.mcp.json",
    ".bashrc", "tool", "esc", "abs", "up", "sub/down-up", ".git\\hooks\\pre-commit",
    ".jj", ".Rprofile", ".gdbinit",
}  # fmt: skip
OTHER_KEPT = {"conf/settings.json", "src/hooks/useThing.ts", "ok", "sub/ok", "m"}


def _expected_withheld() -> set[str]:
    out = {f"cases/other/{p}" for p in OTHER_WITHHELD}
    for name, (_, _, paths) in CASES.items():
        out |= {f"cases/{name}/{p}" for p in paths}
    return out


@pytest.fixture(scope="module")
def markers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def box(
    agentbox_home: Path, host_ready: None, tmp_path_factory: pytest.TempPathFactory,
    markers: Path,
) -> Iterator[Sandbox]:  # fmt: skip
    built = tmp_path_factory.mktemp("built")
    home = tmp_path_factory.mktemp("githome")
    for name, (builder, _, _) in CASES.items():
        builder(built / "cases" / name, f"touch {markers / name}", home)
    upload = io.BytesIO()
    with tarfile.open(fileobj=upload, mode="w") as tar:
        tar.add(built / "cases", arcname="cases")
    upload.seek(0)
    sb = Sandbox.create(memory="128MiB", disk="64MiB", network="none", home=agentbox_home)
    try:
        sb.files.upload_tar("/workspace", upload)
        r = sb.commands.run(PLANT)
        assert r.exit_code == 0, r.stderr
        yield sb
    finally:
        sb.kill()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gw"), "20s") as running:
        yield running


def _extract(data: bytes, dest: Path) -> set[str]:
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = set(tar.getnames())
        tar.extractall(dest)  # what a person on the host does with it
    return names


def _fired(tree: Path, markers: Path, home: Path) -> set[str]:
    """Run real git in every case of an extracted tree; the cases whose payload ran."""
    for stale in markers.iterdir():
        stale.unlink()
    for name, (_, cwd, _) in CASES.items():
        for args in GIT_COMMANDS:
            git(tree / "cases" / name / cwd, *args, home=home, ceiling=tree)
    return {p.name for p in markers.iterdir()}


def _check_safe(data: bytes, withheld: set[str], tmp: Path, markers: Path) -> None:
    names = _extract(data, tmp / "tree")
    home = tmp / "home"
    home.mkdir()
    assert _fired(tmp / "tree", markers, home) == set()
    assert withheld == _expected_withheld(), withheld ^ _expected_withheld()
    assert not any(n == w or n.startswith(w + "/") for n in names for w in withheld)
    assert {f"cases/other/{p}" for p in OTHER_KEPT} <= names
    for link in (tmp / "tree").rglob("*"):
        if link.is_symlink():
            assert link.resolve().is_relative_to((tmp / "tree").resolve()), link
    # What was kept still works: the gitfile's repository, its history intact.
    log = subprocess.run(["git", "log", "--format=%s"], cwd=tmp / "tree/cases/gitfile",
                         env={**GIT_ENV, "HOME": str(home)}, capture_output=True, text=True)  # fmt: skip
    assert log.stdout.split() == ["x", "init"]


def test_unfiltered_download_runs_every_payload(
    box: Sandbox, markers: Path, tmp_path: Path
) -> None:
    """The control: every case is live, so the safe downloads below prove something."""
    buf = io.BytesIO()
    box.files.download_tar("/workspace/cases", buf, include_unsafe=True)
    _extract(buf.getvalue(), tmp_path / "tree")
    (tmp_path / "home").mkdir()
    assert _fired(tmp_path / "tree", markers, tmp_path / "home") == set(CASES)


def test_sdk_download_runs_nothing_on_the_host(box: Sandbox, markers: Path, tmp_path: Path) -> None:
    buf, withheld = io.BytesIO(), []
    box.files.download_tar("/workspace/cases", buf, withheld=withheld)
    reasons = dict(withheld)
    assert "fsmonitor" in reasons["cases/bom/.git/config"]
    assert "touch" not in json.dumps(withheld)  # reasons never quote a value
    _check_safe(buf.getvalue(), {p for p, _ in withheld}, tmp_path, markers)


def test_rest_download_runs_nothing_on_the_host(
    box: Sandbox, gw: RunningGateway, markers: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    with gw.operator() as client:
        r = client.get(f"/v1/sandboxes/{box.id}/files/download",
                       params={"path": "/workspace/cases"})  # fmt: skip
    assert r.status_code == 200, r.text
    report = json.loads(r.headers["x-agentbox-withheld"])
    _check_safe(r.content, {p for p, _ in report}, tmp_path, markers)
    # The SDK through the gateway reads the same header.
    monkeypatch.setenv("AGENTBOX_URL", gw.url)
    monkeypatch.setenv("AGENTBOX_TOKEN", gw.operator_token)
    buf, withheld = io.BytesIO(), []
    Sandbox.connect(box.id).files.download_tar("/workspace/cases", buf, withheld=withheld)
    assert withheld == [tuple(x) for x in report]
    assert _names(buf.getvalue()) == _names(r.content)


def test_a_long_withheld_list_is_capped_and_counted(
    box: Sandbox, gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent can plant thousands of withheld names: the header stays readable (below
    32 KiB) and says how many there were; the SDK reports the rest as one entry."""
    long = "d" * 200
    r = box.commands.run(f"for i in $(seq 400); do mkdir -p /workspace/many/{long}$i && "
                         f"echo x > /workspace/many/{long}$i/.envrc; done")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    with gw.operator() as client:
        r = client.get(f"/v1/sandboxes/{box.id}/files/download",
                       params={"path": "/workspace/many"})  # fmt: skip
    shown = json.loads(r.headers["x-agentbox-withheld"])
    assert len(r.headers["x-agentbox-withheld"]) <= 32 << 10 and 0 < len(shown) < 400
    assert r.headers["x-agentbox-withheld-count"] == "400"
    monkeypatch.setenv("AGENTBOX_URL", gw.url)
    monkeypatch.setenv("AGENTBOX_TOKEN", gw.operator_token)
    withheld: list[tuple[str, str]] = []
    Sandbox.connect(box.id).files.download_tar("/workspace/many", io.BytesIO(), withheld=withheld)
    assert withheld[:-1] == [tuple(x) for x in shown]
    assert withheld[-1] == (
        "",
        f"{400 - len(shown)} more entries were withheld (the list is capped)",
    )


def _names(data: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return set(tar.getnames())


def test_downloading_inside_a_git_dir_is_judged_like_the_tree(box: Sandbox) -> None:
    for path, arcname in (("/workspace/cases/hook/.git/hooks", "hooks"),
                          ("/workspace/cases/bom/.git/config", "config")):  # fmt: skip
        buf, withheld = io.BytesIO(), []
        box.files.download_tar(path, buf, withheld=withheld)
        assert [p for p, _ in withheld] == [arcname] and _names(buf.getvalue()) == set()


@pytest.mark.parametrize(
    ("config", "flagged"),
    [
        ("[core]\n\trepositoryformatversion = 0\n\tbare = false\n", False),
        (
            '[remote "origin"]\n\turl = https://example.test/x.git\n'
            '\tfetch = +refs/heads/*:refs/remotes/origin/*\n[branch "main"]\n\tremote = origin\n'
            "\tmerge = refs/heads/main\n[user]\n\tname = A B\n# [core]\n; hooksPath = x\n",
            False,
        ),
        ("\ufeff[core]\r\n\tbare = false\r\n", False),
        ("[core]\n\thooksPath = .githooks\n", True),
        ("[CORE]\n  SSHCommand = ssh -o ProxyCommand=evil\n", True),
        ('[credential "https://x.test"]\n\thelper = !sh -c evil\n', True),
        ('[filter "lfs"]\n\tprocess = evil\n', True),
        ("[include]\n\tpath = ../../elsewhere\n", True),
        ("\ufeff[core]\n\tfsmonitor = x\n", True),
        ('[filter "a#b"]\n\tclean = x\n', True),
        ("[core.x]\n\tbare = 1\n", True),  # legacy subsection syntax
        ('[remote "o"]\n\turl = "ext::sh -c x"\n', True),  # quoted
        ('[remote "o"]\n\turl = ext::sh -c x\n', True),
        ('[remote "o"]\n\turl = ssh://-oProxyCommand=x/y\n', True),
        ('[remote "o"]\n\tuploadpack = x\n', True),
        ("[core]\n\tbare = false \\\n\n", True),  # a continuation line
        ("[core] bare = false\n", True),  # key on the header's line
        ("bare = false\n", True),  # no section
        ("[core]\n\tbare = false\0\n", True),
        ('[submodule "s"]\n\tupdate = !sh -c x\n', True),
    ],
)
def test_git_config_allowlist(config: str, flagged: bool) -> None:
    assert (git_config_reason(config.encode()) is not None) is flagged


def test_names_as_a_case_insensitive_host_sees_them() -> None:
    assert {host_name(n) for n in (".Git", ".git.", ".g\u200cit", ".git::$DATA")} == {".git"}
    reg, link = 0o100644, 0o120777
    assert withhold_reason("a/b/.ENVRC", reg) is not None
    assert withhold_reason("a/.VScode/x/y.json", reg) is not None
    assert withhold_reason("a/not.vscode/y.json", reg) is None
    assert withhold_reason("./.git/hooks", 0o40755, in_git_dir=True) is not None
    assert withhold_reason("./src/hooks", 0o40755) is None  # not in a git directory
    assert withhold_reason("./.git/rebase-merge", 0o40755, in_git_dir=True) is not None
    assert withhold_reason("p/.GIT", link, "gd") is not None
    assert withhold_reason("p/x/Hooks", link, "../h") is not None
    assert withhold_reason("p/gd/config", link, "../c", in_git_dir=True) is not None
    assert withhold_reason("p/notgit/config", link, "../c") is None
    assert withhold_reason("p/.git\\hooks\\pre-commit", reg) is not None
    assert withhold_reason("p/GIT~1", 0o40755) is not None
    assert withhold_reason("p/VSCODE~2", 0o40755) is not None


@pytest.mark.parametrize(
    ("arcname", "target", "leaves"),
    [
        ("./link", "../x", True),
        ("./link", "x/../y", True),  # x may be a symlink: a .. after a name is not judged
        ("p/m", ".", False),
        ("p/esc", "m/m/../../etc/passwd", True),
        ("p/a/b/l", "../../c", False),
        ("p/a/b/l", "../../../c", True),
        ("p/l", "c:/x", True),
        ("p/l", "..\\..\\x", True),
        ("p/l", ".../x", True),
        ("l", "x", True),  # a lone link: any target is outside what was downloaded
    ],
)
def test_symlinks_judged_component_by_component(arcname: str, target: str, leaves: bool) -> None:
    assert (withhold_reason(arcname, 0o120777, target) is not None) is leaves


@pytest.mark.parametrize(
    ("arcname", "content", "withheld"),
    [
        ("p/.git", b"gitdir: gd\n", False),
        ("p/sub/.GIT", b"gitdir: ../.git/modules/sub\n", False),
        ("p/.git", b"gitdir: /home/someone/repo/.git\n", True),
        ("p/.git", b"gitdir: ../elsewhere\n", True),
        ("p/a/b/.git", b"gitdir: ../../..\0", True),  # git stops at the NUL: 3 levels up
        ("p/.git", b"gitdir: gd\n[core]\n", True),
        ("p/wt/commondir", b"../cd\n", False),
        ("p/wt/commondir", b"/srv/other.git\n", True),
        ("p/wt/commondir", b"x/../../..\n", True),
        ("p/.git/config", b"[core]\n\tbare = false\n", False),
        ("p/.git/config.worktree", b"[core]\n\tfsmonitor = x\n", True),
        ("p/.git/config", b"[core]\n\tbare = false\n" + b"#" * (1 << 20), True),
    ],
)
def test_vetted_git_files(arcname: str, content: bytes, withheld: bool) -> None:
    assert vets_content(arcname, in_git_dir=True)
    assert (content_reason(arcname, content) is not None) is withheld


def test_include_unsafe_gives_everything(box: Sandbox) -> None:
    buf, withheld = io.BytesIO(), []
    box.files.download_tar("/workspace/cases", buf, include_unsafe=True, withheld=withheld)
    assert withheld == [] and _names(buf.getvalue()) >= _expected_withheld()
