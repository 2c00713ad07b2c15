"""Static analysis of shell command lines: which programs would this string run?

The gateway's command policy (:mod:`agentbox.gateway.policy`) needs the list of every
program a shell string would execute. This module finds it with a real shell parser
(``bashlex``) and then walks the syntax tree, descending into everything that runs code:

* lists, pipelines, ``&``, ``;``, ``&&``, ``||``, subshells ``( )``, groups ``{ }``,
  ``if``/``while``/``until``/``for`` bodies, function bodies, redirections;
* command substitution ``$(…)`` and backticks (nested), process substitution ``<( )``/``>( )``,
  command substitutions inside ``${…}`` and inside unquoted here-documents;
* wrappers that run their argument as a program (``env``, ``xargs``, ``nice``, ``nohup``,
  ``setsid``, ``timeout``, ``stdbuf``, ``time``, ``command``, ``exec``, ``builtin``,
  ``sudo``, ``doas``, ``chroot``, ``busybox``, ``ionice``, ``taskset``, ``unshare``,
  ``flock``, ``watch``, ``su``/``runuser``/``script -c``, ``find -exec``/``-execdir``/``-ok``);
* code passed as a string: ``sh|bash|dash|zsh|ksh|ash|mksh -c STRING``, ``eval``, ``trap``,
  ``alias`` values, ``watch``/``su -c`` (parsed recursively, depth-limited), and code fed to
  such a shell on stdin by a heredoc or here-string (``bash <<'EOF'``, ``sh <<< '…'``).

A shell or interpreter that reads its program from stdin is followed to whatever provides
that stdin - its own redirections, an enclosing group's, the command holding a ``bash -c``
string - and refused as dynamic code when it is a pipe, a descriptor, a substitution or the
caller's stdin (:meth:`_Analyser.settle_stdin`; which programs read stdin is decided in
:mod:`agentbox.gateway.command_rules`, on plain words, as are program identity and option
normalisation, so the parser can be replaced).

bashlex 0.18 is used defensively, because it is wrong in ways that would hide commands:
its quote removal is redone here from the source text (it turns ``'r''m'`` into ``r''m``);
substitutions it truncates (multi-line ``$(…)``, a ``#`` before the ``)``) are detected by
comparing the tree with the source and re-parsed or refused; quoted-delimiter heredocs, which
it cannot parse, are set aside before parsing (:class:`_HeredocTable`); a known infinite loop
is patched and every parse runs under a node budget; leftovers it silently skips are refused.

Program names are normalised: quoting is removed (``r''m``, ``"rm"``, ``\\rm`` → ``rm``),
paths are reduced to their basename (``/usr/bin/rm``, ``./rm``,
``/proc/self/root/usr/bin/rm`` → ``rm``), and ``.`` is reported as ``source``; the words as
written are kept too (:attr:`CommandAnalysis.program_words`), for their identity.

Everything that cannot be decided statically fails closed with :class:`UnparseableCommand`:

* ``unparseable``: parser errors, constructs bashlex does not support (``case``, ``[[ ]]``,
  ``$((…))``, ``time``, ``coproc``, ``select``, arrays), and places where bashlex's tree
  disagrees with the source text (it silently truncates some multi-line ``$(…)``; those
  are re-parsed or rejected, never trusted);
* ``dynamic command name``: the program name contains ``$x``, ``${x}``, ``$(…)``, a glob or a
  brace expansion;
* ``dynamic shell code``: ``eval``/``sh -c``/``trap``/``alias`` with non-literal code, or a
  wrapper/``find`` argument whose meaning depends on a run-time value (``timeout $T rm``);
* ``nesting too deep``: more than :data:`MAX_DEPTH` levels of code-in-a-string;
* ``invalid command``: empty, NUL bytes, longer than :data:`MAX_COMMAND_CHARS`;
* ``function import via environment``: ``env 'BASH_FUNC_x%%=…'``.

This is a guardrail, not a boundary: see the limitations in :mod:`agentbox.gateway.policy`.
"""

from __future__ import annotations

import re
import secrets
import shlex
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from string import ascii_letters, digits
from typing import Any

import bashlex
import bashlex.errors

from agentbox.errors import InvalidRequest
from agentbox.gateway.command_rules import (
    CODE_VARIABLES,
    IDENTITY_VARIABLES,
    OTHER_SHELLS,
    POSIX_SHELLS,
    Word,
    git_globals,
    git_setting_runs,
    normalise_program,
    program_input,
    reads_code,
    script_input,
)

MAX_DEPTH = 8
"""Maximum nesting of code-in-a-string (``bash -c "eval '…'"``, substitutions in heredocs)."""

MAX_COMMAND_CHARS = 100_000
"""Longer command strings are refused outright (the parser is not built for megabytes)."""

RULE_INVALID = "invalid command"
RULE_UNPARSEABLE = "unparseable"
RULE_DYNAMIC_NAME = "dynamic command name"
RULE_DYNAMIC_CODE = "dynamic shell code"
RULE_TOO_DEEP = "nesting too deep"
RULE_FUNC_IMPORT = "function import via environment"

_MAX_COMSUB_CANDIDATES = 256


class UnparseableCommand(InvalidRequest):
    """The command cannot be analysed statically, so the policy refuses it.

    ``rule`` (also in ``details``) says why: one of the ``RULE_*`` constants of this module.
    """

    code = "unparseable_command"

    def __init__(self, message: str, *, rule: str = RULE_UNPARSEABLE, **details: Any) -> None:
        super().__init__(message, rule=rule, **details)
        self.rule = rule
        self.programs: list[str] = list(details.get("programs", []))
        """Programs found before the analysis had to stop (for "deny wins" reporting)."""


class _SuspectParse(Exception):
    """bashlex's tree for a word does not match the source text."""


@dataclass
class CommandAnalysis:
    """Everything the analysis found in one command (in source order, depth first)."""

    programs: list[str] = field(default_factory=list)
    """Normalised names of every program that would run (wrappers and what they wrap)."""
    program_words: list[str] = field(default_factory=list)
    """The same programs as written (``./ls``, ``/usr/bin/rm``), for their identity."""
    path_changed: bool = False
    """The command sets ``PATH`` (or another of ``IDENTITY_VARIABLES``), sources a file that
    may, or re-points a name with ``hash -p``: bare names may run other files."""
    changes_dir: bool = False
    """The command changes directory (``cd``, ``env -C``, …): relative program paths are not
    relative to the tool's working directory."""
    commands: list[tuple[str, ...]] = field(default_factory=list)
    """Each simple command's argv: normalised program name, then the words after quote
    removal; assignments and redirections dropped. A wrapper adds one argv for itself and one
    for the command it runs."""
    dynamic_argvs: set[tuple[str, ...]] = field(default_factory=set)
    """The argvs of :attr:`commands` with a word known only at run time (``rm "$f" x``)."""
    pipelines: list[tuple[tuple[str, ...], ...]] = field(default_factory=list)
    """Each pipeline of two or more commands, as its segments' argvs; once with the outer
    command of each segment and once with the innermost (unwrapped) command."""
    privileged: list[str] = field(default_factory=list)
    """Privilege-escalation wrappers seen (``sudo``, ``doas``)."""

    def unique_programs(self) -> list[str]:
        return list(dict.fromkeys(self.programs))


# --------------------------------------------------------------------------- entry points


def analyse_command(command: str | Sequence[str]) -> CommandAnalysis:
    """Analyse a shell string, or an argv list (``argv[0]`` is the program, no shell parsing).

    Raises :class:`UnparseableCommand` when the command cannot be analysed.
    """
    analyser = _Analyser()
    try:
        try:
            _analyse(analyser, command)
            analyser.heredocs.check_all_consumed()
            if analyser.stdin_readers:
                raise _stdin_code("the caller's stdin", analyser.stdin_readers)
        except RecursionError:
            raise _reject("the command is nested too deeply to analyse", RULE_TOO_DEEP) from None
    except UnparseableCommand as exc:
        exc.programs = analyser.out.unique_programs()
        exc.details["programs"] = exc.programs
        raise
    return analyser.out


def _analyse(analyser: _Analyser, command: str | Sequence[str]) -> None:
    if isinstance(command, str):
        _check_text(command)
        if _is_blank(command):
            raise UnparseableCommand(
                "the command is empty; send the shell command to run", rule=RULE_INVALID
            )
        analyser.shell(command, depth=0, allow_empty=False)
    else:
        argv = list(command)
        if not argv or any(not isinstance(a, str) for a in argv) or argv[0] == "":
            raise UnparseableCommand(
                "the argv is empty or has non-string items; send a non-empty list of strings",
                rule=RULE_INVALID,
            )
        for arg in argv:
            _check_text(arg)
        analyser.argv([Word.literal(a) for a in argv], depth=0)


def programs_in(command: str) -> list[str]:
    """Every program (normalised name, first occurrence order) that ``command`` would run.

    Raises :class:`UnparseableCommand` if the command cannot be analysed statically.
    """
    return analyse_command(command).unique_programs()


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise UnparseableCommand("the command contains a NUL byte; remove it", rule=RULE_INVALID)
    if len(text) > MAX_COMMAND_CHARS:
        raise UnparseableCommand(
            f"the command is longer than {MAX_COMMAND_CHARS} characters; write a script file "
            "and run it instead",
            rule=RULE_INVALID,
        )


def _is_blank(source: str) -> bool:
    return all(not ln.strip() or ln.strip().startswith("#") for ln in source.splitlines())


def _reject(message: str, rule: str = RULE_UNPARSEABLE) -> UnparseableCommand:
    return UnparseableCommand(message, rule=rule)


# --------------------------------------------------------------------------- parsing


class _ParseBudgetExceeded(Exception):
    """bashlex created far more nodes than the input can justify (a parser loop)."""


_budget = threading.local()
_NODE_BUDGET_BASE = 5_000
_NODE_BUDGET_PER_CHAR = 20


def _install_bashlex_guards() -> None:
    """Make bashlex 0.18's known runaway loops fail instead of eating all memory.

    * ``_paramexpand`` does ``string.find("}")`` without checking for -1, so an unclosed
      ``${`` that reaches it (e.g. inside ``$'…'``) restarts the word from index 0 forever;
    * as a safety net for loops not yet known, every parse gets a node budget
      (:func:`_bashlex_parse`).
    """
    subst = bashlex.subst
    if getattr(subst, "_agentbox_guarded", False):
        return
    paramexpand = subst._paramexpand

    def guarded_paramexpand(parserobj: Any, string: str, sindex: int) -> Any:
        if string.startswith("${", sindex) and string.find("}", sindex + 2) == -1:
            raise bashlex.errors.ParsingError("bad substitution: no closing '}'", string, sindex)
        return paramexpand(parserobj, string, sindex)

    node_init = bashlex.ast.node.__init__

    def counted_init(self: Any, **kwargs: Any) -> None:
        left = getattr(_budget, "nodes", None)
        if left is not None:
            if left <= 0:
                raise _ParseBudgetExceeded()
            _budget.nodes = left - 1
        node_init(self, **kwargs)

    subst._paramexpand = guarded_paramexpand
    bashlex.ast.node.__init__ = counted_init
    subst._agentbox_guarded = True


def _bashlex_parse(src: str) -> list[Any]:
    """bashlex.parse under a node budget proportional to the input size."""
    _budget.nodes = _NODE_BUDGET_BASE + _NODE_BUDGET_PER_CHAR * len(src)
    try:
        return list(bashlex.parse(src))
    finally:
        _budget.nodes = None


_install_bashlex_guards()


_NOT_SUPPORTED_HINTS = (
    ("time", "the `time` keyword (drop it, or use `command time …`)"),
    ("pattern", "`case … esac` (use if/elif)"),
    ("arithmetic", "arithmetic expansion `$((…))`/`$[…]` (compute it in a separate command)"),
    ("coproc", "`coproc`"),
    ("select", "`select`"),
)


def _parse(source: str, heredocs: _HeredocTable) -> tuple[list[Any], str]:
    """bashlex.parse with safety checks; returns the trees and the source they index.

    Quoted-delimiter heredocs are rewritten first (see :func:`_prepare_heredocs`), and the
    trees are checked against the source: bashlex must have consumed all of it, and every
    heredoc must end where bash would end it.
    """
    src = _prepare_heredocs(source, heredocs)
    try:
        trees = _bashlex_parse(src)
    except _ParseBudgetExceeded:
        raise _reject("the parser could not handle this command; simplify it") from None
    except bashlex.errors.ParsingError as exc:
        raise _reject(_parse_error_reason(src, str(exc))) from None
    except NotImplementedError as exc:
        text = str(exc)
        hint = next((h for key, h in _NOT_SUPPORTED_HINTS if key in text), text)
        raise _reject(
            f"cannot analyse this command: the policy's shell parser does not support {hint}; "
            "rewrite it with simpler constructs"
        ) from None
    except RecursionError:
        raise _reject("the command is nested too deeply to analyse", RULE_TOO_DEEP) from None
    except Exception as exc:  # bashlex raises assorted internal errors on odd input
        raise _reject(_parse_error_reason(src, f"{type(exc).__name__}: {exc}")) from None
    _check_coverage(src, trees)
    _check_heredocs(trees, heredocs)
    return trees, src


def _parse_error_reason(src: str, detail: str) -> str:
    hint = ""
    if "[[" in src:
        hint = "; `[[ … ]]` is not supported, use `[ … ]` or `test`"
    elif re.search(r"\w=\(", src):
        hint = "; array assignments are not supported"
    return (
        f"cannot parse this shell command ({detail}){hint}; check quoting and brackets, "
        "or split it into simpler commands"
    )


@dataclass
class _HeredocTable:
    """Bodies of quoted-delimiter heredocs, taken out of the source before bashlex sees it.

    Each body is replaced by one placeholder line (with a per-analysis random nonce, so a
    command cannot forge one); a heredoc whose whole body is a placeholder gets the original
    body back. Every entry must be consumed by a real heredoc before the analysis is trusted.
    """

    nonce: str = ""  # drawn at the first heredoc: most commands have none
    entries: list[tuple[str, str]] = field(default_factory=list)  # (delimiter, body)
    consumed: set[int] = field(default_factory=set)

    def add(self, delim: str, body: str) -> str:
        if not self.nonce:
            self.nonce = secrets.token_hex(8)
        self.entries.append((delim, body))
        return f"__agentbox_heredoc_{self.nonce}_{len(self.entries) - 1}__"

    def lookup(self, line: str, delim: str) -> str | None:
        if not self.entries:
            return None
        prefix = f"__agentbox_heredoc_{self.nonce}_"
        if not (line.startswith(prefix) and line.endswith("__")):
            return None
        index = line[len(prefix) : -2]
        if not index.isdigit() or int(index) >= len(self.entries):
            return None
        entry = self.entries[int(index)]
        if entry[0] != delim:
            return None
        self.consumed.add(int(index))
        return entry[1]

    def check_all_consumed(self) -> None:
        if len(self.consumed) != len(self.entries):
            raise _reject(
                "a `<<` could not be matched to a here-document; put the heredoc in a simpler "
                "command, or quote the `<<` if it is text"
            )


_HEREDOC_OP = re.compile(r"(?<!<)<<(?!<)(-?)[ \t]*([^\s;&|<>()]+)")
_SAFE_DELIMITER = re.compile(r"[A-Za-z0-9_.,:+/@%^=-]+")


def _dequote_delimiter(raw: str) -> str | None:
    try:
        parts = shlex.split(raw)
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 and parts[0] else None


def _prepare_heredocs(src: str, table: _HeredocTable) -> str:
    """Rewrite ``<<'EOF' body EOF`` to ``<<EOF <placeholder> EOF`` (see :class:`_HeredocTable`).

    bashlex mishandles quoted delimiters (it wants the terminator line *with* the quotes, and
    its tokenizer and parser disagree inside ``$(…)``). A quoted heredoc's body is data that
    bash does not expand, so it is set aside. An operator found inside a string or comment
    is rewritten too, but then no heredoc consumes its placeholder and the command is refused.
    """
    pos = 0
    line_nl, next_body = -1, -1  # heredocs sharing an operator line have consecutive bodies
    while (op := _HEREDOC_OP.search(src, pos)) is not None:
        pos = op.end()
        raw = op.group(2)
        quoted = any(q in raw for q in "'\"\\")
        delim = _dequote_delimiter(raw) if quoted else raw
        nl = src.find("\n", op.end())
        if delim is None or nl == -1:
            continue
        body_start = next_body if nl == line_nl else nl + 1
        term = _find_terminator(src, body_start, delim, strip_tabs=op.group(1) == "-")
        if term is None:
            continue
        term_end = src.find("\n", term)
        line_nl, next_body = nl, (len(src) if term_end == -1 else term_end + 1)
        if not quoted or not _SAFE_DELIMITER.fullmatch(delim):
            continue
        body = src[body_start:term]
        placeholder = table.add(delim, body) + "\n"
        src = src[: op.start(2)] + delim + src[op.end(2) : body_start] + placeholder + src[term:]
        line_nl += len(delim) - len(raw)
        next_body += len(delim) - len(raw) + len(placeholder) - len(body)
        pos = op.start(2) + len(delim)
    return src


def _find_terminator(src: str, start: int, delim: str, strip_tabs: bool) -> int | None:
    scan = start
    while scan <= len(src):
        end = src.find("\n", scan)
        line = src[scan:] if end == -1 else src[scan:end]
        if (line.lstrip("\t") if strip_tabs else line) == delim:
            return scan
        if end == -1:
            return None
        scan = end + 1
    return None


def _nodes(node: Any) -> Iterator[Any]:
    """Every bashlex node in the subtree, generically (any attribute holding nodes)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(_children(n))


def _children(node: Any) -> list[Any]:
    out: list[Any] = []
    for value in vars(node).values():
        if isinstance(value, bashlex.ast.node):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, bashlex.ast.node))
    return out


def _max_end(node: Any) -> int:
    return max((n.pos[1] for n in _nodes(node) if hasattr(n, "pos")), default=0)


def _check_coverage(src: str, trees: list[Any]) -> None:
    """bashlex.parse stops silently at a chunk it cannot turn into a node: refuse leftovers."""
    end = max((_max_end(t) for t in trees), default=0)
    for line in src[end:].split("\n"):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and stripped not in (";", "&"):
            raise _reject(f"part of the command was not understood by the parser: {stripped!r}")


def _heredoc_delimiter(redirect: Any) -> tuple[str, bool]:
    raw = str(getattr(redirect.output, "word", ""))
    quoted = any(q in raw for q in "'\"\\")
    delim = _dequote_delimiter(raw) if quoted else raw
    if not delim:
        raise _reject("a here-document delimiter could not be understood; use <<'EOF'")
    return delim, quoted


def _check_heredocs(trees: list[Any], table: _HeredocTable) -> None:
    """Every heredoc must end where bash ends it; restore set-aside bodies.

    Redirects whose body is a placeholder get ``agentbox_body`` (the original body) set on the
    node; the analyser treats those bodies as data (or as code for ``bash <<'EOF'``).
    """
    for tree in trees:
        for n in _nodes(tree):
            if n.kind != "redirect" or getattr(n, "heredoc", None) is None:
                continue
            delim, _ = _heredoc_delimiter(n)
            lines = str(n.heredoc.value).split("\n")
            body = table.lookup(lines[0], delim) if len(lines) == 2 else None
            if body is not None:
                n.agentbox_body = body
            elif delim in lines[:-1]:
                raise _reject(
                    "a here-document was not parsed the way bash reads it; put it in a simpler "
                    "command"
                )


# --------------------------------------------------------------------------- words

_SUBSTITUTIONS = frozenset({"commandsubstitution", "processsubstitution"})
_EXPANSIONS = _SUBSTITUTIONS | {"parameter"}
_METACHARS = frozenset(" \t\n;&|()<>")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_IDENTITY_ASSIGNMENT = re.compile(rf"(?:{'|'.join(sorted(IDENTITY_VARIABLES))})\+?=")
_CODE_ASSIGNMENT = re.compile(rf"(?:{'|'.join(sorted(CODE_VARIABLES))})\+?=")
_IDENTITY_NAME = re.compile(rf"(?<![A-Za-z0-9_])(?:{'|'.join(sorted(IDENTITY_VARIABLES))})\b")
_VARIABLE_BUILTINS = frozenset(
    {"export", "declare", "typeset", "local", "readonly", "unset", "read", "printf", "mapfile",
     "readarray", "getopts", "env"}
)  # fmt: skip
"""Programs that can set a variable named in their arguments (``export PATH=…``)."""


def _make_word(node: Any, src: str) -> Word:
    """A :class:`Word` from a bashlex word/assignment node, re-read from the source text.

    bashlex's own quote removal is wrong for mixed quoting (``'r''m'`` → ``r''m``,
    ``"it's"`` → ``its``), so the text is rebuilt here with bash's rules: ``'…'`` literal,
    ``"…"`` with ``\\`` escaping only ``$ ` " \\`` and newline, ``\\x`` → ``x`` outside quotes,
    ``$'…'``/``$"…"`` (kept verbatim, marked dynamic). Expansion parts bashlex reports inside
    single quotes are literal text. Unquoted shell metacharacters in the literal text mean
    bashlex mis-parsed the word (it truncates some substitutions): :class:`_SuspectParse`.
    """
    start, end = node.pos
    parts = sorted(getattr(node, "parts", []), key=lambda p: p.pos[0])
    out: list[str] = []
    dynamic = unsafe = False
    squote = dquote = ansi = False
    brace_depth, brace_sep = 0, False
    i, k = start, 0
    while i < end:
        if k < len(parts) and i >= parts[k].pos[0]:
            part = parts[k]
            k += 1
            if squote or ansi:
                continue  # bashlex artefact: literal text inside quotes
            p0, p1 = part.pos
            if part.kind == "tilde":
                out.append(src[p0:p1])
            elif part.kind == "parameter" and src.startswith(("$'", '$"'), p0) and not dquote:
                dynamic = True  # ANSI-C / locale string: its value is not worked out here
                out.append(src[p0 : p0 + 2])
                ansi, dquote = src[p0 + 1] == "'", src[p0 + 1] == '"'
                i = p0 + 2
                continue
            else:
                dynamic = True
                unsafe = unsafe or not dquote
                out.append(src[p0:p1])
            i = max(i, p1)
            continue
        c = src[i]
        nxt = src[i + 1] if i + 1 < end else ""
        if squote:
            squote = c != "'"
            if squote:
                out.append(c)
        elif ansi:
            if c == "\\" and nxt:
                out.append(c + nxt)
                i += 2
                continue
            ansi = c != "'"
            out.append(c)
        elif c == "\\" and nxt:
            if nxt != "\n":
                keep = dquote and nxt not in '$`"\\'
                out.append(c + nxt if keep else nxt)
            i += 2
            continue
        elif dquote:
            dquote = c != '"'
            if dquote:
                out.append(c)
        elif c == "'":
            squote = True
        elif c == '"':
            dquote = True
        elif c in _METACHARS:
            raise _SuspectParse()
        else:
            out.append(c)
            if c in "*?[":
                unsafe = True
            elif c == "{":
                brace_depth += 1
            elif c == "}" and brace_depth:
                brace_depth -= 1
                unsafe = unsafe or brace_sep
            elif brace_depth and (c == "," or src.startswith("..", i)):
                brace_sep = True
        i += 1
    if squote or dquote or ansi:
        raise _SuspectParse()
    return Word(text="".join(out), raw=src[start:end], dynamic=dynamic, unsafe=unsafe)


def _substitution_sound(node: Any, src: str) -> bool:
    """Does bashlex's substitution node span exactly ``$(…)``/`` `…` ``/``<(…)`` in the source,
    with nothing but separators between the parsed command and the closing bracket?"""
    start, end = node.pos
    text = src[start:end]
    opener, closer = ("`", "`") if text[:1] == "`" else (text[:2], ")")
    if opener not in ("$(", "<(", ">(", "`") or len(text) < len(opener) + 1:
        return False
    if not text.endswith(closer):
        return False
    inner_end = _max_end(node.command)
    return inner_end <= end - 1 and re.fullmatch(r"[\s;&]*", src[inner_end : end - 1]) is not None


# --------------------------------------------------------------------------- wrappers


@dataclass(frozen=True)
class _Opts:
    """getopt-style option syntax of a wrapper (all of them stop at the first operand)."""

    short_arg: str = ""
    long_arg: frozenset[str] = frozenset()
    positionals: int = 0
    default: tuple[str, ...] = ()
    no_program: frozenset[str] = frozenset()  # options after which nothing is run


_SIMPLE_WRAPPERS: dict[str, _Opts] = {
    "nice": _Opts("n", frozenset({"--adjustment"})),
    "nohup": _Opts(),
    "setsid": _Opts(),
    "timeout": _Opts("sk", frozenset({"--signal", "--kill-after"}), positionals=1),
    "stdbuf": _Opts("ioe", frozenset({"--input", "--output", "--error"})),
    "time": _Opts("fo", frozenset({"--format", "--output"})),
    "command": _Opts(no_program=frozenset({"-v", "-V"})),
    "exec": _Opts("a"),
    "builtin": _Opts(),
    "doas": _Opts("uC", no_program=frozenset({"-C"})),
    "chroot": _Opts("", frozenset({"--userspec", "--groups"}), positionals=1),
    "ionice": _Opts(
        "cnpPu",
        frozenset({"--class", "--classdata", "--pid", "--pgid", "--uid"}),
        no_program=frozenset({"-p", "-P", "-u", "--pid", "--pgid", "--uid"}),
    ),
    "taskset": _Opts("", positionals=1, no_program=frozenset({"-p", "--pid"})),
    "unshare": _Opts("SGRw", frozenset({"--setuid", "--setgid", "--root", "--wd"})),
    "xargs": _Opts(
        "aEILnPsd",
        frozenset(
            {
                "--arg-file",
                "--delimiter",
                "--max-args",
                "--max-procs",
                "--max-chars",
                "--process-slot-var",
            }
        ),
        default=("echo",),
    ),
}
_SUDO = _Opts(
    "ugCDprtTUR",
    frozenset(
        {
            "--user",
            "--group",
            "--close-from",
            "--chdir",
            "--prompt",
            "--role",
            "--type",
            "--command-timeout",
            "--other-user",
            "--chroot",
            "--host",
        }
    ),
    no_program=frozenset({"-e", "--edit", "-V", "--version", "-K", "--remove-timestamp"}),
)
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_FIND_ARG_PRIMARIES = (
    "-name -iname -path -ipath -wholename -iwholename -regex -iregex -lname -ilname -perm "
    "-type -xtype -user -group -uid -gid -size -mtime -atime -ctime -mmin -amin -cmin -used "
    "-links -inum -samefile -maxdepth -mindepth -fstype -printf -fprint -fprint0 -fls "
    "-context -regextype -files0-from -anewer -cnewer"
)
_FIND_ARG = frozenset(_FIND_ARG_PRIMARIES.split())
_EVAL_TEXT_BUILTINS = frozenset(
    {"let", "declare", "typeset", "local", "export", "readonly", "unset", "read", "test", "[",
     "mapfile", "readarray"}
)  # fmt: skip


@dataclass(frozen=True)
class _OptResult:
    index: int | None  # where the program is in args (None: nothing is run)
    values: dict[str, str]


def _is_option(text: str) -> bool:
    return text.startswith("-") and text != "-"


def _stdin_code(where: str, readers: Iterable[str]) -> UnparseableCommand:
    program = "`" + "`, `".join(dict.fromkeys(readers)) + "`"
    return _reject(
        f"{program} would read its program from {where}: code the policy cannot see. Pass the "
        "code in the command (`bash -c '…'`, a quoted heredoc), or run a script file",
        RULE_DYNAMIC_CODE,
    )


# A word whose first character is one of these, written literally, cannot expand to an
# option whatever its globs or variables become (`/tmp/out/*`, `a*.txt`, `~/x`).
_LITERAL_START = frozenset(ascii_letters + digits + "/._~+,:=@%")


def _may_become_option(word: Word) -> bool:
    """A run-time word (variable, substitution, glob) that could turn into ``-rf``."""
    if not (word.dynamic or word.unsafe):
        return False
    first = word.text[:1]
    return not (first in _LITERAL_START and word.raw[:1] == first)


def _before_end_of_options(args: Sequence[Word]) -> Sequence[Word]:
    """The words before a literal ``--`` (after it, nothing is an option)."""
    for i, w in enumerate(args):
        if w.raw == "--":
            return args[:i]
    return args


def _dynamic_code(what: str) -> UnparseableCommand:
    return _reject(
        f"cannot check {what}: it depends on values only known at run time; write it with "
        "literal words",
        RULE_DYNAMIC_CODE,
    )


def _parse_options(
    name: str,
    args: Sequence[Word],
    spec: _Opts,
    is_operand_skippable: Callable[[Word], bool] | None = None,
) -> _OptResult:
    """Find the program among a wrapper's arguments, getopt style (stops at first operand)."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        w = args[i]
        if w.dynamic or w.unsafe:
            if is_operand_skippable and is_operand_skippable(w):
                i += 1
                continue
            raise _dynamic_code(f"the arguments of `{name}`")
        t = w.text
        if t == "--":
            i += 1
            break
        if not _is_option(t):
            if is_operand_skippable and is_operand_skippable(w):
                i += 1
                continue
            break
        if t.startswith("--"):
            opt, eq, value = t.partition("=")
            if not eq and opt in spec.long_arg:
                value = _option_argument(name, args, i + 1)
                i += 1
            values[opt] = value
            if opt in spec.no_program:
                return _OptResult(None, values)
            i += 1
            continue
        letters = t[1:]
        for pos, ch in enumerate(letters):
            if f"-{ch}" in spec.no_program:
                return _OptResult(None, values)
            if ch in spec.short_arg:
                rest = letters[pos + 1 :]
                if not rest:
                    rest = _option_argument(name, args, i + 1)
                    i += 1
                values[f"-{ch}"] = rest
                break
            values[f"-{ch}"] = ""
        i += 1
    for _ in range(spec.positionals):
        if i >= len(args):
            return _OptResult(None, values)
        if args[i].dynamic or args[i].unsafe:
            raise _dynamic_code(f"the arguments of `{name}`")
        i += 1
    while is_operand_skippable and i < len(args) and is_operand_skippable(args[i]):
        i += 1
    return _OptResult(i if i < len(args) else None, values)


def _option_argument(name: str, args: Sequence[Word], i: int) -> str:
    if i >= len(args):
        return ""
    if args[i].unsafe:  # may split into several words and shift everything after it
        raise _dynamic_code(f"an option value of `{name}`")
    return args[i].text


# --------------------------------------------------------------------------- analyser


class _Analyser:
    def __init__(self) -> None:
        self.out = CommandAnalysis()
        self.heredocs = _HeredocTable()
        self.stdin_readers: dict[str, str] = {}
        """Programs found that read their program from stdin, whose stdin is not settled yet
        (see :meth:`settle_stdin`): name → ``shell`` (POSIX), ``foreign`` (other shells) or
        ``interpreter``."""
        self.placeholders: tuple[str, ...] = ()
        """Text that ``xargs -I``/``find -exec`` replace with run-time input, in scope."""

    # ---- strings of shell code

    def shell(self, source: str, depth: int, allow_empty: bool = True) -> None:
        if depth > MAX_DEPTH:
            raise _reject(
                f"code nested more than {MAX_DEPTH} levels deep (sh -c / eval / substitutions); "
                "flatten it",
                RULE_TOO_DEEP,
            )
        _check_text(source)
        if _is_blank(source):
            if allow_empty:
                return
            raise _reject("the command is empty; send the shell command to run", RULE_INVALID)
        trees, src = _parse(source, self.heredocs)
        for tree in trees:
            self.walk(tree, src, depth)

    # ---- tree walking

    def walk(self, node: Any, src: str, depth: int) -> list[tuple[str, ...]]:
        """Analyse one node; returns the argvs of a simple command (else [])."""
        kind = node.kind
        if kind == "command":
            return self.command(node, src, depth)
        if kind == "pipeline":
            self.pipeline(node, src, depth)
        elif kind == "compound":
            self.compound(node, src, depth)
        elif kind in ("word", "assignment"):
            self.word(node, src, depth)
        elif kind in _SUBSTITUTIONS:
            self.substitution(partial(self.walk, node.command, src, depth))
        elif kind == "parameter":
            self.text_substitutions(str(getattr(node, "value", "")), depth, "${…}")
        elif kind == "redirect":
            self.redirect(node, src, depth)
        elif kind in ("operator", "reservedword", "pipe", "tilde"):
            pass
        else:  # list, if, for, while, until, function, and anything unknown
            for child in _children(node):
                self.walk(child, src, depth)
        return []

    def command(self, node: Any, src: str, depth: int) -> list[tuple[str, ...]]:
        words: list[Word] = []
        for part in node.parts:
            if part.kind == "word":
                words.append(self.word(part, src, depth))
            elif part.kind == "assignment":
                self.assignment(self.word(part, src, depth), depth)
            else:
                self.walk(part, src, depth)
        if not words:
            return []
        outer, self.stdin_readers = self.stdin_readers, {}
        argvs = self.argv(words, depth)
        self.settle_stdin(node.parts, src, depth)
        self.stdin_readers = outer | self.stdin_readers
        return argvs

    def assignment(self, word: Word, depth: int) -> None:
        """``NAME=value`` (before a command, or for ``export``/``env``/``sudo``/…)."""
        if _IDENTITY_ASSIGNMENT.match(word.text):
            self.out.path_changed = True
        if _CODE_ASSIGNMENT.match(word.text):
            name, _, value = word.text.partition("=")
            code = None if word.dynamic or word.unsafe else Word.literal(value)
            self.code_string(f"`{name.rstrip('+')}=`", code, depth)

    def settle_stdin(self, parts: Sequence[Any], src: str, depth: int) -> None:
        """Decide on programs that read their program from stdin, given these redirections.

        A literal heredoc or here-string is code in the command text: analysed when a POSIX
        shell reads it. A regular file is a script file (like ``bash FILE``). The caller's
        stdin (no redirection, ``< /dev/stdin``, ``<&0``) is decided by the enclosing
        command, compound or pipeline (:meth:`pipeline`, :func:`analyse_command`). Any other
        descriptor is code the policy cannot see.
        """
        if not self.stdin_readers:
            return
        redirect = next(
            (
                p
                for p in reversed(parts)
                if p.kind == "redirect"
                and p.type.startswith("<")
                and getattr(p, "input", 0) in (None, 0)
            ),
            None,
        )
        if redirect is None:
            return
        heredoc = getattr(redirect, "heredoc", None)
        if heredoc is not None:
            body = getattr(redirect, "agentbox_body", None)
            if body is None:  # unquoted: drop the terminator line
                body = "\n".join(str(heredoc.value).split("\n")[:-1])
            self.stdin_text(body, depth)
        elif redirect.type == "<<<" and isinstance(redirect.output, bashlex.ast.node):
            word = self.word(redirect.output, src, depth)
            if word.dynamic or word.unsafe:
                raise _dynamic_code("the code fed to the program on stdin")
            self.stdin_text(word.text, depth)
        elif redirect.type == "<&":
            target = getattr(redirect, "output", 0)
            if target == 0:
                return  # the same stdin
            if target != "-":
                raise _stdin_code("a duplicated file descriptor", self.stdin_readers)
        elif isinstance(getattr(redirect, "output", None), bashlex.ast.node):
            source = script_input(self.word(redirect.output, src, depth))
            if source == "stdin":
                return
            if source != "elsewhere":
                raise _stdin_code("a pipe or descriptor", self.stdin_readers)
        self.stdin_readers = {}

    def stdin_text(self, code: str, depth: int) -> None:
        if "foreign" in self.stdin_readers.values():
            raise _reject("code fed to a non-POSIX shell cannot be analysed; use bash or sh")
        if "shell" in self.stdin_readers.values():
            self.shell(code, depth + 1)
        # an interpreter's code in the command text is not analysed, like `python3 -c CODE`

    def substitution(self, run: Callable[[], object]) -> None:
        """Run an analysis of ``$(…)``/``<(…)`` code: its stdin is the caller's, unseen."""
        outer, self.stdin_readers = self.stdin_readers, {}
        run()
        if self.stdin_readers:
            raise _stdin_code("the caller's stdin (inside a substitution)", self.stdin_readers)
        self.stdin_readers = outer

    def pipeline(self, node: Any, src: str, depth: int) -> None:
        outer: list[tuple[str, ...]] = []
        inner: list[tuple[str, ...]] = []
        readers = self.stdin_readers
        for part in node.parts:
            if part.kind in ("pipe", "reservedword"):
                continue
            self.stdin_readers = {}
            argvs = self.walk(part, src, depth)
            if self.stdin_readers and outer:
                raise _stdin_code("a pipe", self.stdin_readers)
            readers = readers | self.stdin_readers
            if not argvs:
                argvs = [tuple(src[part.pos[0] : part.pos[1]].split())]
            outer.append(argvs[0])
            inner.append(argvs[-1])
        self.stdin_readers = readers
        if len(outer) > 1:
            self.out.pipelines.append(tuple(outer))
            if inner != outer:
                self.out.pipelines.append(tuple(inner))

    def compound(self, node: Any, src: str, depth: int) -> None:
        items = list(getattr(node, "list", []))
        if (
            len(items) >= 2
            and items[0].kind == "reservedword"
            and items[0].word == "("
            and items[1].kind == "compound"
            and items[1].list
            and items[1].list[0].kind == "reservedword"
            and items[1].list[0].word == "("
            and items[1].list[0].pos[0] == items[0].pos[1]
        ):
            raise _reject(
                "cannot analyse this command: the arithmetic command `(( … ))` is not supported; "
                "use `[ … ]` or `test`"
            )
        outer, self.stdin_readers = self.stdin_readers, {}
        for child in _children(node):
            self.walk(child, src, depth)
        self.settle_stdin(getattr(node, "redirects", []), src, depth)  # `{ sh; } <<< code`
        self.stdin_readers = outer | self.stdin_readers

    def expansions(self, node: Any, src: str, depth: int) -> None:
        for part in getattr(node, "parts", []):
            self.walk(part, src, depth)

    def redirect(self, node: Any, src: str, depth: int) -> None:
        output = getattr(node, "output", None)
        heredoc = getattr(node, "heredoc", None)
        if heredoc is not None:
            if not hasattr(node, "agentbox_body"):  # unquoted: $(…), `…`, ${…} are expanded
                body = "\n".join(str(heredoc.value).split("\n")[:-1])
                self.text_substitutions(body, depth, "an unquoted here-document")
            return
        if isinstance(output, bashlex.ast.node):
            self.walk(output, src, depth)

    def word(self, node: Any, src: str, depth: int) -> Word:
        """A word node as a :class:`Word`, with its substitutions analysed.

        bashlex truncates some substitutions (multi-line ``$(…)``, a comment before ``)``)
        while the tokenizer still finds the word's true extent; such words are recovered by
        re-parsing the substitution's text when the whole word is one substitution, and
        refused otherwise.
        """
        try:
            word = _make_word(node, src)
            subs = [p for p in getattr(node, "parts", []) if p.kind in _SUBSTITUTIONS]
            if not all(_substitution_sound(p, src) for p in subs):
                raise _SuspectParse()
        except _SuspectParse:
            return self.recover_word(node, src, depth)
        self.expansions(node, src, depth)
        return word

    def recover_word(self, node: Any, src: str, depth: int) -> Word:
        raw = src[node.pos[0] : node.pos[1]]
        body = raw
        if node.kind == "assignment":
            match = re.match(r"[A-Za-z_][A-Za-z0-9_]*\+?=", body)
            body = body[match.end() :] if match else body
        quoted = len(body) >= 2 and body[0] == '"' and body[-1] == '"'
        if quoted:
            body = body[1:-1]
        if body[:2] in ("$(", "<(", ">(") and body.endswith(")"):
            self.substitution(partial(self.shell, body[2:-1], depth + 1))
            return Word(text=raw, raw=raw, dynamic=True, unsafe=not quoted)
        if len(body) >= 2 and body[0] == "`" and body[-1] == "`" and "`" not in body[1:-1]:
            code = re.sub(r"\\([$`\\])", r"\1", body[1:-1])
            self.substitution(partial(self.shell, code, depth + 1))
            return Word(text=raw, raw=raw, dynamic=True, unsafe=not quoted)
        raise _reject(
            f"the parser's view of this command disagrees with its text (near {raw[:40]!r}); "
            "split it into simpler commands"
        )

    def text_substitutions(self, text: str, depth: int, where: str) -> None:
        """Find and analyse ``$(…)`` and backticks in text that bash expands (heredoc, ``${}``)."""
        if where == "${…}" and ("<(" in text or ">(" in text):
            raise _reject(f"process substitution inside {where} is not analysed; simplify it")
        i = 0
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if text.startswith(("$((", "$["), i):
                raise _reject(
                    f"arithmetic expansion inside {where} is not supported by the analyser; "
                    "compute it in a separate command"
                )
            if c == "`":
                j, buf = i + 1, []
                while j < len(text) and text[j] != "`":
                    if text[j] == "\\" and j + 1 < len(text):
                        nxt = text[j + 1]
                        buf.append(nxt if nxt in "$`\\" else text[j : j + 2])
                        j += 2
                        continue
                    buf.append(text[j])
                    j += 1
                if j >= len(text):
                    raise _reject(f"unterminated backquote inside {where}")
                self.substitution(partial(self.shell, "".join(buf), depth + 1))
                i = j + 1
                continue
            if text.startswith("$(", i):
                i = self._comsub_in_text(text, i, depth, where)
                continue
            i += 1

    def _comsub_in_text(self, text: str, i: int, depth: int, where: str) -> int:
        """Analyse the ``$(…)`` starting at ``text[i]``; return the index after it."""
        tried = 0
        for j in range(i + 2, len(text)):
            if text[j] != ")":
                continue
            tried += 1
            if tried > _MAX_COMSUB_CANDIDATES:
                break
            candidate = ": " + text[i : j + 1]
            try:
                trees = _bashlex_parse(candidate)
            except _ParseBudgetExceeded:
                raise _reject("the parser could not handle this command; simplify it") from None
            except Exception:  # not closed yet: try the next ")"
                trees = []
            node = trees[0] if len(trees) == 1 else None
            if (
                node is not None
                and node.kind == "command"
                and len(node.parts) == 2
                and node.parts[1].kind == "word"
                and node.parts[1].pos[1] == len(candidate)
            ):
                code = text[i + 2 : j]
                self.substitution(partial(self.shell, code, depth + 1))
                return j + 1
        raise _reject(f"a $(…) inside {where} could not be parsed; simplify it")

    # ---- argv level: program names and wrappers

    def program_name(self, word: Word, context: str = "") -> str:
        text = word.text
        if word.dynamic or (word.unsafe and text not in ("[", "[[")):
            raise _reject(
                f"the program name {word.raw!r}{context} is computed at run time "
                "(variable, substitution, glob or brace expansion), so the policy cannot check "
                "it; write the program name literally",
                RULE_DYNAMIC_NAME,
            )
        name = normalise_program(text)
        if not name or name == "..":
            raise _reject(f"{word.raw!r} is not a valid program name", RULE_INVALID)
        return name

    def argv(self, words: Sequence[Word], depth: int) -> list[tuple[str, ...]]:
        """Record the program of an argv (and what it wraps); return their argvs."""
        name = self.program_name(words[0])
        args = list(words[1:])
        self.out.programs.append(name)
        self.out.program_words.append(words[0].text)
        argv = (name, *(w.text for w in args))
        self.out.commands.append(argv)
        if any(_may_become_option(w) for w in _before_end_of_options(args)):
            self.out.dynamic_argvs.add(argv)
        if name in ("cd", "pushd", "popd") or (
            name in ("env", "sudo", "unshare")
            and any(w.text.startswith(("-C", "-D", "--chdir", "--wd")) for w in args)
        ):
            self.out.changes_dir = True
        if name in _VARIABLE_BUILTINS or name == "sudo":
            for w in args:
                self.assignment(w, depth)
        if name == "source" or (
            name in _VARIABLE_BUILTINS
            and any(_IDENTITY_NAME.search(w.text) for w in args)
            and (name != "printf" or (args and args[0].text == "-v"))
        ):
            self.out.path_changed = True
        if reads_code(name):
            source = program_input(name, args)
            if source == "stdin":
                kind = "shell" if name in POSIX_SHELLS or name == "source" else "interpreter"
                self.stdin_readers[name] = "foreign" if name in OTHER_SHELLS else kind
            elif source != "elsewhere":
                raise _stdin_code(
                    "a file descriptor, a pipe or a path known only at run time", [name]
                )
        inner = self.wrapped(name, args, depth)
        return [argv, *inner]

    def wrapped(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        printf_v = name == "printf" and len(args) > 1 and args[0].text == "-v"
        if name in _EVAL_TEXT_BUILTINS or printf_v:
            for w in args[1:2] if printf_v else args:
                if not w.dynamic and ("$(" in w.text or "`" in w.text):
                    raise _reject(
                        f"`{name}` may evaluate {w.text!r} (array subscripts and arithmetic run "
                        "$(…)); the analyser cannot check that, so rewrite it"
                    )
        if name in _SIMPLE_WRAPPERS:
            spec = _SIMPLE_WRAPPERS[name]
            res = _parse_options(name, args, spec)
            if res.index is None:
                if spec.default and "-I" not in res.values:
                    return self.argv([Word.literal(p) for p in spec.default], depth)
                return []
            if name == "xargs":
                repl = res.values.get("-I") or ("{}" if "-i" in res.values else "")
                if repl and repl in args[res.index].text:
                    raise _reject(
                        "xargs substitutes input into the program name, so the policy cannot "
                        "check it",
                        RULE_DYNAMIC_NAME,
                    )
                return self.with_placeholders((repl,) if repl else (), args[res.index :], depth)
            return self.argv(args[res.index :], depth)
        handler = _HANDLERS.get(name)
        if handler is not None:
            return handler(self, name, args, depth)
        return []

    def with_placeholders(
        self, placeholders: tuple[str, ...], argv: Sequence[Word], depth: int
    ) -> list[tuple[str, ...]]:
        saved = self.placeholders
        self.placeholders = (*saved, *placeholders)
        try:
            return self.argv(argv, depth)
        finally:
            self.placeholders = saved

    def code_string(self, what: str, code: Word | None, depth: int) -> None:
        """Analyse shell code passed as a string (``sh -c``, ``su -c``, ``trap``, …)."""
        if code is None:
            raise _reject(
                f"{what} has no literal code: it would come from input at run time, so the "
                "policy cannot check it; pass the code as a literal string",
                RULE_DYNAMIC_CODE,
            )
        if code.dynamic or code.unsafe:
            raise _dynamic_code(f"the code given to {what}")
        if any(p and p in code.text for p in self.placeholders):
            raise _dynamic_code(
                f"the code given to {what} (xargs/find insert file names or input into it)"
            )
        self.shell(code.text, depth + 1)

    # ---- special wrappers

    def h_env(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        words = list(args)
        i, options_done = 0, False
        while i < len(words):
            w = words[i]
            t = w.text
            if w.dynamic or w.unsafe:
                if not w.unsafe and _ASSIGNMENT.match(w.raw):
                    i += 1
                    continue
                raise _dynamic_code(f"the arguments of `{name}`")
            if not options_done and t == "--":
                options_done = True
                i += 1
                continue
            if not options_done and _is_option(t):
                split: str | None = None
                consumed = 1
                if t.startswith("--"):
                    opt, eq, value = t.partition("=")
                    if opt in ("--unset", "--chdir", "--split-string") and not eq:
                        value = _option_argument(name, words, i + 1)
                        consumed = 2
                    if opt == "--split-string":
                        split = value
                else:
                    for pos, ch in enumerate(t[1:]):
                        if ch in "uCS":
                            value = t[pos + 2 :]
                            if not value:
                                value = _option_argument(name, words, i + 1)
                                consumed = 2
                            if ch == "S":
                                split = value
                            break
                if split is not None:
                    if "$" in split:
                        raise _dynamic_code("`env -S` with variable references")
                    try:
                        pieces = [Word.literal(p) for p in shlex.split(split)]
                    except ValueError:
                        raise _reject("cannot split the `env -S` string; check quoting") from None
                    words = words[:i] + pieces + words[i + consumed :]
                    continue
                i += consumed
                continue
            if t == "-":
                i += 1
                continue
            if "=" in t:
                if t.startswith("BASH_FUNC_"):
                    raise _reject(
                        "exporting a shell function through the environment (BASH_FUNC_…) "
                        "is refused; define functions in the command itself",
                        RULE_FUNC_IMPORT,
                    )
                i += 1
                continue
            break
        return self.argv(words[i:], depth) if i < len(words) else []

    def h_sudo(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        self.out.privileged.append(name)
        spec = _SUDO if name == "sudo" else _SIMPLE_WRAPPERS["doas"]

        def assignment(w: Word) -> bool:
            return not w.unsafe and _ASSIGNMENT.match(w.raw) is not None

        res = _parse_options(name, args, spec, assignment if name == "sudo" else None)
        return self.argv(args[res.index :], depth) if res.index is not None else []

    def h_shell(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        i, command_mode = 0, False
        while i < len(args):
            w = args[i]
            if w.dynamic or w.unsafe:
                raise _dynamic_code(f"the arguments of `{name}`")
            t = w.text
            if t in ("--", "-"):
                i += 1
                break
            if t.startswith("--"):
                i += 2 if t in ("--rcfile", "--init-file") else 1
                continue
            if len(t) > 1 and t[0] in "-+":
                letters = t[1:]
                command_mode = command_mode or (t[0] == "-" and "c" in letters)
                i += 1 + letters.count("o") + letters.count("O")
                continue
            break
        if not command_mode:
            return []  # a script file (not analysed) or stdin (see argv() and settle_stdin())
        if name in OTHER_SHELLS:
            raise _reject(f"`{name} -c` code is not POSIX shell, so it cannot be analysed")
        self.code_string(f"`{name} -c`", args[i] if i < len(args) else None, depth)
        return []

    def h_eval(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        if any(w.dynamic or w.unsafe for w in args):
            raise _dynamic_code("the code given to `eval`")
        self.code_string("`eval`", Word.literal(" ".join(w.text for w in args)), depth)
        return []

    def h_trap(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        operands = [w for w in args if w.text not in ("-l", "-p", "-lp", "-pl", "--")]
        if any(w.text in ("-l", "-p") for w in args) or len(operands) < 2:
            return []
        action = operands[0]
        if not (action.dynamic or action.unsafe) and (
            action.text.isdigit() or action.text in ("-", "")
        ):
            return []
        self.code_string("`trap`", action, depth)
        return []

    def h_alias(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        for w in args:
            if w.dynamic or w.unsafe:
                raise _dynamic_code("an `alias` definition")
            if "=" in w.text and not w.text.startswith("-"):
                self.code_string("`alias`", Word.literal(w.text.split("=", 1)[1]), depth)
        return []

    def h_hash(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        for i, w in enumerate(args):
            if w.text.startswith("-") and "p" in w.text[1:] and i + 1 < len(args):
                self.out.programs.append(self.program_name(args[i + 1], " (hash -p)"))
                self.out.program_words.append(args[i + 1].text)
                self.out.path_changed = True
        return []

    def h_busybox(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        if not args or _is_option(args[0].text):
            return []
        return self.argv(args, depth)

    def h_find(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        inner: list[tuple[str, ...]] = []
        i, expect_arg = 0, 0
        while i < len(args):
            w = args[i]
            t = w.text
            if expect_arg:
                if w.unsafe:
                    raise _dynamic_code("an argument of `find`")
                expect_arg -= 1
                i += 1
                continue
            if w.dynamic or w.unsafe:
                raise _dynamic_code("the arguments of `find` (quote patterns, use literal paths)")
            if t in _FIND_EXEC:
                j = i + 1
                while j < len(args) and not (
                    args[j].text == ";" or (args[j].text == "+" and args[j - 1].text == "{}")
                ):
                    j += 1
                run = args[i + 1 : j]
                if run:
                    if "{}" in run[0].text:
                        raise _reject(
                            f"`find {t} {{}}` runs the found files as programs; the policy "
                            "cannot check that",
                            RULE_DYNAMIC_NAME,
                        )
                    inner.extend(self.with_placeholders(("{}",), run, depth))
                i = j + 1
                continue
            if (t == "-D" and i == 0) or t in _FIND_ARG or t.startswith("-newer"):
                expect_arg = 1
            elif t == "-fprintf":
                expect_arg = 2
            i += 1
        return inner

    def h_string_cmd(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        """``su``/``runuser``/``script``: ``-c STRING`` is shell code; ``flock`` also runs argv."""
        for i, w in enumerate(args):
            t = w.text
            if t in ("-c", "--command", "--session-command") or t.startswith(("--command=",)):
                if "=" in t:
                    code: Word | None = Word.literal(t.partition("=")[2])
                else:
                    code = args[i + 1] if i + 1 < len(args) else None
                self.code_string(f"`{name} -c`", code, depth)
                return []
            if w.dynamic or w.unsafe:
                raise _dynamic_code(f"the arguments of `{name}`")
        if name == "runuser":
            spec = _Opts("ugGsw", frozenset({"--user", "--group", "--supp-group", "--shell"}))
            res = _parse_options(name, args, spec)
            if res.index is not None and ("-u" in res.values or "--user" in res.values):
                return self.argv(args[res.index :], depth)
        if name == "flock":
            res = _parse_options(name, args, _Opts("wE", frozenset({"--timeout"}), 1))
            if res.index is not None:
                return self.argv(args[res.index :], depth)
        return []

    def h_git(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        """``git -c core.pager='…' log``, ``-c alias.x='!…' x``: git runs the value as code."""
        settings, end = git_globals([w.text for w in args])
        after_c = {i + 1 for i, w in enumerate(args[:end]) if w.text in ("-c", "--config-env")}
        if any(
            w.unsafe or (w.dynamic and (i == end or i in after_c))
            for i, w in enumerate(args[: end + 1])
        ):
            raise _dynamic_code("the options of `git` (before the subcommand)")
        for key, value in settings:
            runs = git_setting_runs(key, value)
            if runs == "files":
                raise _reject(
                    f"`git -c {key}=…` makes git read or run files the policy cannot see; "
                    "run git without it",
                    RULE_DYNAMIC_CODE,
                )
            if runs == "code":
                self.code_string(f"`git -c {key}`", Word.literal(value.removeprefix("!")), depth)
        return []

    def h_watch(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        res = _parse_options(name, args, _Opts("nq", frozenset({"--interval", "--equexit"})))
        if res.index is None:
            return []
        rest = args[res.index :]
        if "-x" in res.values or "--exec" in res.values:
            return self.argv(rest, depth)
        if any(w.dynamic or w.unsafe for w in rest):
            raise _dynamic_code("the command given to `watch`")
        self.code_string("`watch`", Word.literal(" ".join(w.text for w in rest)), depth)
        return []


_Handler = Callable[[_Analyser, str, list[Word], int], list[tuple[str, ...]]]
_HANDLERS: dict[str, _Handler] = {
    "env": _Analyser.h_env,
    "sudo": _Analyser.h_sudo,
    "doas": _Analyser.h_sudo,
    "eval": _Analyser.h_eval,
    "trap": _Analyser.h_trap,
    "alias": _Analyser.h_alias,
    "hash": _Analyser.h_hash,
    "busybox": _Analyser.h_busybox,
    "find": _Analyser.h_find,
    "su": _Analyser.h_string_cmd,
    "runuser": _Analyser.h_string_cmd,
    "script": _Analyser.h_string_cmd,
    "flock": _Analyser.h_string_cmd,
    "watch": _Analyser.h_watch,
    "git": _Analyser.h_git,
    **{s: _Analyser.h_shell for s in POSIX_SHELLS | OTHER_SHELLS},
}
_WRAPPER_NAMES = frozenset(_SIMPLE_WRAPPERS) | frozenset(_HANDLERS)
"""Programs whose arguments the analyser looks into."""
