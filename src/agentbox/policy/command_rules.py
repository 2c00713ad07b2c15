"""Command rules that do not depend on the shell parser: identity, code on stdin, normal argv.

The shell analysis (:mod:`agentbox.policy.shell_analysis`) turns a command line into simple
commands - words after quote removal (:class:`Word`), their redirections and context. What
those words *mean* is decided here, on plain words, so the parser can be swapped:

* **Program identity** (:func:`identify`). A bare name runs what the sandbox's ``PATH`` finds,
  and that ``PATH`` lists only system directories; a path under :data:`SYSTEM_DIRS` (also
  through ``/proc/self/root``) is that system program. Anything else - ``./ls``, ``bin/x``,
  ``/workspace/ls``, ``~/bin/x``, ``/tmp/x`` - is a file the agent may have written, copied or
  linked (``ln -s /usr/bin/rm ./ls``): its identity is *unknown*, whatever its basename.
* **Where an interpreter reads its program** (:func:`program_input`): a shell (any of
  :data:`SHELLS`, ``source``/``.``) or an interpreter (:data:`INTERPRETERS`) with no code
  argument and no script operand, with ``-s``/``-i``/``-``, or with a script path that is a
  descriptor (``/dev/stdin``, ``/dev/fd/N``, ``/proc/self/fd/N``, ``<(…)``) reads its program
  from stdin or a pipe.
* **Normal argv** (:func:`normalise`): option spellings are made canonical so rules match what
  a command *does*: combined short flags are split, short and abbreviated long options become
  their long name (``rm -fr``, ``-r -f``, ``-R``, ``--rec --force`` → ``--recursive --force``),
  git's global options (``-C dir``, ``-c k=v``, ``--git-dir``, ``--no-pager``, …) are dropped
  before the subcommand, and implied options are added (``git push -f``, ``+main``,
  ``--mirror``, ``--force-with-lease`` → ``--force``; ``-d``, ``:main``, ``--prune`` →
  ``--delete``).
* **Command patterns** (:class:`CommandPattern`), the ``approval:`` entries and the ``deny:``
  entries that have arguments, are compiled with the same normaliser and matched against
  the normal argv (see the class).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal


@dataclass(frozen=True)
class Word:
    """One shell word after quote removal, with what the parser could tell about it.

    ``dynamic``: contains ``$x``/``${x}``/``$(…)``/backticks/``<(…)``/``$'…'``: its run-time
    value is unknown. ``unsafe``: may turn into zero or several words or into other text at run
    time (an unquoted expansion, glob or brace expansion), so positions after it are unknown.
    """

    text: str
    raw: str
    dynamic: bool = False
    unsafe: bool = False

    @staticmethod
    def literal(text: str) -> Word:
        return Word(text=text, raw=text)


# --------------------------------------------------------------------------- identity

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
"""Directories the sandbox user cannot write (host ``/usr`` read-only in the default template,
root-owned in built ones): a program named by a path under them is that program."""

IDENTITY_VARIABLES = frozenset(
    {"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV", "GIT_EXEC_PATH",
     "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
     "GIT_TEMPLATE_DIR", "NODE_OPTIONS", "PERL5OPT", "RUBYOPT"}
)  # fmt: skip
"""Setting one of these changes which file a bare program name runs, or makes it load files
(a git config, a module) that may run anything."""

CODE_VARIABLES = frozenset(
    {"GIT_PAGER", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_SSH_COMMAND", "GIT_SSH",
     "GIT_EXTERNAL_DIFF", "GIT_ASKPASS", "SSH_ASKPASS", "GIT_PROXY_COMMAND", "PAGER",
     "MANPAGER", "EDITOR", "VISUAL", "LESSOPEN", "LESSCLOSE"}
)  # fmt: skip
"""Variables whose value a program runs as a shell command (``GIT_PAGER='…' git log``)."""

_PROC_ROOT = re.compile(r"^/proc/(?:self|thread-self|[0-9]+)/root(?=/|$)")


def normalise_program(name: str) -> str:
    """``/usr/bin/rm`` → ``rm``; ``./rm`` → ``rm``; ``.`` → ``source``; ``rm`` → ``rm``."""
    if name == ".":
        return "source"
    return name.rstrip("/").rsplit("/", 1)[-1] if "/" in name else name


def _lexical(path: str) -> str:
    """``posixpath.normpath``, and a leading ``//`` is ``/`` (as on Linux)."""
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/") if path.startswith("//") else path


def system_path(name: str) -> bool:
    """Is ``name`` (containing a ``/``) a path under :data:`SYSTEM_DIRS`, lexically?"""
    if not name.startswith("/"):
        return False
    path = name
    while (m := _PROC_ROOT.match(path)) is not None:
        path = path[m.end() :] or "/"
    path = _lexical(path)
    return any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS)


def known_identity(word: str, *, path_changed: bool = False) -> bool:
    """Is the program word ``word`` surely the program its basename names?

    ``path_changed``: the command sets ``PATH`` or another of :data:`IDENTITY_VARIABLES`.
    """
    if "/" in word and word != ".":
        return system_path(word)
    return not path_changed


_MAX_LINKS = 40  # as the kernel's limit on nested symlinks


def resolve_to_system(path: str, readlink: Callable[[str], str | None]) -> str | None:
    """Follow the symlink chain at absolute sandbox ``path`` to a path under :data:`SYSTEM_DIRS`.

    ``readlink(p)`` gives the target of the symlink ``p`` in the sandbox (None: not a symlink,
    or missing). Returns the first system path in the chain (``/workspace/.venv/bin/python3``
    → ``/usr/bin/python3``), or None when the chain ends at a file the sandbox may have
    written. Checked at decision time: a process in the sandbox can re-point the link before
    the command runs (a guardrail, not a boundary).
    """
    for _ in range(_MAX_LINKS):
        if system_path(path):
            return path
        target = readlink(path)
        if target is None:
            return None
        path = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return None


# --------------------------------------------------------------------------- code on stdin

POSIX_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "rbash", "posh"})
OTHER_SHELLS = frozenset({"fish", "csh", "tcsh", "nu", "elvish", "xonsh"})
SHELLS = POSIX_SHELLS | OTHER_SHELLS


@dataclass(frozen=True)
class _Interp:
    """How an interpreter's options say where its program comes from."""

    code: str  # short options whose presence means "code given inline / module" (-c, -e, -m)
    value: str  # short options that take a value (the rest of the word, else the next word)
    attached: str = ""  # short options whose optional value can only be the rest of the word
    long_code: frozenset[str] = frozenset()
    long_value: frozenset[str] = frozenset()
    no_run: frozenset[str] = frozenset()  # --version, -h, …: nothing is read


_PYTHON = _Interp(
    "cm", "WX", long_value=frozenset({"--check-hash-based-pycs"}),
    no_run=frozenset({"-V", "--version", "-h", "--help", "-?"}),
)  # fmt: skip
INTERPRETERS: dict[str, _Interp] = {
    "perl": _Interp("eE", "I", "MmixdD0lCF", no_run=frozenset({"-v", "-V", "-h"})),
    "ruby": _Interp("e", "IrCE", "xKTWl0F", no_run=frozenset({"-v", "--version", "-h", "--help"})),
    "node": _Interp(
        "ep",
        "rC",
        long_code=frozenset({"--eval", "--print", "--run", "--test", "--check"}),
        long_value=frozenset(
            {"--require", "--import", "--loader", "--experimental-loader", "--input-type"}
            | {"--conditions", "--env-file", "--title", "--inspect-port"}
        ),
        no_run=frozenset({"-v", "--version", "-h", "--help", "-c"}),
    ),
    "php": _Interp("rBREFf", "dcz", no_run=frozenset({"-v", "-h", "-i", "-m", "-l", "-S"})),
}
"""Interpreters (besides shells) that run a program read from stdin when given none."""
INTERPRETERS["nodejs"] = INTERPRETERS["node"]
_PYTHON_NAME = re.compile(r"(?:python|pypy)[0-9.]*")

_STDIN_PATHS = re.compile(r"/dev/stdin|/dev/fd/0|/proc/(?:self|thread-self|[0-9]+)/fd/0")
_FD_PATHS = re.compile(r"/dev/(?:fd/[0-9]+|std(?:in|out|err)|tty)|/proc/[^/]+/fd/[0-9]+")

ProgramInput = Literal["stdin", "descriptor", "dynamic", "elsewhere"]
"""``stdin``: the program is read from stdin; ``descriptor``: from a pipe or descriptor named
as its script; ``dynamic``: from a place known only at run time; ``elsewhere``: from an
argument, a script file, or nothing is run (also: not an interpreter)."""


def reads_code(name: str) -> bool:
    """Is ``name`` a program :func:`program_input` knows?"""
    return (
        name in SHELLS
        or name == "source"
        or name in INTERPRETERS
        or bool(_PYTHON_NAME.fullmatch(name))
    )


def script_input(word: Word) -> ProgramInput:
    """Where a script operand (``bash FILE``, ``source FILE``) makes the program come from."""
    if word.dynamic or word.unsafe:
        return "descriptor" if word.raw.startswith(("<(", ">(")) else "dynamic"
    path = _lexical(word.text) if word.text.startswith("/") else word.text
    if word.text == "-" or _STDIN_PATHS.fullmatch(path):
        return "stdin"
    return "descriptor" if _FD_PATHS.fullmatch(path) else "elsewhere"


def program_input(name: str, args: Sequence[Word]) -> ProgramInput:
    """Where ``name ARGS`` reads its program from (``name`` normalised, see :func:`reads_code`)."""
    if name == "source":
        return script_input(args[0]) if args else "elsewhere"
    if name in SHELLS:
        return _shell_input(args)
    spec = _PYTHON if _PYTHON_NAME.fullmatch(name) else INTERPRETERS.get(name)
    if spec is None:
        return "elsewhere"
    i = 0
    while i < len(args):
        w = args[i]
        if w.dynamic or w.unsafe:
            return script_input(w) if not w.text.startswith("-") else "dynamic"
        t = w.text
        if t == "--":
            return script_input(args[i + 1]) if i + 1 < len(args) else "stdin"
        if t == "-":
            return "stdin"
        if t in spec.no_run:
            return "elsewhere"
        if t.startswith("--"):
            opt = t.partition("=")[0]
            if opt in spec.long_code:
                return "elsewhere"
            i += 2 if opt in spec.long_value and "=" not in t else 1
            continue
        if t.startswith("-"):
            for pos, ch in enumerate(t[1:]):
                if ch in spec.code:
                    return "elsewhere"
                if ch in spec.value or ch in spec.attached:
                    i += 0 if t[pos + 2 :] or ch in spec.attached else 1
                    break
            i += 1
            continue
        return script_input(w)
    return "stdin"


def _shell_input(args: Sequence[Word]) -> ProgramInput:
    i, stdin_flag = 0, False
    while i < len(args):
        w = args[i]
        if w.dynamic or w.unsafe:
            return "dynamic"
        t = w.text
        if t in ("--", "-"):
            i += 1
            break
        if t in ("--version", "--help"):
            return "elsewhere"
        if t.startswith("--"):
            i += 2 if t in ("--rcfile", "--init-file") else 1
            continue
        if len(t) > 1 and t[0] in "-+":
            letters = t[1:]
            if t[0] == "-" and "c" in letters:
                return "elsewhere"  # -c: the code is an argument (analysed by the caller)
            stdin_flag = stdin_flag or (t[0] == "-" and ("s" in letters or "i" in letters))
            i += 1 + letters.count("o") + letters.count("O")
            continue
        break
    if stdin_flag or i >= len(args):
        return "stdin"
    return script_input(args[i])


# --------------------------------------------------------------------------- normal argv


@dataclass(frozen=True)
class _Spec:
    """Options of one program (or git subcommand), for canonical spelling."""

    short: dict[str, str]  # letter → canonical long option
    long: frozenset[str]  # known long options, for GNU/git abbreviations
    separate_value: frozenset[str] = frozenset()  # long options whose value may be the next word
    implies: dict[str, tuple[str, ...]] = field(default_factory=dict)


_RM = _Spec(
    {"f": "--force", "i": "--interactive", "I": "--interactive=once", "r": "--recursive",
     "R": "--recursive", "d": "--dir", "v": "--verbose"},
    frozenset({"--force", "--interactive", "--one-file-system", "--no-preserve-root",
               "--preserve-root", "--recursive", "--dir", "--verbose", "--help", "--version"}),
)  # fmt: skip
_GIT_PUSH = _Spec(
    {"f": "--force", "d": "--delete", "n": "--dry-run", "u": "--set-upstream", "q": "--quiet",
     "v": "--verbose", "o": "--push-option", "4": "--ipv4", "6": "--ipv6"},
    frozenset({"--all", "--branches", "--prune", "--mirror", "--dry-run", "--porcelain",
               "--delete", "--tags", "--follow-tags", "--no-follow-tags", "--signed",
               "--no-signed", "--atomic", "--no-atomic", "--push-option", "--receive-pack",
               "--exec", "--force-with-lease", "--no-force-with-lease", "--force-if-includes",
               "--no-force-if-includes", "--force", "--repo", "--set-upstream", "--thin",
               "--no-thin", "--quiet", "--verbose", "--progress", "--no-progress",
               "--recurse-submodules", "--no-recurse-submodules", "--verify", "--no-verify",
               "--ipv4", "--ipv6"}),
    frozenset({"--push-option", "--receive-pack", "--exec", "--repo"}),
    {"--mirror": ("--force", "--delete"), "--prune": ("--delete",),
     "--force-with-lease": ("--force",)},
)  # fmt: skip
_GIT_CLEAN = _Spec(
    {"f": "--force", "d": "-d", "x": "-x", "X": "-X", "n": "--dry-run", "q": "--quiet",
     "i": "--interactive", "e": "--exclude"},
    frozenset({"--force", "--dry-run", "--quiet", "--interactive", "--exclude"}),
    frozenset({"--exclude"}),
)  # fmt: skip
_GIT_BRANCH = _Spec(
    {"d": "--delete", "D": "--delete", "f": "--force", "m": "--move", "M": "--move",
     "c": "--copy", "C": "--copy", "a": "--all", "r": "--remotes", "v": "--verbose",
     "l": "--list", "u": "--set-upstream-to", "q": "--quiet"},
    frozenset({"--delete", "--force", "--move", "--copy", "--all", "--remotes", "--verbose",
               "--list", "--set-upstream-to", "--unset-upstream", "--quiet", "--track",
               "--no-track", "--contains", "--merged", "--no-merged", "--sort", "--format"}),
    frozenset({"--set-upstream-to", "--contains", "--merged", "--no-merged", "--sort",
               "--format"}),
    {"-D": ("--force",), "-M": ("--force",), "-C": ("--force",)},
)  # fmt: skip
_GIT_RESET = _Spec(
    {"q": "--quiet", "p": "--patch", "N": "--intent-to-add"},
    frozenset({"--hard", "--soft", "--mixed", "--keep", "--merge", "--quiet", "--patch",
               "--intent-to-add", "--recurse-submodules", "--no-recurse-submodules"}),
)  # fmt: skip
_SPECS: dict[tuple[str, ...], _Spec] = {
    ("rm",): _RM,
    ("git", "push"): _GIT_PUSH,
    ("git", "clean"): _GIT_CLEAN,
    ("git", "branch"): _GIT_BRANCH,
    ("git", "reset"): _GIT_RESET,
}
_GIT_GLOBAL_VALUE = frozenset(
    {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--super-prefix", "--config-env",
     "--attr-source"}
)  # fmt: skip
_GIT_NO_SUBCOMMAND = frozenset({"--version", "--help", "-h", "--html-path", "--man-path",
                                "--info-path", "--exec-path"})  # fmt: skip
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class NormalArgv:
    """A simple command with canonical options (see :func:`normalise`)."""

    program: str
    subcommand: tuple[str, ...]
    options: frozenset[str]
    """Canonical options, ``--name`` or ``--name=value``; unknown short flags stay ``-x``."""
    operands: tuple[str, ...]
    dynamic: bool = False
    """A word is known only at run time (``rm "$f" x``): it could be any option or operand."""

    def render(self) -> str:
        return " ".join([self.program, *self.subcommand, *sorted(self.options), *self.operands])


def normalise(argv: Sequence[str], *, dynamic: bool = False) -> NormalArgv:
    """Canonical form of ``argv`` (``argv[0]`` a normalised program name); ``dynamic``: some
    word's value is known only at run time."""
    program, args = argv[0], list(argv[1:])
    sub: tuple[str, ...] = ()
    if program == "git":
        args = _strip_git_globals(args)
        if args and not args[0].startswith("-"):
            sub, args = (args[0],), args[1:]
    spec = _SPECS.get((program, *sub))
    options, operands, _ = _split_options(args, spec, patterns=False)
    if spec is _GIT_PUSH:
        operands, implied = _push_refspecs(operands)
        options |= implied
    return NormalArgv(program, sub, frozenset(options), tuple(operands), dynamic)


def git_globals(args: Sequence[str]) -> tuple[list[tuple[str, str]], int]:
    """git's ``-c KEY=VALUE`` settings before the subcommand, and the subcommand's index."""
    settings: list[tuple[str, str]] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        opt = args[i].partition("=")[0]
        if opt in _GIT_NO_SUBCOMMAND:
            return settings, len(args)
        if opt == "-c" and i + 1 < len(args):
            key, _, value = args[i + 1].partition("=")
            settings.append((key.lower(), value))
        i += 2 if opt in _GIT_GLOBAL_VALUE and "=" not in args[i] else 1
    return settings, i


_GIT_CODE_KEYS = re.compile(
    r"core\.(?:pager|editor|sshcommand|askpass|fsmonitor|gitproxy)|sequence\.editor|pager\..+"
    r"|diff\.external|diff\..+\.(?:textconv|command)|merge\..+\.driver"
    r"|filter\..+\.(?:clean|smudge|process)|credential(?:\..+)?\.helper|gpg(?:\..+)?\.program"
    r"|remote\..+\.(?:uploadpack|receivepack)|uploadpack\.packobjectshook|web\.browser"
    r"|(?:browser|difftool|mergetool|man)\..+\.(?:cmd|path)|alias\..+"
)
"""git settings whose value is a command git runs (``alias.*``: when it starts with ``!``)."""
_GIT_FILE_KEYS = re.compile(r"core\.hookspath|include\.path|includeif\..+|protocol\..+\.allow")
"""git settings that make git read or run files or URLs the policy cannot see."""


def git_setting_runs(key: str, value: str) -> Literal["code", "files", None]:
    """Does ``git -c KEY=VALUE`` make git run ``value`` as a command, or run unseen files?"""
    if _GIT_FILE_KEYS.fullmatch(key):
        return "files"
    if _GIT_CODE_KEYS.fullmatch(key) and (not key.startswith("alias.") or value[:1] == "!"):
        return "code"
    return None


def _strip_git_globals(args: list[str]) -> list[str]:
    """Drop git's options before the subcommand (``git -C . -c x=y --no-pager push``); a
    ``-c alias.NAME=…`` for the subcommand is expanded (``-c alias.p='push -f' p``)."""
    settings, i = git_globals(args)
    rest = args[i:]
    aliases = {key[len("alias.") :]: value for key, value in settings if key.startswith("alias.")}
    if rest and rest[0] in aliases and not aliases[rest[0]].startswith("!"):
        return [*aliases[rest[0]].split(), *rest[1:]]
    return rest


def _long_name(spec: _Spec | None, opt: str) -> str:
    """An exact or uniquely abbreviated long option → its full name (else as written)."""
    if spec is None or opt in spec.long:
        return opt
    matches = [name for name in spec.long if name.startswith(opt)]
    return matches[0] if len(matches) == 1 else opt


def _split_options(
    args: Sequence[str], spec: _Spec | None, *, patterns: bool
) -> tuple[set[str], list[str], list[str]]:
    """Options (canonical, implied ones added), operands, and (patterns) option globs."""
    options: set[str] = set()
    operands: list[str] = []
    globs: list[str] = []
    i = 0
    while i < len(args):
        t = args[i]
        i += 1
        if t == "--":
            operands.extend(args[i:])
            break
        if not t.startswith("-") or t == "-":
            operands.append(t)
            continue
        glob = _GLOB.search(t) if patterns else None
        if glob is not None:
            if t.startswith("--"):
                globs.append(t)
                continue
            t = t[: glob.start()]  # "-rf*": -r, -f and maybe more (which never matters)
            if len(t) < 2:
                continue
        if t.startswith("--"):
            opt, eq, value = t.partition("=")
            name = _long_name(spec, opt)
            if not eq and spec is not None and name in spec.separate_value and i < len(args):
                eq, value = "=", args[i]
                i += 1
            options.add(name + eq + value)
            options.update(spec.implies.get(name, ()) if spec else ())
            continue
        letters = t[1:]
        for pos, ch in enumerate(letters):
            name = spec.short.get(ch, f"-{ch}") if spec else f"-{ch}"
            if spec is not None and name in spec.separate_value:
                value = letters[pos + 1 :]
                if not value and i < len(args):
                    value = args[i]
                    i += 1
                options.add(f"{name}={value}")
                break
            options.add(name)
            if spec is not None:
                options.update(spec.implies.get(f"-{ch}", ()))
                options.update(spec.implies.get(name, ()))
    return options, operands, globs


def _push_refspecs(operands: list[str]) -> tuple[list[str], set[str]]:
    """``git push REPO +main :old``: ``+`` forces, an empty source deletes."""
    implied: set[str] = set()
    out = operands[:1]
    for ref in operands[1:]:
        if ref.startswith("+"):
            implied.add("--force")
            ref = ref[1:]
        if ref.startswith(":"):
            implied.add("--delete")
        out.append(ref)
    return out, implied


# --------------------------------------------------------------------------- patterns


@dataclass(frozen=True)
class _Segment:
    text: str  # the segment as written (collapsed)
    program: str | None  # None: the program word is a glob, matched as text only
    subcommand: tuple[str, ...] = ()
    options: frozenset[str] = frozenset()
    option_globs: tuple[str, ...] = ()
    operands: str = ""  # the operand words, joined: one fnmatch glob
    open_ended: bool = False  # the last word ends with `*`: further operands are fine

    @staticmethod
    def compile(text: str) -> _Segment:
        words = text.split()
        if not words or _GLOB.search(words[0]) or words[0] == "*":
            return _Segment(text, None)
        program, args = normalise_program(words[0]), words[1:]
        sub: tuple[str, ...] = ()
        if program == "git":
            args = _strip_git_globals(args)
            if args and not args[0].startswith("-") and not _GLOB.search(args[0]):
                sub, args = (args[0],), args[1:]
        spec = _SPECS.get((program, *sub))
        options, operands, globs = _split_options(args, spec, patterns=True)
        open_ended = bool(words[-1].endswith("*")) and len(words) > 1
        return _Segment(
            text, program, sub, frozenset(options), tuple(globs), " ".join(operands), open_ended
        )

    def matches(self, cmd: NormalArgv) -> bool:
        if self.program is None:
            return fnmatchcase(cmd.render(), self.text)
        if (cmd.program, cmd.subcommand) != (self.program, self.subcommand):
            return False
        if cmd.dynamic:
            return True  # `f=-rf; rm $f x`: what the pattern names may be in the unknown word
        if not self.options <= cmd.options:
            return False
        if not all(any(fnmatchcase(o, g) for o in cmd.options) for g in self.option_globs):
            return False
        operands = " ".join(cmd.operands)
        if self.open_ended and not self.operands:
            return True
        if self.open_ended and not self.operands.endswith("*"):
            return fnmatchcase(operands, self.operands) or fnmatchcase(
                operands, self.operands + " *"
            )
        return fnmatchcase(operands, self.operands)


class CommandPattern:
    """An ``approval:`` (or argument-carrying ``deny:``) entry, matched on normal argv.

    A command with a word known only at run time matches any pattern for its program (and
    git subcommand): ``rm "$f" x`` could be ``rm -rf x``.

    The pattern is split into words at whitespace (no quoting) and, when it holds `` | ``,
    into pipeline segments. A segment whose program word is a literal name is compiled with
    :func:`normalise`: it matches a simple command with that program (and git subcommand)
    that has *at least* the pattern's options in any order and spelling (options the pattern
    does not mention do not matter; an option word with a glob, ``--force*``, must match one
    canonical option), and whose operands, joined by spaces, match the pattern's operand words
    (``*`` spans spaces); a pattern whose last word ends in ``*`` allows further operands.
    A segment ``*`` matches any number of pipeline segments; a segment whose program word is a
    glob is matched as text against the command's canonical rendering.

    For backward compatibility the pattern also matches as before, as one glob against the
    whole command text, each simple command and each pipeline as written.
    """

    def __init__(self, text: str) -> None:
        self.text = " ".join(text.split())
        self.segments = tuple(_Segment.compile(s) for s in self.text.split(" | "))

    def matches(self, cmd: NormalArgv) -> bool:
        return len(self.segments) == 1 and self.segments[0].matches(cmd)

    def matches_pipeline(self, segments: Sequence[NormalArgv]) -> bool:
        return len(self.segments) > 1 and _match_segments(self.segments, tuple(segments))

    def matches_text(self, text: str) -> bool:
        return fnmatchcase(text, self.text)


def _match_segments(pattern: tuple[_Segment, ...], cmds: tuple[NormalArgv, ...]) -> bool:
    if not pattern:
        return not cmds
    head, rest = pattern[0], pattern[1:]
    if head.text == "*":
        return any(_match_segments(rest, cmds[n:]) for n in range(len(cmds) + 1))
    return bool(cmds) and head.matches(cmds[0]) and _match_segments(rest, cmds[1:])
