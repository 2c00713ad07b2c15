"""What a workspace download must not hand the host without saying so.

An agent controls every byte of its workspace. Some files are harmless inside the
sandbox but run or are trusted on the host as soon as a person opens the tree there. By
default a download withholds them and reports each one (path and reason; never content):

- the host-trusted names below (``TRUSTED_DIRS``, ``TRUSTED_FILES``: editor, agent and
  tool settings, shell rc files), anywhere in the tree, as files, directories or symlinks;
- git state that runs code. Every directory git could take for a git directory is found
  the way git finds one, by shape and not only by the name ``.git`` (``GIT_DIR``, bare
  repositories, ``commondir`` targets, worktree and submodule git dirs, nested anywhere):
  in it, ``hooks/`` and the state of a rebase or cherry-pick in progress (its todo list
  runs ``exec`` lines) are withheld whole, and each file git reads as config
  (``config``, ``config.worktree``) is kept only if it is plain ``key = value`` git
  config whose every key is on a short allowlist of keys that run nothing. Everything
  else git config can do (hooksPath, fsmonitor, pager, diff and filter drivers, includes,
  ...) is thereby withheld, and ``.gitattributes`` can only name drivers that are not
  defined. A ``.git`` that is a symlink, a gitfile or ``commondir`` that points out of the
  tree, and a ``hooks`` symlink anywhere are withheld too;
- setuid/setgid files, symlinks that can resolve out of the tree, and names with a
  backslash (a separator to Windows).

Names are compared as a case-insensitive host sees them (macOS, Windows): case folded,
the code points HFS+ ignores dropped, NTFS trailing dots/spaces and stream suffixes cut;
names shaped like Windows 8.3 short names (``GIT~1``) are withheld.
"""

from __future__ import annotations

import re
import stat

_RC = "a shell reads it at start-up"
# The host-trusted names: one table, folded (lower case). Directories are withheld whole.
TRUSTED_DIRS: dict[str, str] = {
    ".vscode": "VS Code runs its tasks, launch configs and settings",
    ".idea": "JetBrains IDEs run its run configurations and settings",
    ".claude": "Claude Code runs its hooks and MCP servers",
    ".codex": "Codex CLI reads its config",
    ".cursor": "Cursor runs its settings and MCP servers",
    ".gemini": "Gemini CLI runs its settings and MCP servers",
    ".devcontainer": "VS Code builds and runs the dev container it defines",
    ".zed": "Zed runs its tasks and settings",
    ".vs": "Visual Studio runs its tasks and launch configs",
    ".continue": "Continue starts the MCP servers it names",
    ".roo": "Roo Code starts the MCP servers it names",
    ".kiro": "Kiro runs its hooks and MCP servers",
    ".amazonq": "Amazon Q starts the MCP servers it names",
    ".hg": "Mercurial runs the hooks and extensions its hgrc names",
    ".sl": "Sapling runs the hooks and extensions its config names",
    ".jj": "Jujutsu runs the pager, diff and merge tools its repo config names",
    ".fossil-settings": "Fossil runs the editor, diff and ssh commands it sets",
    "_darcs": "darcs runs the hooks its prefs name",
}
TRUSTED_FILES: dict[str, str] = {
    ".mcp.json": "agents start the MCP servers it names",
    ".envrc": "direnv runs it",
    ".npmrc": "npm runs the programs it names (script-shell, git, node-options)",
    ".yarnrc": "Yarn reads its settings",
    ".yarnrc.yml": "Yarn runs the yarnPath it names",
    ".pnpmfile.cjs": "pnpm runs it on install",
    ".aider.conf.yml": "aider runs the lint and test commands it names",
    ".gitconfig": "git reads it as user config in a home directory",
    ".hgrc": "Mercurial reads it as user config in a home directory",
    ".gdbinit": "gdb runs it",
    ".irbrc": "irb runs it",
    ".rprofile": "R runs it at start-up",
    ".exrc": "vi runs it (exrc)",
    ".nvimrc": "vim/neovim run it (exrc)",
    ".nvim.lua": "neovim runs it (exrc)",
    ".dir-locals.el": "Emacs evaluates it",
    **dict.fromkeys(
        (".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc",
         ".zprofile", ".zshenv", ".zlogin", ".zlogout", ".kshrc", ".cshrc", ".tcshrc",
         ".inputrc"),
        _RC,
    ),
}  # fmt: skip

# In a git directory: what git runs (hooks; the todo list of a rebase in progress runs its
# `exec` lines), and the files it reads (and follows) as config or as a pointer to one.
_GIT_RUNS = frozenset({"hooks", "rebase-merge", "rebase-apply", "sequencer"})
_GIT_CONFIGS = frozenset({"config", "config.worktree"})
_GIT_POINTERS = frozenset({"commondir"})
MAX_VETTED = 1 << 20

# git config that runs nothing: section (with or without a subsection) -> keys.
_ALLOWED_KEYS: dict[tuple[str, bool], frozenset[str]] = {
    ("core", False): frozenset(
        {
            "repositoryformatversion",
            "bare",
            "filemode",
            "logallrefupdates",
            "ignorecase",
            "precomposeunicode",
            "symlinks",
        }
    ),
    ("extensions", False): frozenset({"objectformat", "worktreeconfig"}),
    ("user", False): frozenset({"name", "email"}),
    ("remote", True): frozenset({"url", "pushurl", "fetch"}),
    ("branch", True): frozenset({"remote", "pushremote", "merge", "rebase", "description"}),
    ("submodule", True): frozenset({"url", "active"}),
}
# A strict subset of git's config syntax: anything git would read differently from this
# reading (quotes, escapes, continuations, legacy [a.b] headers, a key after a header)
# does not match and withholds the file.
_HEADER = re.compile(r'[ \t]*\[([A-Za-z0-9-]+)(?:[ \t]+"([^"\\]*)")?\][ \t]*')
_ENTRY = re.compile(r"[ \t]*([A-Za-z][A-Za-z0-9-]*)[ \t]*(?:=[ \t]*([^\"\\#;]*?))?[ \t]*")
_COMMENT = re.compile(r"[ \t]*([#;].*)?")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# A URL git would hand to a program: `ext::cmd`, `<helper>::...`, or `-option` injection.
_URL_RUNS = re.compile(r"::|(^|[/@:])-")
# What Windows may take for the 8.3 short name of an existing .git or .vscode (GIT~1).
_SHORT_NAME = re.compile(r"[^~.]{1,6}~[0-9]+(\.[^.]{0,3})?")
_HFS_IGNORED = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")


def host_name(name: str) -> str:
    """The name a case-insensitive host may take ``name`` for (HFS+ drops some code
    points; NTFS drops trailing dots and spaces and a ``::$DATA``-style stream suffix)."""
    return _HFS_IGNORED.sub("", name).lower().split(":", 1)[0].rstrip(". ")


def is_git_dir(name: str, children: list[str]) -> bool:
    """Whether git could take the directory ``name`` holding ``children`` for a git dir:
    git accepts one by shape (HEAD, plus objects/ and refs/ here or in its commondir), so
    any of those signs is enough, whatever the directory is called."""
    kids = {host_name(c) for c in children}
    return (
        host_name(name) == ".git"
        or bool(kids & {"head", "commondir"})
        or {"objects", "refs"} <= kids
    )


def withhold_reason(
    arcname: str, mode: int, link_target: str | None = None, in_git_dir: bool = False
) -> str | None:
    """Why the entry ``arcname`` (a path inside the tar) must be withheld, or None.

    ``mode`` is its st_mode; ``link_target`` its target when it is a symlink;
    ``in_git_dir`` whether its directory may be a git directory (``is_git_dir``).
    """
    parts = arcname.split("/")
    for part in parts[:-1]:
        if host_name(part) in TRUSTED_DIRS:
            return f"inside {part}/ ({TRUSTED_DIRS[host_name(part)]})"
    if "\\" in parts[-1]:  # Windows extracts `.git\hooks\x` as .git/hooks/x
        return "a name with a backslash (a path separator on Windows)"
    if _SHORT_NAME.fullmatch(parts[-1]):
        return "a Windows short name (it may stand for .git or a trusted directory there)"
    name = host_name(parts[-1])
    if name in TRUSTED_DIRS:
        return TRUSTED_DIRS[name]
    if name in TRUSTED_FILES:
        return TRUSTED_FILES[name]
    is_link = link_target is not None
    if name == ".git" and is_link:
        return "a .git symlink (git would use the directory it points to)"
    if name == "hooks" and is_link:
        return "a hooks symlink (git runs the hooks it points to)"
    if in_git_dir and name in _GIT_RUNS:
        return f"{parts[-1]} in a git directory (git runs what it holds)"
    if in_git_dir and name in _GIT_CONFIGS | _GIT_POINTERS and not stat.S_ISREG(mode):
        return f"a {parts[-1]} in a git directory that is not a plain file"
    if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
        return "setuid/setgid bit"
    if link_target is not None and _leaves_tree(arcname, link_target):
        return f"symlink that may resolve out of the tree (-> {link_target[:200]})"
    return None


def vets_content(arcname: str, in_git_dir: bool) -> bool:
    """Whether a regular file's content decides if it is withheld (``content_reason``);
    the download then sends exactly the bytes that were judged."""
    name = host_name(arcname.rsplit("/", 1)[-1])
    return name == ".git" or (in_git_dir and name in _GIT_CONFIGS | _GIT_POINTERS)


def content_reason(arcname: str, content: bytes) -> str | None:
    """Why the regular file ``arcname`` (one ``vets_content`` picked) must be withheld."""
    name = host_name(arcname.rsplit("/", 1)[-1])
    if len(content) > MAX_VETTED:
        return f"an oversized {name}"
    if name == ".git":  # a gitfile: "gitdir: <path>"
        match = re.fullmatch(rb"gitdir: ([^\r\n]+)\r?\n?", content)
        if match is None or _leaves_tree(arcname, match.group(1).decode("utf-8", "replace")):
            return "a .git file that does not point to a git directory inside the tree"
        return None
    if name in _GIT_POINTERS:
        match = re.fullmatch(rb"([^\r\n]+)\r?\n?", content)
        if match is None or _leaves_tree(arcname, match.group(1).decode("utf-8", "replace")):
            return f"a {name} that does not point inside the tree"
        return None
    return git_config_reason(content)


def git_config_reason(content: bytes) -> str | None:
    """Why a file git reads as config must be withheld: it is not plain git config, or it
    sets a key outside the allowlist (never the value: it may be a secret)."""
    if len(content) > MAX_VETTED:
        return "oversized git config"
    try:
        text = content.removeprefix(b"\xef\xbb\xbf").decode("utf-8")  # git skips a BOM
    except UnicodeDecodeError:
        return "git config that is not UTF-8"
    section: tuple[str, bool] | None = None
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        header = _HEADER.fullmatch(line)
        entry = _ENTRY.fullmatch(line)
        if _CONTROL.search(line) or not (header or entry or _COMMENT.fullmatch(line)):
            return f"git config whose line {number} is not plain `key = value`"
        if header:
            section = (header.group(1).lower(), header.group(2) is not None)
        elif entry:
            key = entry.group(1).lower()
            name = f"{section[0]}{'.*' if section[1] else ''}.{key}" if section else key
            if section is None or key not in _ALLOWED_KEYS.get(section, frozenset()):
                return f"git config sets {name[:100]} (not a key known to run nothing)"
            if key in ("url", "pushurl") and _URL_RUNS.search(entry.group(2) or ""):
                return f"git config sets a {name} that git would hand to a program"
    return None


def _leaves_tree(arcname: str, target: str) -> bool:
    """Whether the relative path ``target``, taken from the directory of ``arcname``, may
    resolve out of the archived tree (its first component, or ``.``).

    Judged component by component without trusting any of them: a component may be a
    symlink (``m -> .``), so a ``..`` after a named component can land anywhere; only
    leading ``..`` that stay below the top are kept. Each kept link then lands inside the
    tree, and so does any chain of them.
    """
    parts = arcname.split("/")
    depth = len(parts) - 2  # directories below the top that ``..`` may climb
    if depth < 0 or not target or target.startswith("/") or _CONTROL.search(target):
        return True  # absolute; git reads a NUL in a gitfile as the end of the path
    if "\\" in target or ":" in target:
        return True  # a Windows separator, drive or stream
    ups, named = 0, False
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            ups += 1
            if named or ups > depth:
                return True
        elif host_name(part) in ("", ".", ".."):  # "...", ".. ": dots to Windows
            return True
        else:
            named = True
    return False
