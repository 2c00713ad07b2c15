"""The file policy judges the path a file tool will act on, not the text it was given.

A token that may only use the file tools (no shell) tries to write protected paths
(``.git/hooks/**``, ``.git/config``, ``.mcp.json`` in the test policy) by every route
that hides the protected name from a lexical check: symlinks uploaded by tar (to a
directory, to a file, written through by a later entry of the same upload), symlinks and
hard links planted by the sandbox's shell, a nested repository's ``.git`` at depth, other
letter cases, ``..`` spellings, moves into and out of protected places, edits and mkdirs
through links, and a symlink flipped between a harmless and a protected directory while
the gateway writes through it. Each is refused with ``policy_denied`` naming the rule, over
REST and over MCP, and the protected files are unchanged afterwards; ordinary writes
through ordinary symlinks still work.
"""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from agentbox import Sandbox
from agentbox.errors import InvalidRequest
from agentbox.policy.tool_policy import FilePolicy
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, mcp_client, running_gateway

HOOKS = "tools.fs.write.protected: .git/hooks/**"
CONFIG = "tools.fs.write.protected: .git/config"
MCP_JSON = "tools.fs.write.protected: .mcp.json"
FS_ONLY = ["fs_read", "fs_write"]
FILE_TOOLS = [*FS_ONLY, "fs_edit", "fs_move", "fs_remove", "fs_mkdir", "fs_list", "fs_stat"]

# What the sandbox's own shell set up: a repository, a nested one, and links planted with
# ln (which no file tool judged). The file tools must not change any protected file.
PLANT = r"""
set -e
cd /workspace
mkdir -p .git/hooks r/.git/hooks docs sub
echo original-config > .git/config
echo original-hook > .git/hooks/pre-commit
echo original-mcp > .mcp.json
echo original-nested > r/.git/hooks/pre-commit
echo doc > docs/readme.txt
ln -s ../.git/config sub/shell-cfg
ln -s /workspace/.git/config sub/abs-cfg
ln -s ../.git/hooks sub/shell-hooks
ln -s ../docs sub/docs
ln .git/config hardlinked-config
ln -s /etc/hostname sub/outside
ln -s /etc sub/etc
ln -s /proc/1/root/workspace/.git/config sub/magic
ln -s /proc/self/cwd/.git/config sub/magic-cwd
ln -s /proc/1/cwd sub/magic-dir
ln -s /tmp sub/tmp
echo outside > /tmp/outside.txt
"""
PROTECTED_FILES = {
    "/workspace/.git/config": "original-config\n",
    "/workspace/.git/hooks/pre-commit": "original-hook\n",
    "/workspace/.mcp.json": "original-mcp\n",
    "/workspace/r/.git/hooks/pre-commit": "original-nested\n",
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("fpol")) as running:
        yield running


@pytest.fixture(scope="module")
def box(gw: RunningGateway, agentbox_home: Path) -> Iterator[Sandbox]:
    sb = Sandbox.create(memory="256MiB", disk="128MiB", network="none", home=agentbox_home)
    try:
        shell(sb, PLANT)
        yield sb
    finally:
        sb.kill()


def shell(sb: Sandbox, command: str) -> str:
    r = sb.commands.run(command)
    assert r.exit_code == 0, f"{command}: {r.stderr}"
    return r.stdout


@pytest.fixture
def unchanged(box: Sandbox) -> Iterator[None]:
    """After the test, every protected file holds what the shell wrote, and nothing new
    appeared in a hooks directory."""
    yield
    for path, content in PROTECTED_FILES.items():
        assert shell(box, f"cat {path}") == content, f"{path} was changed"
    hooks = shell(box, "ls -A /workspace/.git/hooks /workspace/r/.git/hooks")
    assert hooks.split() == [
        "/workspace/.git/hooks:", "pre-commit", "/workspace/r/.git/hooks:", "pre-commit",
    ], hooks  # fmt: skip


def token(gw: RunningGateway, sandbox: str, tools: list[str]) -> str:
    with gw.operator() as op:
        r = op.post("/v1/tokens", json={"sandbox": sandbox, "tools": tools})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


@pytest.fixture(scope="module")
def fs_only(gw: RunningGateway, box: Sandbox) -> Iterator[httpx2.Client]:
    with gw.client(token(gw, box.id, FS_ONLY)) as c:
        yield c


@pytest.fixture(scope="module")
def files(gw: RunningGateway, box: Sandbox) -> Iterator[httpx2.Client]:
    with gw.client(token(gw, box.id, FILE_TOOLS)) as c:
        yield c


def assert_denied(r: httpx2.Response, rule: str, resolved: str | None = None) -> None:
    """Refused with the typed error naming the rule (and, if given, the resolved path that
    was judged: then the refusal came from the file layer, not the requested text)."""
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "policy_denied", error
    assert error["details"]["rule"] == rule, error
    if resolved is not None:
        assert error["details"]["path"] == resolved, error


def write(c: httpx2.Client, box: Sandbox, path: str, content: str = "pwned\n") -> httpx2.Response:
    return c.put(f"/v1/sandboxes/{box.id}/files", json={"path": path, "content": content})


def tar_of(*entries: tuple[str, str, str]) -> bytes:
    """(name, "file"|"symlink"|"hardlink", content or link target) entries, as given."""
    kinds = {"file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.type = kinds[kind]
            info.mode = 0o755
            if kind == "file":
                info.size = len(payload.encode())
                tar.addfile(info, io.BytesIO(payload.encode()))
            else:
                info.linkname = payload
                tar.addfile(info)
    return buf.getvalue()


def upload(c: httpx2.Client, box: Sandbox, data: bytes, dest: str = "/workspace") -> Any:
    return c.post(f"/v1/sandboxes/{box.id}/files/upload", params={"dest": dest}, content=data)


# -- the reported attack: upload symlinks, then write through them -------------------------


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("link", "target", "rule", "resolved"),
    [
        ("up/cfg", "../.git/config", CONFIG, ".git/config"),
        ("up/mcp", "../.mcp.json", MCP_JSON, ".mcp.json"),
        ("up/hooks", "../.git/hooks", HOOKS, ".git/hooks"),
        ("up/hook", "/workspace/.git/hooks/pre-commit", HOOKS, ".git/hooks/pre-commit"),
        # does not exist yet
        ("up/nested", "../r/.git/hooks/post-checkout", HOOKS, "r/.git/hooks/post-checkout"),
        ("up/chain", "../sub/shell-cfg", CONFIG, ".git/config"),  # through the shell's link
        ("up/dots", "../docs/../.git/./config", CONFIG, ".git/config"),
        ("up/case", "../.Mcp.json", MCP_JSON, ".Mcp.json"),
    ],
)
def test_upload_of_a_symlink_to_a_protected_path_is_refused(
    fs_only: httpx2.Client, box: Sandbox, link: str, target: str, rule: str, resolved: str
) -> None:
    r = upload(fs_only, box, tar_of((link, "symlink", target)))
    assert_denied(r, rule, f"/workspace/{resolved}")
    assert shell(box, f"test ! -L /workspace/{link} && echo absent") == "absent\n"


@pytest.mark.usefixtures("unchanged")
def test_writes_through_an_uploaded_directory_symlink_are_judged_where_they_land(
    fs_only: httpx2.Client, box: Sandbox
) -> None:
    # A link to the repository itself is fine: what matters is where a write lands.
    r = upload(fs_only, box, tar_of(("up2/gitdir", "symlink", "../.git")))
    assert r.status_code == 200, r.text
    assert_denied(write(fs_only, box, "up2/gitdir/config"), CONFIG)
    assert_denied(write(fs_only, box, "up2/gitdir/hooks/pre-commit"), HOOKS)
    assert_denied(write(fs_only, box, "up2/gitdir/hooks/new/deeper"), HOOKS)
    assert_denied(write(fs_only, box, "up2/../up2/gitdir/HOOKS/pre-commit"), HOOKS)
    assert shell(box, "test ! -e /workspace/.git/hooks/new && echo absent") == "absent\n"
    ok = write(fs_only, box, "up2/gitdir/description", "a repo\n")  # not protected
    assert ok.status_code == 200, ok.text


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("entries", "rule", "resolved"),
    [
        # an entry written through a symlink an earlier entry of the same upload made
        ((("up3/g", "symlink", "../.git"), ("up3/g/hooks/post-merge", "file", "x")), HOOKS,
         ".git/hooks/post-merge"),
        ((("up4/s", "symlink", "../.git"), ("up4/s/config", "file", "x")), CONFIG,
         ".git/config"),
        # through the shell's links, and protected names at depth and in other cases
        ((("sub/shell-hooks/pre-commit", "file", "x"),), HOOKS, ".git/hooks/pre-commit"),
        ((("r/.git/hooks/pre-commit", "file", "x"),), HOOKS, "r/.git/hooks/pre-commit"),
        ((("R2/.GIT/Hooks/pre-push", "file", "x"),), HOOKS, "R2/.GIT/Hooks"),  # its new dir
        ((("pkg/.Mcp.json", "file", "x"),), MCP_JSON, "pkg/.Mcp.json"),
        # a hard link is a second name for the protected file itself
        ((("hl", "hardlink", ".git/config"),), CONFIG, ".git/config"),
        # a hard link to a symlink is that symlink again: judged at its target
        ((("hl2", "hardlink", "sub/abs-cfg"),), CONFIG, ".git/config"),
        # replacing a protected file by a symlink is a write of it
        (((".mcp.json", "symlink", "docs/readme.txt"),), MCP_JSON, ".mcp.json"),
        # a hard link to a file outside the write root would make it writable
        ((("hl3", "hardlink", "sub/tmp/outside.txt"),), "tools.fs.write.root: /workspace",
         "/tmp/outside.txt"),
    ],
)  # fmt: skip
def test_upload_entries_are_judged_where_they_resolve(
    fs_only: httpx2.Client,
    box: Sandbox,
    entries: tuple[tuple[str, str, str], ...],
    rule: str,
    resolved: str,
) -> None:
    resolved = resolved if resolved.startswith("/") else f"/workspace/{resolved}"
    assert_denied(upload(fs_only, box, tar_of(*entries)), rule, resolved)


@pytest.mark.usefixtures("unchanged")
def test_upload_dest_through_a_symlink_is_judged(fs_only: httpx2.Client, box: Sandbox) -> None:
    r = upload(
        fs_only, box, tar_of(("post-commit", "file", "x")), dest="/workspace/sub/shell-hooks"
    )
    assert_denied(r, HOOKS, "/workspace/.git/hooks/post-commit")


# -- every file tool, judged at the resolved path ------------------------------------------


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("sub/shell-cfg", CONFIG),  # a final symlink: judged at its target
        ("sub/shell-hooks/pre-commit", HOOKS),  # a directory symlink on the way
        ("/workspace/sub/shell-hooks/post-checkout", HOOKS),
        ("sub/docs/../shell-cfg", CONFIG),
        ("r/.git/hooks/pre-commit", HOOKS),  # a nested repository
        ("a/b/c/.git/hooks/pre-commit", HOOKS),
        (".GIT/hooks/pre-commit", HOOKS),
        ("R/.Git/HOOKS/x", HOOKS),
        (".Mcp.json", MCP_JSON),
        ("docs/.MCP.JSON", MCP_JSON),
        ("sub/../.git/./hooks//pre-commit", HOOKS),
        ("/workspace/docs/../.git/config", CONFIG),
        ("sub/tmp/outside.txt", "tools.fs.write.root: /workspace"),  # out of the root
    ],
)
def test_fs_write_is_judged_at_the_resolved_path(
    fs_only: httpx2.Client, box: Sandbox, path: str, rule: str
) -> None:
    assert_denied(write(fs_only, box, path), rule)


@pytest.mark.usefixtures("unchanged")
@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize("path", ["sub/magic", "sub/magic-cwd", "sub/magic-dir/x"])
def test_magic_links_are_never_followed(
    fs_only: httpx2.Client, box: Sandbox, agentbox_home: Path, path: str
) -> None:
    """/proc links are refused (ELOOP) by the kernel's walk and by the policy's walk alike:
    neither follows one to the object it names, nor by its text."""
    r = write(fs_only, box, path)
    assert r.status_code == 400 and r.json()["error"]["details"]["errno"] == "ELOOP", r.text
    judged: list[str] = []
    with pytest.raises(InvalidRequest, match="magic link"):
        Runtime(agentbox_home).files(box.id).write(
            path, b"x", guard=lambda p, _access: judged.append(p)
        )
    assert judged == []


def test_other_file_tools_are_judged_at_the_resolved_path(
    files: httpx2.Client, box: Sandbox
) -> None:
    url = f"/v1/sandboxes/{box.id}/files"
    shell(box, "echo movable > /workspace/movable.txt")
    edit = {"old": "original", "new": "pwned"}
    assert_denied(files.post(f"{url}/edit", json={"path": "sub/shell-cfg", **edit}), CONFIG)
    assert_denied(
        files.post(f"{url}/edit", json={"path": "sub/shell-hooks/pre-commit", **edit}), HOOKS
    )
    body = {"path": "movable.txt", "destination": "sub/shell-hooks/pre-push"}
    assert_denied(files.post(f"{url}/move", json=body), HOOKS)
    body = {"path": "movable.txt", "destination": "r/.GIT/hooks/pre-commit", "overwrite": True}
    assert_denied(files.post(f"{url}/move", json=body), HOOKS)
    body = {"path": "sub/shell-hooks/pre-commit", "destination": "stolen"}  # the source end
    assert_denied(files.post(f"{url}/move", json=body), HOOKS)
    # A relative symlink moved leads somewhere else: lvl/h -> ../hooks/pre-commit is
    # harmless in lvl/, but in .git/info/ it leads into .git/hooks. Judged at its new target.
    shell(box, "mkdir -p /workspace/lvl /workspace/.git/info")
    shell(box, "ln -s ../hooks/pre-commit /workspace/lvl/h")
    body = {"path": "lvl/h", "destination": ".git/info/h"}
    r = files.post(f"{url}/move", json=body)
    assert_denied(r, HOOKS, "/workspace/.git/hooks/pre-commit")
    assert_denied(files.post(f"{url}/remove", json={"path": "sub/shell-hooks/pre-commit"}), HOOKS)
    assert_denied(files.post(f"{url}/mkdir", json={"path": "sub/shell-hooks/newdir"}), HOOKS)
    assert_denied(files.post(f"{url}/mkdir", json={"path": "sub/shell-hooks/a/b"}), HOOKS)
    assert shell(box, "cat /workspace/movable.txt") == "movable\n"


def test_a_symlink_flipped_during_writes_never_redirects_one(
    fs_only: httpx2.Client, box: Sandbox
) -> None:
    """The check and the write use one resolution: a link the shell flips (atomically, by
    rename) between docs/ and .git/hooks while the gateway writes through it lands every
    write in docs/ or refuses it, never in hooks/."""
    shell(box, "mkdir -p /workspace/flip && ln -sfn ../docs /workspace/flip/d")
    flipper = box.commands.start(
        "cd /workspace/flip && while :; do ln -sfn ../.git/hooks t1 && mv -T t1 d; "
        "ln -sfn ../docs t2 && mv -T t2 d; done"
    )
    outcomes = {"written": 0, "denied": 0}
    try:
        # Until both outcomes were seen often (the flipper is flipping), or give up.
        for i in range(3000):
            r = write(fs_only, box, f"flip/d/flipped-{i}", "x")
            if r.status_code == 200:
                outcomes["written"] += 1
            else:
                assert_denied(r, HOOKS)
                outcomes["denied"] += 1
            if min(outcomes.values()) >= 25:
                break
    finally:
        flipper.kill()
    hooks = shell(box, "ls -A /workspace/.git/hooks")
    assert "flipped" not in hooks, hooks
    assert min(outcomes.values()) >= 25, f"the link did not flip during the writes: {outcomes}"
    shell(box, "rm -rf /workspace/flip")


def test_read_root_is_judged_at_the_resolved_path(
    gw: RunningGateway, fs_only: httpx2.Client, box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With fs.read's root at /workspace, a link out of it reads nothing outside."""
    gateway = gw.app.state.parts.gateway
    monkeypatch.setattr(gateway, "read_policy", FilePolicy(root="/workspace", read_tool="fs.read"))
    rule = "tools.fs.read.root: /workspace"
    url = f"/v1/sandboxes/{box.id}/files"
    assert_denied(fs_only.get(url, params={"path": "sub/outside"}), rule, "/etc/hostname")
    assert_denied(fs_only.get(url, params={"path": "sub/etc/passwd"}), rule, "/etc/passwd")
    download = fs_only.get(f"{url}/download", params={"path": "sub/etc/passwd"})
    assert_denied(download, rule, "/etc/passwd")
    ok = fs_only.get(url, params={"path": "sub/docs/readme.txt"})
    assert ok.status_code == 200 and ok.json()["content"] == "doc\n", ok.text


# -- what still works ----------------------------------------------------------------------


def test_legitimate_writes_and_links_still_work(
    fs_only: httpx2.Client, files: httpx2.Client, box: Sandbox
) -> None:
    data = tar_of(
        ("ok/src/app.py", "file", "print(1)\n"),
        ("ok/readme", "symlink", "../docs/readme.txt"),
        ("ok/docs", "symlink", "../docs"),
        ("ok/top", "symlink", ".."),  # the root itself: writes through it are judged
        ("ok/copy", "hardlink", "ok/src/app.py"),
        ("ok/.git/HEAD", "file", "ref: refs/heads/main\n"),
        ("ok/venv/bin/python", "symlink", "/usr/bin/python3"),  # out of the root: fine
    )
    r = upload(fs_only, box, data)
    assert r.status_code == 200 and r.json()["entries"] == 7, r.text
    assert write(fs_only, box, "ok/docs/new.txt", "new\n").status_code == 200
    assert write(fs_only, box, "ok/readme", "doc2\n").status_code == 200  # final symlink
    assert shell(box, "cat /workspace/docs/readme.txt /workspace/docs/new.txt") == "doc2\nnew\n"
    assert_denied(write(fs_only, box, "ok/top/.git/config"), CONFIG)
    url = f"/v1/sandboxes/{box.id}/files"
    r = files.post(f"{url}/edit", json={"path": "ok/docs/new.txt", "old": "new", "new": "newer"})
    assert r.status_code == 200, r.text
    r = files.post(f"{url}/move", json={"path": "ok/docs/new.txt", "destination": "ok/moved"})
    assert r.status_code == 200, r.text
    assert files.post(f"{url}/mkdir", json={"path": "ok/docs/sub"}).status_code == 200
    assert files.post(f"{url}/remove", json={"path": "ok/moved"}).status_code == 200
    read = fs_only.get(url, params={"path": "sub/shell-cfg"})  # reading is not protected
    assert read.status_code == 200 and read.json()["content"] == "original-config\n", read.text


# -- the same over MCP -----------------------------------------------------------------------


@pytest.mark.usefixtures("unchanged")
def test_mcp_file_tools_are_judged_at_the_resolved_path(gw: RunningGateway, box: Sandbox) -> None:
    bearer = token(gw, box.id, FILE_TOOLS)
    content = base64.b64encode(b"pwned").decode()
    calls = [
        ("fs_write", {"path": "sub/shell-cfg", "content": "pwned"}, CONFIG),
        (
            "fs_write",
            {"path": "sub/shell-hooks/pre-commit", "content": content, "encoding": "base64"},
            HOOKS,
        ),
        ("fs_write", {"path": "r/.GIT/hooks/pre-commit", "content": "x"}, HOOKS),
        ("fs_edit", {"path": "sub/shell-cfg", "old": "original", "new": "x"}, CONFIG),
        ("fs_move", {"path": "sub/docs/readme.txt", "destination": "sub/shell-hooks/x"}, HOOKS),
        ("fs_remove", {"path": "sub/shell-hooks/pre-commit"}, HOOKS),
        ("fs_mkdir", {"path": "sub/shell-hooks/d"}, HOOKS),
    ]

    async def main() -> None:
        async with mcp_client(gw, bearer) as c:
            for name, args, rule in calls:
                r = await c.call_tool(name, args)
                text = r.content[0].text if r.content else ""
                pattern = repr(rule.partition(": ")[2])  # MCP errors are text: it names it
                assert r.is_error and "policy_denied" in text and pattern in text, (name, text)
            ok = await c.call_tool("fs_write", {"path": "sub/docs/mcp.txt", "content": "ok"})
            assert not ok.is_error, ok.content

    anyio.run(main)


def test_hard_links_made_by_the_shell_are_not_seen(fs_only: httpx2.Client, box: Sandbox) -> None:
    """Documented limit: a hard link the shell made is an ordinary file to the file tools
    (they cannot tell where its other names are). The sandbox is the boundary."""
    r = write(fs_only, box, "hardlinked-config", "original-config\n")
    assert r.status_code == 200, r.text
