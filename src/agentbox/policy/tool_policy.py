# Whole on purpose: a tool's command and file policies are set together, answer one Decision
"""The tool gateway's policy engine: may this command run, may this file be written?

**This is a guardrail, not a security boundary. The sandbox is the boundary.** The policy
keeps a cooperative-but-careless agent away from commands and files the operator flagged,
and asks a human before high-risk actions. It cannot stop an agent that sets out to get
around it; everything it allows still runs inside the sandbox, and the sandbox (namespaces,
seccomp, cgroups, no credentials, egress filtering) is what contains a hostile agent.

Commands (:class:`CommandPolicy`)
---------------------------------
The command is analysed with a real shell parser (:mod:`agentbox.policy.shell_analysis`)
to find *every* program it would run: all list/pipeline members, subshells, groups, control
flow and function bodies, ``$(…)``/backticks/``<(…)`` (also inside ``${…}`` and unquoted
heredocs), wrappers (``env``, ``xargs``, ``timeout``, ``sudo``, ``find -exec``, …), code
strings (``bash -c``, ``eval``, ``trap``, ``alias``) and code fed to a shell through a
heredoc or here-string (``bash <<'EOF'``). A list argv is not shell-parsed (its items are
data) but is unwrapped the same way. Then, in this order:

1. anything that cannot be analysed statically is **denied** (rule ``unparseable``,
   ``dynamic command name``, ``dynamic shell code``, ``nesting too deep``, ``invalid command``,
   ``function import via environment``) - unless a denied program was already found, in which
   case the deny rule is reported (deny wins). *Dynamic shell code* includes a shell or
   interpreter that reads its program from stdin or a descriptor (below);
2. a program on the deny list → **denied** (rule ``tools.<tool>.deny: <program>``); a deny
   entry of several words is a command pattern (like an approval pattern, below) and
   denies what it matches (rule ``tools.<tool>.deny: <pattern>``);
3. with an allow list, a program of *unknown identity* (below) → **denied** (rule
   ``unknown program identity``), and every program must be on the list → otherwise
   **denied** (rule ``tools.<tool>.allow``; the reason names the first offending program and
   the list). Shell builtins that run nothing themselves (:data:`SHELL_BUILTINS`: ``cd``,
   ``echo``, ``test``, ``export``, …, and ``eval``/``command``/``exec``/``trap`` whose payload
   *is* analysed) need not be listed; they are still subject to the deny list;
4. an approval pattern matches → **allowed but needs approval** (``allowed=True,
   needs_approval=True``, rule ``tools.<tool>.approval: <pattern>``): the gateway must not run
   it before a human approves. ``sudo``/``doas`` always need approval (rule
   ``privilege escalation: sudo``); so does a program of unknown identity when there is a
   deny list but no allow list (rule ``unknown program identity``: it could be a denied
   program under another name);
5. otherwise allowed.

Names are compared after normalisation (basename, ``.`` → ``source``), both in the command
and in the lists, exactly (no globs in allow/deny lists). ``source``/``.`` is treated as an
ordinary program: it must be on the allow list when one is configured (it runs a file,
like ``bash FILE``), and can be denied.

**Program identity** (:mod:`agentbox.policy.command_rules`). A bare name is the program the
sandbox's ``PATH`` (system directories only) finds; a path under ``/usr``, ``/bin``,
``/sbin``, ``/lib*`` (also via ``/proc/self/root``) is that system program. Any other path
(``./ls``, ``bin/x``, ``/workspace/ls``, ``~/bin/x``, ``/tmp/x``) names a file the agent may
have written, copied or linked (``ln -s /usr/bin/rm ./ls``), and so does every bare name in a
command that sets ``PATH``, ``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``, ``BASH_ENV``,
``ENV``, ``GIT_CONFIG_*``, ``GIT_EXEC_PATH``, ``NODE_OPTIONS``, … (``IDENTITY_VARIABLES``; as an
assignment, ``export``/``declare``/``read``/``env``, or the ``env`` argument of the tool),
uses ``hash -p``, or ``source``s a file: their identity is *unknown*. Variables whose value
a program runs as a command (``GIT_PAGER``, ``GIT_SSH_COMMAND``, ``EDITOR``, ``PAGER``, …:
``CODE_VARIABLES``) are analysed as shell code when set in the command; set through the
tool's ``env`` argument they make every program's identity unknown. The deny list
still matches their basename (``./rm`` is denied). The gateway resolves such a path in the
sandbox when it can (through the sandbox root, symlink by symlink, relative paths against the
tool's ``cwd`` unless the command changes directory): a link chain that reaches a system path
is that program (``/workspace/.venv/bin/python3`` → ``python3``); a regular file, a missing
file or a bare name after a ``PATH`` change stays unknown.

**Code on stdin.** A shell (``sh``, ``bash``, ``dash``, ``zsh``, ``ksh``, ``ash``, ``mksh``,
``busybox sh``, …, and ``source``/``.``) or an interpreter (``python*``, ``pypy*``, ``perl``,
``ruby``, ``node``, ``php``) that gets no code argument (``-c``/``-e``/``-m``/…) and no script
file - or ``-s``, ``-i``, ``-``, or a script path that is a descriptor (``/dev/stdin``,
``/dev/fd/N``, ``/proc/self/fd/N``, ``<(…)``, a path known only at run time) - reads its
program from stdin. That is allowed only when stdin is a literal heredoc or here-string in
the command (analysed as shell code for POSIX shells; for other interpreters it is code in
the command, like ``python3 -c``) or a regular file (``sh < x.sh``, like ``sh x.sh``); a pipe
(``echo rm x | bash``, ``curl … | python3``), the caller's stdin (``bash``, ``bash -i``, the
tool's ``stdin``), a duplicated descriptor or a substitution is dynamic shell code: denied.

**Command patterns** (approval entries and multi-word deny entries) are
:func:`fnmatch.fnmatchcase` globs (``*`` matches anything including spaces and ``/``, ``?``
one character, ``[…]`` a class; case-sensitive; whitespace runs collapsed). A pattern matches
if it matches, as one glob, any *text* of:

* the whole command, whitespace runs collapsed to one space (an argv: its items joined by
  spaces);
* every simple command, rendered as its normalised program name followed by its words after
  quote removal, single-spaced, without assignments and redirections - at any depth, and
  for wrappers also the wrapped command alone (``sudo /usr/bin/git push -f`` yields
  ``sudo git push -f`` and ``git push -f``);
* every pipeline of two or more commands, its segments (rendered as above, once as written
  and once unwrapped) joined by `` | `` (so ``curl x|/bin/tee y`` yields ``curl x | tee y``);

or if it matches the **normal argv** of a simple command (or pipeline) - the pattern is
normalised the same way (:class:`~agentbox.policy.command_rules.CommandPattern`): short and
long option spellings, combined short flags and abbreviations are one canonical option;
git's global options are ignored; implied options are added; options may come in any
order, and options the pattern does not name do not matter; the operands must match the
pattern's operand words (a last word ending in ``*`` allows more); a command with a word
known only at run time matches every pattern for its program (``rm "$f" x``: ``$f`` may be
``-rf``). So ``rm -rf *`` matches
``rm -fr x``, ``rm -r -f x``, ``rm -R --force x`` and ``rm --rec --force x``; ``git push
--force*`` matches ``git push -f``, ``git -C . push --force``, ``git push origin +main``,
``git push --mirror`` and ``--force-with-lease``; ``git push --delete*`` matches ``git push
origin :old`` and ``-d``; ``git branch --delete*`` matches ``-D``. Only ``rm`` and git's
``push``, ``clean``, ``branch`` and ``reset`` know their options (and which take a value);
for other programs combined short flags are split and option values count as operands.

Files (:class:`FilePolicy`)
---------------------------
Paths are sandbox paths, absolute or relative to ``/workspace``, normalised lexically with
:func:`posixpath.normpath` (``..`` collapsed, repeated ``/`` squeezed). Outside ``root`` →
denied. ``protected`` patterns (writes only) are gitignore-like globs relative to ``root``,
matched **case-insensitively** and **at any depth** unless anchored with a leading ``/``:
``.git/hooks/**`` protects ``r/.git/hooks/x`` and ``.GIT/hooks/x`` too, ``/.mcp.json`` only
the one at the root; ``*`` and ``?`` stay within one path segment, ``**/`` matches any number
of directories, a trailing ``/**`` the directory and everything inside; a pattern matching a
directory protects everything in it. Writing, removing or moving a directory that by its
name *contains* a protected path (``.git`` at any depth for ``.git/hooks/**``, the root
itself) is denied too. ``size`` above ``max_bytes`` → denied.

The gateway checks the requested path here first (an early, clear denial), then the file
layer judges the path it will actually act on: resolved inside the sandbox root, through
every symlink, in the same walk that then acts on it (see ``SandboxFiles`` and its
``guard``, and :meth:`FilePolicy.check_resolved`). Writes through a final symlink are judged
at the symlink's target; a symlink may not be made (uploaded, moved, hard-linked) to point
at a protected path, a hard link not to any file the write policy refuses; a directory
created on the way is judged by its own name only.

Limitations - what a determined agent can still do
--------------------------------------------------
* **Run code the analyser does not see.** Write a script file (or a Makefile, a
  ``conftest.py``, an npm script, a git alias or hook) and run it with an allowed program:
  ``bash x.sh``, ``python3 x.py``, ``make``, ``npm test``, ``pytest``, ``git x``. Pass code to an
  allowed interpreter in the command: ``python3 -c 'import os; os.system("rm -rf /")'``,
  ``node -e …``, ``python3 - <<'EOF'``. Only POSIX shell code (``sh -c``, ``eval``, heredocs
  into a shell, …) is analysed; code *from a pipe or stdin* is refused (above), code
  *in a file* is not seen.
* **Change what a name runs outside the command.** Identity is decided per call: a shell
  session (``shell_run``) keeps ``PATH``, aliases and functions set by earlier calls, and
  ``~/.bashrc``, ``PYTHONPATH``, ``NODE_OPTIONS``, ``GIT_*`` variables or a repository's
  ``.git/config`` (``alias.*``, ``remote.*.push = +…``) change what an allowed command does.
  A resolved symlink can be re-pointed between the check and the run.
* **Use an unknown wrapper.** Programs that run other programs but are not modelled
  (``strace``, ``gdb``, ``parallel``, ``ssh``, ``perl``, ``awk 'BEGIN{system(…)}'``,
  ``git -c core.pager=…``, ``git -c alias.x='!…' x``) are seen only as themselves. A deny
  list is therefore easy to walk around (``cp /usr/bin/rm x; ./x`` still needs approval or
  an allow list entry, but a script can do what ``rm`` does); an **allow list** is the
  meaningful control.
* **Options the normaliser does not know.** Patterns match normal argv only for the
  programs listed above; for others a reordered or respelled option (``curl -XPOST``) is
  matched as written.
* **Data-dependent evaluation.** bash evaluates array subscripts in arithmetic contexts, so a
  variable whose *value* is ``a[$(cmd)]`` runs ``cmd`` in ``$((x))``, ``[[ $x -eq 1 ]]``,
  ``declare -i``, ``read``/``printf -v`` targets, etc.; ``${x@P}`` runs the ``$(…)`` in a
  value. Literal occurrences are refused (such text as an argument of ``let``/``declare``/
  ``[``/``[[``…, as the value of an assignment, and every ``${…@P}``); values arriving at run
  time (``read x``, ``x=$(cat f)``) cannot be seen.
* **Hard links made outside the file tools.** A hard link is a second name for the same
  file: one made by the sandbox's shell (``ln .git/config cfg``) is an ordinary file to the
  file tools, and writing ``cfg`` changes ``.git/config``. The file tools refuse to *make*
  one to a protected file (tar hard-link entries), but cannot tell where an existing one's
  other names are. Nor do they see what the shell, ``git`` or a build does: a token that may
  run commands can write protected paths directly.

* **Parser fidelity.** tree-sitter-bash recovers from errors instead of failing (every tree
  with an ERROR/MISSING node is refused) and differs from bash in known places the analyser
  corrects (heredoc bodies set aside, line continuations joined, backticks re-parsed after
  bash's unescaping, digits before ``<``/``>`` taken as a descriptor). A construct where it
  differs silently and the analyser does not know could hide a command; every command node
  of the tree must have been analysed, which catches most of them.

It also refuses some valid shell (false denials, always with a reason saying what to do):
the parser does not handle ``coproc``, two here-documents on one line, a here-string after
another redirection or on a group (``{ …; } <<< x``), a heredoc operator followed by ``;``,
brace expansion in a program name (``{a,b}``) and a few glob spellings (``r?m``); program
names built at run time, wrapper/``find`` arguments whose meaning
depends on run-time values (``find "$dir"``, ``timeout "$t" …``), unquoted globs in
``find`` arguments and ``$(…)`` text in arguments of ``let``/``declare``/``read``/``[``…
are refused.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentbox.errors import UnparseableCommand
from agentbox.policy.command_rules import (
    CODE_VARIABLES,
    IDENTITY_VARIABLES,
    CommandPattern,
    known_identity,
    normalise,
    normalise_program,
)
from agentbox.policy.shell_analysis import (
    RULE_DYNAMIC_CODE,
    RULE_DYNAMIC_NAME,
    RULE_FUNC_IMPORT,
    RULE_INVALID,
    RULE_TOO_DEEP,
    RULE_UNPARSEABLE,
    CommandAnalysis,
    analyse_command,
    programs_in,
)

if TYPE_CHECKING:
    from agentbox.fsutil import Access

__all__ = [
    "RULE_DYNAMIC_CODE",
    "RULE_DYNAMIC_NAME",
    "RULE_FUNC_IMPORT",
    "RULE_INVALID",
    "RULE_TOO_DEEP",
    "RULE_UNKNOWN_IDENTITY",
    "RULE_UNPARSEABLE",
    "SHELL_BUILTINS",
    "WORKSPACE",
    "CommandPolicy",
    "Decision",
    "FilePolicy",
    "UnparseableCommand",
    "diff_summary",
    "programs_in",
]

WORKSPACE = "/workspace"
"""Relative sandbox paths are relative to this directory."""

SHELL_BUILTINS: frozenset[str] = frozenset(
    {
        ":", "true", "false", "cd", "pwd", "echo", "printf", "test", "[", "export", "unset",
        "set", "shift", "local", "declare", "typeset", "readonly", "read", "return", "exit",
        "break", "continue", "wait", "shopt", "getopts", "type", "let", "pushd", "popd",
        "dirs", "umask", "ulimit", "times", "jobs", "unalias",
        # builtins that run their payload - the payload is analysed and checked separately:
        "eval", "command", "builtin", "exec", "trap", "alias", "hash",
    }
)  # fmt: skip
"""Shell builtins that need not appear on an allow list (the deny list still applies)."""

_PRIVILEGED = ("sudo", "doas")

RULE_UNKNOWN_IDENTITY = "unknown program identity"
"""A program run by a path outside the system directories (``./ls``), or by name after the
command changed ``PATH``: it could be any program."""


_DECISION_CACHE_SIZE = 512


@dataclass(frozen=True)
class Decision:
    """The outcome of a policy check.

    ``allowed`` and ``needs_approval`` are both true when the lists allow the action but an
    approval pattern matched: it must wait for a human (see :attr:`may_run_now`).
    """

    allowed: bool
    needs_approval: bool
    rule: str | None
    """The rule that decided, e.g. ``tools.terminal.run.deny: rm``, ``unparseable``,
    ``tools.fs.write.protected: .git/hooks/**``; None when nothing restricted it."""
    reason: str
    """Human/agent-readable: what happened and what to do next."""
    programs: tuple[str, ...] = ()
    """Normalised program names found (commands only), first-occurrence order."""

    @property
    def may_run_now(self) -> bool:
        """Allowed and no approval needed."""
        return self.allowed and not self.needs_approval

    @classmethod
    def allow(cls, reason: str, programs: tuple[str, ...] = ()) -> Decision:
        return cls(True, False, None, reason, programs)

    @classmethod
    def deny(cls, rule: str | None, reason: str, programs: tuple[str, ...] = ()) -> Decision:
        return cls(False, False, rule, reason, programs)

    @classmethod
    def hold(cls, rule: str, reason: str, programs: tuple[str, ...] = ()) -> Decision:
        """Allowed once a person approves it."""
        return cls(True, True, rule, reason, programs)


def _collapse(text: str) -> str:
    return " ".join(text.split())


class CommandPolicy:
    """Allow / deny / approval lists for one command-running tool (``terminal.run``).

    ``allow=None`` allows every program that is not denied; an empty list allows none (only
    :data:`SHELL_BUILTINS`). ``deny`` entries of one word are program names, longer ones are
    command patterns (:class:`CommandPattern`). ``tool`` names the tool in rule strings.
    """

    def __init__(
        self,
        allow: list[str] | None,
        deny: list[str],
        approval: list[str],
        *,
        tool: str = "terminal.run",
    ) -> None:
        self.tool = tool
        self.allow: frozenset[str] | None = (
            None if allow is None else frozenset(normalise_program(a) for a in allow)
        )
        entries = [d.strip() for d in deny if d.strip()]
        self.deny: frozenset[str] = frozenset(
            normalise_program(d) for d in entries if len(d.split()) == 1
        )
        self.deny_patterns = tuple(CommandPattern(d) for d in entries if len(d.split()) > 1)
        self.approval = tuple(CommandPattern(p) for p in approval if p.strip())
        self._decided: dict[tuple[str | tuple[str, ...], bool], Decision] = {}

    def check(
        self,
        command: str | list[str],
        *,
        resolve: Callable[[str], str | None] | None = None,
        env: Iterable[str] = (),
    ) -> Decision:
        """Decide on a shell string, or an argv list (``argv[0]`` is the program).

        ``resolve(word)``: where a program path (``./ls``, ``/workspace/.venv/bin/python3``)
        leads in the sandbox, as :func:`resolve_to_system` does (None: not a system program);
        without it such paths are of unknown identity. ``env``: names of variables the caller
        sets for the command (``PATH`` there changes what bare names run).

        A decision that depends only on the command text and these fixed lists is
        remembered: agents repeat commands, and parsing costs 0.2-0.5 ms.
        """
        path_env = not _UNSEEN_ENV.isdisjoint(env)
        key = (command if isinstance(command, str) else tuple(command), resolve is None)
        decision = None if path_env else self._decided.get(key)
        if decision is not None:
            return decision
        decision, used_sandbox = self._decide(command, resolve, path_env)
        if not used_sandbox and not path_env:
            if len(self._decided) >= _DECISION_CACHE_SIZE:
                self._decided.pop(next(iter(self._decided)))  # the oldest
            self._decided[key] = decision
        return decision

    def _decide(
        self,
        command: str | list[str],
        resolve: Callable[[str], str | None] | None,
        path_env: bool,
    ) -> tuple[Decision, bool]:
        try:
            analysis = analyse_command(command)
        except UnparseableCommand as exc:
            denied = self._denied_decision(exc.programs)
            if denied is not None:
                return denied, False
            return Decision.deny(exc.rule, exc.message, tuple(exc.programs)), False
        analysis.path_changed = analysis.path_changed or path_env
        unknown, resolved, used_sandbox = _identities(analysis, resolve)
        decision = self._decide_analysed(command, analysis, resolved, unknown)
        return decision, used_sandbox

    def _decide_analysed(
        self,
        command: str | list[str],
        analysis: CommandAnalysis,
        resolved: list[str],
        unknown: list[str],
    ) -> Decision:
        # a resolved path is its target; the deny list also sees its basename (./rm)
        programs = tuple(dict.fromkeys([*analysis.programs, *resolved]))
        denied = self._denied_decision(programs)
        if denied is not None:
            return denied
        whole = _collapse(" ".join(command) if isinstance(command, list) else command)
        targets = _Targets(whole, analysis)
        if hit := targets.first(self.deny_patterns):
            pattern, matched = hit
            return Decision.deny(
                f"tools.{self.tool}.deny: {pattern.text}",
                f"`{matched}` matches the deny pattern {pattern.text!r} of {self.tool}. Do "
                "the task without it, or ask the operator.",
                programs,
            )
        if self.allow is not None and unknown:
            return Decision.deny(
                RULE_UNKNOWN_IDENTITY,
                f"`{unknown[0]}` {_UNKNOWN_WHY}, so it is not the program of that name on the "
                f"allow list of {self.tool}. Run the program by its name from the system PATH "
                "(without changing PATH); a link to a system program (a virtualenv's python) "
                "counts as that program once it exists: create it in an earlier call.",
                programs,
            )
        if self.allow is not None:
            for program in dict.fromkeys(resolved):
                if program not in self.allow and program not in SHELL_BUILTINS:
                    listed = ", ".join(sorted(self.allow)) or "(none)"
                    return Decision.deny(
                        f"tools.{self.tool}.allow",
                        f"`{program}` is not on the allow list of {self.tool}. Allowed "
                        f"programs: {listed} (plus shell builtins such as cd, echo, test). Use "
                        "one of those, or ask the operator to allow it.",
                        programs,
                    )
        decision = self._approval_decision(targets, analysis, programs)
        if decision.needs_approval or not unknown or not (self.deny or self.deny_patterns):
            return decision
        return Decision.hold(
            RULE_UNKNOWN_IDENTITY,
            f"`{unknown[0]}` {_UNKNOWN_WHY}: it could be a denied program under another name, "
            "so it runs only after a human approves it. Run programs by their name from the "
            "system PATH to avoid the wait.",
            programs,
        )

    def _denied_decision(self, found: Iterable[str]) -> Decision | None:
        programs = tuple(found)
        for program in programs:
            if program in self.deny:
                return Decision.deny(
                    f"tools.{self.tool}.deny: {program}",
                    f"`{program}` is denied by the {self.tool} policy (deny list: "
                    f"{', '.join(sorted(self.deny))}). Do the task without it, or ask the "
                    "operator.",
                    programs,
                )
        return None

    def _approval_decision(
        self, targets: _Targets, analysis: CommandAnalysis, programs: tuple[str, ...]
    ) -> Decision:
        if hit := targets.first(self.approval):
            pattern, matched = hit
            return Decision.hold(
                f"tools.{self.tool}.approval: {pattern.text}",
                f"`{matched}` matches the approval pattern {pattern.text!r}: it runs only "
                "after a human approves it. Wait for the approval, or choose a less "
                "risky command.",
                programs,
            )
        for program in _PRIVILEGED:
            if program in analysis.privileged:
                return Decision.hold(
                    f"privilege escalation: {program}",
                    f"`{program}` escalates privileges: it runs only after a human approves "
                    f"it. Run the command without {program} if you can.",
                    programs,
                )
        return Decision.allow(f"allowed (runs: {', '.join(programs)})", programs)


_UNSEEN_ENV = IDENTITY_VARIABLES | CODE_VARIABLES
"""Variables in the tool's ``env`` argument make every program's identity unknown: the
policy does not analyse their values."""

_UNKNOWN_WHY = (
    "is run by a path outside the system directories (or after the command changed PATH): "
    "the file there could be any program"
)


def _identities(
    analysis: CommandAnalysis, resolve: Callable[[str], str | None] | None
) -> tuple[list[str], list[str], bool]:
    """Program words of unknown identity; every program's name, a resolved path's being its
    target's; whether ``resolve`` was asked. Builtins never look at PATH; a relative path is
    resolved only if the command does not change directory first."""
    unknown: list[str] = []
    names: list[str] = []
    asked = False
    for name, word in zip(analysis.programs, analysis.program_words, strict=True):
        names.append(name)
        if "/" not in word and (name in SHELL_BUILTINS or name == "source"):
            continue
        if known_identity(word, path_changed=analysis.path_changed):
            continue
        target = None
        if resolve is not None and "/" in word and (word[0] == "/" or not analysis.changes_dir):
            asked = True
            target = resolve(word)
        if target is None:
            unknown.append(word)
        else:
            names[-1] = normalise_program(target)
    return unknown, names, asked


class _Targets:
    """What command patterns are matched against, for one analysed command."""

    def __init__(self, whole: str, analysis: CommandAnalysis) -> None:
        self.texts = [
            whole,
            *(" | ".join(_collapse(" ".join(seg)) for seg in p) for p in analysis.pipelines),
            *(_collapse(" ".join(argv)) for argv in analysis.commands),
        ]
        dynamic = analysis.dynamic_argvs
        self.commands = [
            normalise(argv, dynamic=argv in dynamic) for argv in dict.fromkeys(analysis.commands)
        ]
        self.pipelines = [
            tuple(normalise(seg, dynamic=seg in dynamic) for seg in p) for p in analysis.pipelines
        ]

    def match(self, pattern: CommandPattern) -> str | None:
        """The first target (as text) the pattern matches, or None."""
        for text in self.texts:
            if pattern.matches_text(text):
                return text
        for cmd in self.commands:
            if pattern.matches(cmd):
                return cmd.render()
        for pipeline in self.pipelines:
            if pattern.matches_pipeline(pipeline):
                return " | ".join(cmd.render() for cmd in pipeline)
        return None

    def first(self, patterns: Iterable[CommandPattern]) -> tuple[CommandPattern, str] | None:
        """The first of ``patterns`` that matches, with what it matched, or None."""
        for pattern in patterns:
            matched = self.match(pattern)
            if matched is not None:
                return pattern, matched
        return None


# --------------------------------------------------------------------------- files


def _glob_regex(body: str) -> str:
    """gitignore-style glob (without anchoring slashes) → regex source."""
    out: list[str] = []
    i = 0
    while i < len(body):
        if body.startswith("**/", i) and (i == 0 or body[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("/**", i) and i + 3 == len(body):
            out.append("/.+")
            i += 3
        elif body[i] == "*":
            while i < len(body) and body[i] == "*":
                i += 1
            out.append("[^/]*")
        elif body[i] == "?":
            out.append("[^/]")
            i += 1
        elif body[i] == "[":
            close = body.find("]", i + 2)
            if close == -1:
                out.append(re.escape("["))
                i += 1
                continue
            cls = body[i + 1 : close]
            if cls.startswith("!"):
                cls = "^" + cls[1:]
            out.append("[" + cls.replace("\\", "\\\\") + "]")
            i = close + 1
        elif body[i] == "\\" and i + 1 < len(body):
            out.append(re.escape(body[i + 1]))
            i += 2
        else:
            out.append(re.escape(body[i]))
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Protected:
    pattern: str
    regex: re.Pattern[str]
    ancestors: re.Pattern[str]  # directories that by name contain what the pattern protects

    @staticmethod
    def compile(pattern: str) -> _Protected:
        text = pattern.strip()
        body = text.strip("/")
        if body.endswith("/**"):  # the directory itself too: a link to it is one into it
            body = body[:-3]
        prefix = "" if text.startswith("/") else "(?:.*/)?"
        regex = re.compile(prefix + _glob_regex(body) + "(?:/.*)?", re.IGNORECASE | re.DOTALL)
        segments = body.split("/")
        literal: list[str] = []
        for seg in segments:
            if any(ch in seg for ch in "*?[\\"):
                break
            literal.append(seg)
        if len(literal) == len(segments):
            literal.pop()  # the exact path is matched by the regex
        # "" (the root) and each literal leading directory: a/b/c.txt -> "", a, a/b.
        nested = ""
        for seg in reversed(literal):
            nested = f"{re.escape(seg)}(?:/{nested})?" if nested else re.escape(seg)
        ancestors = f"(?:{prefix}{nested})?" if nested else ""
        return _Protected(pattern, regex, re.compile(ancestors, re.IGNORECASE | re.DOTALL))

    def matches(self, rel: str, whole: bool = True) -> bool:
        if rel != "" and self.regex.fullmatch(rel) is not None:
            return True
        return whole and self.ancestors.fullmatch(rel) is not None


class FilePolicy:
    """Root, size cap and protected paths for the file tools (``fs.read`` / ``fs.write``).

    ``check_read`` applies root and ``max_bytes``; ``check_write`` (write, edit, remove, and
    each end of a move - see :meth:`check_move`) also applies ``protected``.
    ``require_diff_summary`` is carried for the gateway (see :meth:`summary_for`).
    """

    def __init__(
        self,
        root: str = WORKSPACE,
        max_bytes: int | None = None,
        protected: Sequence[str] = (),
        require_diff_summary: bool = False,
        *,
        read_tool: str = "fs.read",
        write_tool: str = "fs.write",
    ) -> None:
        if not root.startswith("/"):
            raise ValueError(f"root must be an absolute sandbox path, got {root!r}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.root = _squeeze(posixpath.normpath(root))
        self.max_bytes = max_bytes
        self.protected = tuple(_Protected.compile(p) for p in protected if p.strip())
        self.require_diff_summary = require_diff_summary
        self.read_tool = read_tool
        self.write_tool = write_tool

    def resolve(self, path: str) -> str:
        """The normalised absolute sandbox path (lexical: no symlinks are followed)."""
        if not path.startswith("/"):
            path = posixpath.join(WORKSPACE, path)
        return _squeeze(posixpath.normpath(path))

    def _relative(self, norm: str) -> str | None:
        if norm == self.root:
            return ""
        base = self.root.rstrip("/") + "/"
        return norm[len(base) :] if norm.startswith(base) else None

    def _common(self, path: str, size: int | None, tool: str) -> tuple[Decision | None, str]:
        if not path or "\x00" in path:
            reason = "the path is empty or contains a NUL byte; send a valid sandbox path"
            return Decision.deny("invalid path", reason), ""
        norm = self.resolve(path)
        rel = self._relative(norm)
        if rel is None:
            return (
                Decision.deny(
                    f"tools.{tool}.root: {self.root}",
                    f"{norm} is outside {self.root}, the root of {tool}; use a path under "
                    f"{self.root}.",
                ),
                norm,
            )
        if size is not None and self.max_bytes is not None and size > self.max_bytes:
            return (
                Decision.deny(
                    f"tools.{tool}.max_bytes",
                    f"{norm} is {size} bytes, over the {tool} limit of {self.max_bytes} bytes; "
                    "split the content or read/write a smaller range.",
                ),
                norm,
            )
        return None, norm

    def check_read(self, path: str, size: int | None = None) -> Decision:
        """May the file tool read ``path`` (of ``size`` bytes, if known)?"""
        denied, norm = self._common(path, size, self.read_tool)
        return denied or Decision.allow(f"allowed: read {norm}")

    def check_write(self, path: str, size: int | None = None, *, whole: bool = True) -> Decision:
        """May the file tool write/edit/remove ``path`` (new size ``size``, if known)?

        ``whole=False`` judges the name alone, not what a directory of that name contains:
        for a directory created empty, or the target a new link points at (writes through
        the link are judged where they land)."""
        denied, norm = self._common(path, size, self.write_tool)
        if denied is not None:
            return denied
        rel = self._relative(norm)
        assert rel is not None  # checked by _common
        for prot in self.protected:
            if prot.matches(rel, whole):
                what = "is protected" if prot.regex.fullmatch(rel) else "contains protected paths"
                return Decision.deny(
                    f"tools.{self.write_tool}.protected: {prot.pattern}",
                    f"{norm} {what} ({prot.pattern!r}); {self.write_tool} refuses to change it"
                    " (or to link to it). Change a different file, or ask the operator.",
                )
        return Decision.allow(f"allowed: write {norm}")

    def check_resolved(self, path: str, access: Access) -> Decision:
        """The write check of a canonical path the file layer is about to act on, for
        ``access`` (``agentbox.fsutil.Access``): a directory it creates, or the source
        of a hard link, is judged by name alone; the target of a symlink only against
        ``protected`` (outside ``root`` is fine: a write through the link is judged where
        it lands, so the root still holds)."""
        if access == "symlink_to" and self._relative(self.resolve(path)) is None:
            return Decision.allow(f"allowed: link to {path}")
        return self.check_write(path, whole=access == "write")

    def check_move(self, src: str, dst: str) -> Decision:
        """A move writes both ends: the first denial wins."""
        first = self.check_write(src)
        return first if not first.allowed else self.check_write(dst)

    def summary_for(self, path: str, old: bytes | None, new: bytes) -> str | None:
        """:func:`diff_summary` when ``require_diff_summary`` is set, else None."""
        return diff_summary(self.resolve(path), old, new) if self.require_diff_summary else None


def _squeeze(path: str) -> str:
    # normpath keeps a leading "//" (POSIX allows it to mean something else); Linux doesn't.
    return "/" + path.lstrip("/") if path.startswith("//") else path


# --------------------------------------------------------------------------- diffs


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _decode(data: bytes) -> str | None:
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def diff_summary(path: str, old: bytes | None, new: bytes, max_lines: int = 200) -> str:
    """A unified diff of a write, headed ``<path>: +N -M lines``.

    ``old=None`` means the file is new. Binary content (NUL bytes or not UTF-8) gives
    ``<path>: binary file changed (X -> Y bytes)``. At most ``max_lines`` diff lines are kept;
    the counts always cover the whole diff.
    """
    old_text = "" if old is None else _decode(old)
    new_text = _decode(new)
    if old_text is None or new_text is None:
        before = 0 if old is None else len(old)
        return f"{path}: binary file changed ({before} -> {len(new)} bytes)"
    diff = list(
        difflib.unified_diff(
            _lines(old_text),
            _lines(new_text),
            fromfile="/dev/null" if old is None else f"a{path}" if path.startswith("/") else path,
            tofile=f"b{path}" if path.startswith("/") else path,
        )
    )
    added = sum(1 for ln in diff if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in diff if ln.startswith("-") and not ln.startswith("---"))
    header = f"{path}: +{added} -{removed} lines" + (" (new file)" if old is None else "")
    if not diff:
        return f"{header} (no changes)"
    body: list[str] = []
    for line in diff:
        if line.endswith("\n"):
            body.append(line[:-1])
        else:
            body.extend([line, "\\ No newline at end of file"])
    kept = body[:max_lines]
    if len(body) > max_lines:
        kept.append(f"... ({len(body) - max_lines} more diff lines not shown)")
    return "\n".join([header, *kept])
