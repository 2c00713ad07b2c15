"""What a workspace download must not hand the host without saying so.

An agent controls every byte of its workspace. Some files are harmless inside the
sandbox but run or are trusted on the host as soon as a person opens the tree there:
git hooks and git config that runs programs, editor and agent settings (`.vscode/`,
`.idea/`, `.claude/`, `.codex/`, `.mcp.json`), direnv's `.envrc`, shell rc files,
setuid/setgid bits, and symlinks that point out of the tree. By default a download
withholds them and reports each one (path and reason; never content).
"""

from __future__ import annotations

import posixpath
import re
import stat

# Directories whose contents an editor or agent on the host trusts or runs.
TRUSTED_DIRS = frozenset({".vscode", ".idea", ".claude", ".codex"})
# Files a tool on the host runs or trusts by name, wherever they are in the tree.
TRUSTED_FILES = frozenset(
    {
        ".mcp.json", ".envrc", ".bashrc", ".bash_profile", ".bash_login", ".bash_logout",
        ".profile", ".zshrc", ".zprofile", ".zshenv", ".zlogin", ".zlogout", ".kshrc",
        ".cshrc", ".tcshrc", ".inputrc",
    }
)  # fmt: skip
# git config keys whose value git runs (or hands credentials to).
_GIT_RUNS = re.compile(
    r"^(core\.(hookspath|fsmonitor|sshcommand|pager|editor|gitproxy|askpass)"
    r"|credential(\..+)?\.helper|diff\.external|filter\..+\.(clean|smudge|process)"
    r"|include\.path|includeif\..+\.path|sequence\.editor|gpg\.program)$"
)
_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]')
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(=|$)")
MAX_GIT_CONFIG = 1 << 20


def withhold_reason(arcname: str, mode: int, link_target: str | None = None) -> str | None:
    """Why the entry ``arcname`` (a path inside the tar) must be withheld, or None.

    ``mode`` is its st_mode; ``link_target`` its target when it is a symlink.
    """
    parts = arcname.split("/")
    for part in parts[:-1]:
        if part in TRUSTED_DIRS:
            return f"inside {part}/ (editor or agent settings the host trusts)"
    name = parts[-1]
    if name in TRUSTED_DIRS and stat.S_ISDIR(mode):
        return f"{name}/ holds editor or agent settings the host trusts"
    if name in TRUSTED_FILES:
        return f"{name} is run or trusted by tools on the host"
    if ".git" in parts[:-1]:
        inside = parts[parts.index(".git") + 1 :]
        if inside[:1] == ["hooks"] and len(inside) > 1 and not name.endswith(".sample"):
            return "a git hook (git runs it)"
    if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
        return "setuid/setgid bit"
    if link_target is not None and _leaves_tree(arcname, link_target):
        return f"symlink leaving the tree (-> {link_target[:200]})"
    return None


def is_git_config(arcname: str) -> bool:
    parts = arcname.split("/")
    return len(parts) >= 2 and parts[-2] == ".git" and parts[-1] == "config"


def git_config_reason(content: bytes) -> str | None:
    """Why a ``.git/config`` must be withheld: a key whose value git would run."""
    if len(content) > MAX_GIT_CONFIG:
        return "an oversized .git/config"
    section = ""
    for raw in content.decode("utf-8", "replace").splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0]
        header = _SECTION.match(line)
        if header:
            section = header.group(1).lower() + (
                f".{header.group(2)}" if header.group(2) is not None else ""
            )
            line = line[header.end() :]
        key = _KEY.match(line)
        if key and section:
            full = f"{section}.{key.group(1).lower()}"
            if _GIT_RUNS.match(full):
                return f".git/config sets {full} (git would run its value)"
    return None


def _leaves_tree(arcname: str, target: str) -> bool:
    """Whether a relative symlink at ``arcname`` resolves outside the archived tree (its
    first component, or ``.`` for a whole-root download)."""
    if target.startswith("/"):
        return True
    top = arcname.split("/", 1)[0]
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(arcname), target))
    if top == ".":
        return resolved == ".." or resolved.startswith("../")
    return not (resolved == top or resolved.startswith(top + "/"))
