# Whole on purpose: one walk over one bash syntax tree; its node handlers recurse into each other
"""Static analysis of shell command lines: which programs would this string run?

The gateway's command policy (:mod:`agentbox.policy.tool_policy`) needs the list of every
program a shell string would execute. This module finds it with a complete bash grammar
(tree-sitter with ``tree-sitter-bash``) and then walks the syntax tree, descending into
everything that runs code:

* lists, pipelines, ``&``, ``;``, ``&&``, ``||``, ``!``, subshells ``( )``, groups ``{ }``,
  ``if``/``while``/``until``/``for``/``select``/``case`` bodies, ``for ((…))``, ``(( ))``,
  ``[[ … ]]``, function bodies, redirections;
* command substitution ``$(…)`` and backticks (nested), process substitution ``<( )``/``>( )``,
  and substitutions inside ``${…}``, ``$((…))``, array assignments, ``[[ ]]`` and unquoted
  here-documents;
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
:mod:`agentbox.policy.command_rules`, on plain words, as are program identity and option
normalisation).

tree-sitter recovers from syntax errors instead of failing, so every tree with an ``ERROR``
or ``MISSING`` node is refused. Where its tree is known to differ from what bash reads, the
source is corrected before the tree is trusted (:func:`_parse`): here-document bodies are
set aside (tree-sitter attaches the rest of the operator's line to the heredoc), line
continuations between words are joined (it splits ``r\\<newline>m``), backtick substitutions
are re-parsed after bash's unescaping (it does not see nested escaped backticks), and
backticks in unquoted heredoc bodies are found by scanning (it does not parse them).
Every command node of every tree must have been analysed, or the command is refused.

Program names are normalised: quoting is removed (``r''m``, ``"rm"``, ``\\rm`` → ``rm``),
paths are reduced to their basename (``/usr/bin/rm``, ``./rm``,
``/proc/self/root/usr/bin/rm`` → ``rm``), and ``.`` is reported as ``source``; the words as
written are kept too (:attr:`CommandAnalysis.program_words`), for their identity.

Everything that cannot be decided statically fails closed with :class:`UnparseableCommand`:

* ``unparseable``: syntax errors, ``coproc``, two here-documents on one line, and places
  where the tree disagrees with bash (a heredoc terminator tree-sitter did not end on);
* ``dynamic command name``: the program name contains ``$x``, ``${x}``, ``$(…)``, a glob or a
  brace expansion;
* ``dynamic shell code``: ``eval``/``sh -c``/``trap``/``alias`` with non-literal code, or a
  wrapper/``find`` argument whose meaning depends on a run-time value (``timeout $T rm``);
* ``nesting too deep``: more than :data:`MAX_DEPTH` levels of code-in-a-string;
* ``invalid command``: empty, NUL bytes, longer than :data:`MAX_COMMAND_CHARS`;
* ``function import via environment``: ``env 'BASH_FUNC_x%%=…'``.

This is a guardrail, not a boundary: see the limitations in :mod:`agentbox.policy.tool_policy`.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import secrets
import shlex
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from string import ascii_letters, digits

import tree_sitter
import tree_sitter_bash

from agentbox.errors import UnparseableCommand
from agentbox.policy.command_rules import (
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
"""Longer command strings are refused outright."""

RULE_INVALID = "invalid command"
RULE_UNPARSEABLE = "unparseable"
RULE_DYNAMIC_NAME = "dynamic command name"
RULE_DYNAMIC_CODE = "dynamic shell code"
RULE_TOO_DEEP = "nesting too deep"
RULE_FUNC_IMPORT = "function import via environment"


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

Node = tree_sitter.Node
_LANGUAGE = tree_sitter.Language(tree_sitter_bash.language())
_local = threading.local()  # a Parser is not safe to share between threads


def _tree(data: bytes) -> tree_sitter.Tree:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = tree_sitter.Parser(_LANGUAGE)
    return parser.parse(data)


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "surrogatepass")


def _descendants(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _syntax_error(root: Node, where: str = "") -> UnparseableCommand:
    bad = next((n for n in _descendants(root) if n.is_error or n.is_missing), root)
    line, col = bad.start_point
    if bad.is_missing:
        detail = f"`{bad.type}` is missing near line {line + 1}, column {col + 1}"
    else:
        near = _text(bad).strip().splitlines()
        detail = f"syntax error near line {line + 1}, column {col + 1}" + (
            f" ({near[0][:40]!r})" if near else ""
        )
    return _reject(
        f"cannot parse this shell command{where}: {detail}; check quoting, brackets and "
        "here-document terminators, or split it into simpler commands"
    )


@dataclass
class _Heredoc:
    delim: str
    quoted: bool
    body: str
    node: Node | None  # the heredoc_body of the first parse: its substitutions, if unquoted


@dataclass
class _HeredocTable:
    """Here-document bodies, set aside before the tree is trusted (see :func:`_parse`).

    Each ``<<DELIM`` becomes ``<PLACEHOLDER`` (with a per-analysis random nonce, so a command
    cannot forge one) and its body and terminator line are removed from the source. Every
    entry must be consumed by a ``<`` redirection of the final tree.
    """

    nonce: str = ""  # drawn at the first heredoc: most commands have none
    entries: list[_Heredoc] = field(default_factory=list)
    consumed: set[int] = field(default_factory=set)
    trees: list[tree_sitter.Tree] = field(default_factory=list)
    """Every tree of the analysis, kept alive: body nodes stay valid and node ids (keys of
    the analyser's tables) are not reused by a later parse."""

    def add(self, heredoc: _Heredoc) -> str:
        if not self.nonce:
            self.nonce = secrets.token_hex(8)
        self.entries.append(heredoc)
        return f"__agentbox_heredoc_{self.nonce}_{len(self.entries) - 1}__"

    def lookup(self, word: str) -> _Heredoc | None:
        prefix = f"__agentbox_heredoc_{self.nonce}_"
        if not self.entries or not (word.startswith(prefix) and word.endswith("__")):
            return None
        index = word[len(prefix) : -2]
        if not index.isdigit() or int(index) >= len(self.entries):
            return None
        self.consumed.add(int(index))
        return self.entries[int(index)]

    def check_all_consumed(self) -> None:
        if len(self.consumed) != len(self.entries):
            raise _reject(
                "a here-document could not be matched to its command; put the heredoc in a "
                "simpler command"
            )


def _dequote_delimiter(raw: str) -> str | None:
    try:
        parts = shlex.split(raw)
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 and parts[0] else None


_KEEP_CONTINUATION = frozenset({"raw_string", "comment", "ansi_c_string"})
"""Tokens whose backslash-newline is literal text; everywhere else bash removes it before
parsing (also inside ``"…"`` and unquoted heredocs: ``"$\\<newline>(cmd)"`` runs cmd)."""
_CONTINUATION = re.compile(rb"(?<!\\)(?:\\\\)*\\\n")
"""A backslash-newline whose backslash is not itself escaped."""


def _parse(source: str, table: _HeredocTable) -> Node:
    """Parse ``source``; returns the tree to analyse (heredocs set aside, see the table).

    The first parse locates here-documents and line continuations; when there are any, the
    source is rewritten (heredoc ``<<D`` → ``<PLACEHOLDER``, body and terminator removed;
    ``\\<newline>`` between tokens removed, as bash joins the words around it) and parsed
    again. Either parse with an error is refused.
    """
    data = source.encode("utf-8", "surrogatepass")
    tree = _tree(data)
    table.trees.append(tree)
    root = tree.root_node
    if root.has_error:
        raise _ParseFailed(root)
    edits: list[tuple[int, int, bytes]] = []
    bodies: list[tuple[int, int]] = []
    for node in _descendants(root):
        if node.type == "heredoc_redirect":
            edits.extend(_heredoc_edits(node, data, table, bodies))
    for match in _CONTINUATION.finditer(data):
        p = match.end() - 2
        if any(a <= p < b for a, b in bodies):
            continue  # a heredoc body: see _heredoc_edits
        leaf = root.descendant_for_byte_range(p, p + 1)
        if leaf is not None and leaf.type == "heredoc_start":
            raise _reject("a line continuation in a here-document delimiter; write it on one line")
        if leaf is None or leaf.child_count or leaf.type not in _KEEP_CONTINUATION:
            edits.append((p, p + 2, b""))
    if not edits:
        return root
    edits.sort()
    for (_, end, _), (start, _, _) in itertools.pairwise(edits):
        if start < end:
            raise _reject("here-documents overlap in a way the analyser cannot follow; simplify")
    for start, end, text in reversed(edits):
        data = data[:start] + text + data[end:]
    tree = _tree(data)
    table.trees.append(tree)
    if tree.root_node.has_error:
        raise _syntax_error(tree.root_node, " (after setting aside its here-documents)")
    return tree.root_node


class _ParseFailed(Exception):
    """The first parse has errors; the tree is kept to report programs (deny wins)."""

    def __init__(self, root: Node) -> None:
        super().__init__("syntax error")
        self.root = root


def _heredoc_edits(
    node: Node, data: bytes, table: _HeredocTable, bodies: list[tuple[int, int]]
) -> list[tuple[int, int, bytes]]:
    kinds = {c.type: c for c in node.children}
    op, start = node.children[0], kinds.get("heredoc_start")
    body, end = kinds.get("heredoc_body"), kinds.get("heredoc_end")
    if start is None or body is None or end is None:
        raise _reject("a here-document has no terminator line; end it with its delimiter")
    raw = _text(start)
    quoted = any(q in raw for q in "'\"\\")
    delim = _dequote_delimiter(raw) if quoted else raw
    if not delim:
        raise _reject("a here-document delimiter could not be understood; use <<'EOF'")
    strip_tabs = op.type == "<<-"

    def is_terminator(line: bytes) -> bool:
        return (line.lstrip(b"\t") if strip_tabs else line) == delim.encode(
            "utf-8", "surrogatepass"
        )

    end_line = data.rfind(b"\n", 0, end.start_byte) + 1
    after = data.find(b"\n", end.end_byte)
    after = len(data) if after == -1 else after + 1
    body_start = data.rfind(b"\n", 0, min(body.start_byte, end_line)) + 1
    lines = data[body_start:end_line].split(b"\n")[:-1]
    if (
        body_start <= start.end_byte
        or not is_terminator(data[end_line:after].rstrip(b"\n"))
        or any(is_terminator(line) for line in lines)
    ):
        raise _reject(
            "a here-document was not parsed the way bash reads it; put it in a simpler command"
        )
    text = data[body_start:end_line].decode("utf-8", "surrogatepass")
    if not quoted and _CONTINUATION.search(data, body_start, end_line):
        # bash joins the lines first (`$\<newline>(cmd)` runs cmd): parse the joined body
        text = _CONTINUATION.sub(lambda m: m.group()[:-2], data[body_start:end_line]).decode(
            "utf-8", "surrogatepass"
        )
        fence = f"AGENTBOX_{secrets.token_hex(8)}"
        joined = _tree(f": <<{fence}\n{text}{fence}\n".encode("utf-8", "surrogatepass"))
        table.trees.append(joined)
        body = next((n for n in _descendants(joined.root_node) if n.type == "heredoc_body"), None)
        if joined.root_node.has_error or body is None:
            raise _reject("a here-document with line continuations could not be parsed; simplify")
    placeholder = table.add(_Heredoc(delim, quoted, text, None if quoted else body))
    bodies.append((body_start, after))
    return [
        (op.start_byte, start.end_byte, b"<" + placeholder.encode()),
        (body_start, after, b""),
    ]


# --------------------------------------------------------------------------- words

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_IDENTITY_ASSIGNMENT = re.compile(rf"(?:{'|'.join(sorted(IDENTITY_VARIABLES))})\+?=")
_CODE_ASSIGNMENT = re.compile(rf"(?:{'|'.join(sorted(CODE_VARIABLES))})\+?=")
_IDENTITY_NAME = re.compile(rf"(?<![A-Za-z0-9_])(?:{'|'.join(sorted(IDENTITY_VARIABLES))})\b")
_VARIABLE_BUILTINS = frozenset(
    {"export", "declare", "typeset", "local", "readonly", "unset", "read", "printf", "mapfile",
     "readarray", "getopts", "env"}
)  # fmt: skip
"""Programs that can set a variable named in their arguments (``export PATH=…``)."""

_SUBSTITUTIONS = frozenset({"command_substitution", "process_substitution"})
_EXPANSIONS = frozenset({"simple_expansion", "expansion", "arithmetic_expansion"})
_REDIRECTS = frozenset({"file_redirect", "herestring_redirect", "heredoc_redirect"})
_STATEMENTS = frozenset({"command", "declaration_command", "unset_command"})
_PROMPT_EXPANSION = re.compile(r"@P\}\Z")
_SUBSCRIPT_CODE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\[[^\]]*(?:\$\(|`)")
"""``a[$(cmd)]`` as text: bash runs ``cmd`` wherever the text is evaluated as arithmetic."""
_TEXT_LEAVES = frozenset({"word", "regex", "raw_string", "extglob_pattern", "string_content"})
"""Tokens whose text tree-sitter does not look into."""
_RESERVED = frozenset(
    {"{", "}", "then", "else", "elif", "fi", "do", "done", "esac", "in", "coproc", "function",
     "select", "case", "if", "while", "until", "for", "[[", "]]", "!"}
)  # fmt: skip
"""Reserved words: as a program name (also after ``time``, which tree-sitter takes for a
program), tree-sitter did not understand the construct (``coproc NAME { … }``, ``time ! …``)."""


@dataclass
class _WordParts:
    text: list[str] = field(default_factory=list)
    dynamic: bool = False
    unsafe: bool = False
    brace: bool = False  # an unquoted `{` seen: brace expansion is possible


def _unescape_unquoted(raw: str, parts: _WordParts) -> None:
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == "\\" and i + 1 < len(raw):
            if raw[i + 1] != "\n":
                parts.text.append(raw[i + 1])
            i += 2
            continue
        if c in "*?[" or (parts.brace and (c == "," or raw.startswith("..", i))):
            parts.unsafe = True
        elif c == "{":
            parts.brace = True
        parts.text.append(c)
        i += 1


def _unescape_double(raw: str) -> str:
    """Backslash removal inside ``"…"``: only before ``$ ` " \\`` and newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), raw)


def _unescape_backticks(raw: str) -> str:
    """The code inside `` `…` `` as bash reads it: ``\\$``, ``\\```, ``\\\\`` lose a backslash."""
    return re.sub(r"\\([$`\\])", r"\1", raw)


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
_STRING_CMD_VALUES = {"su": "csgGw", "runuser": "cugGsw", "script": "cTBIOEom", "flock": "cwE"}
"""Short options of ``h_string_cmd``'s programs: ``c`` (the code) and those taking a value."""
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


def _redirect_parts(node: Node, fds: dict[int, str]) -> tuple[str, str, list[Node], list[Node]]:
    """A redirection's descriptor (``""``: the default), operator, target, and the words
    tree-sitter put after the target that are really the command's arguments (``ls > x a``).
    ``fds``: descriptors tree-sitter read as a word before the redirection (``0<&3``)."""
    fd, op = fds.get(node.id, ""), ""
    targets: list[Node] = []
    for c in node.children:
        if c.type == "file_descriptor":
            fd = _text(c)
        elif not c.is_named and not op:
            op = c.type
        elif c.type != "comment":
            targets.append(c)
    return fd, op, targets[:1], targets[1:]


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
        self.visited: set[int] = set()
        """Ids of the command nodes of the tree being walked that were analysed."""
        self.targets: dict[int, Word] = {}
        """Redirection targets already turned into words (their substitutions analysed)."""
        self.fds: dict[int, str] = {}
        """Redirections whose descriptor tree-sitter took for an argument (``bash 0<&3``)."""

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
        outer, self.visited = self.visited, set()
        try:
            try:
                root = _parse(source, self.heredocs)
            except _ParseFailed as failed:
                # best effort, so that a denied program is reported (deny wins)
                with contextlib.suppress(UnparseableCommand, RecursionError):
                    self.walk(failed.root, depth)
                raise _syntax_error(failed.root) from None
            self.walk(root, depth)
            missed = next(
                (
                    n
                    for n in _descendants(root)
                    if n.type in _STATEMENTS and n.id not in self.visited
                ),
                None,
            )
            if missed is not None:
                raise _reject(
                    f"part of the command was not understood by the analyser (near "
                    f"{_text(missed)[:40]!r}); split it into simpler commands"
                )
        finally:
            self.visited = outer

    # ---- tree walking

    def walk(self, node: Node, depth: int) -> list[tuple[str, ...]]:
        """Analyse one node; returns the argvs of a simple command (else [])."""
        kind = node.type
        if kind in _STATEMENTS:
            return self.command(node, depth, [])
        if kind == "redirected_statement":
            return self.redirected(node, depth)
        if kind == "pipeline":
            self.pipeline(node, depth)
        elif kind in _SUBSTITUTIONS:
            self.substitution(node, depth)
        elif kind in _REDIRECTS:
            self.redirect(node, depth)
        elif kind == "variable_assignment":
            self.assignment(self.assignment_word(node, depth), depth)
        elif kind == "test_command":
            self.test_command(node, depth)
        elif kind in _TEXT_LEAVES and not node.child_count:
            self.leaf_text(node, depth)
        elif kind != "comment":
            if kind == "expansion" and _PROMPT_EXPANSION.search(_text(node)):
                raise _dynamic_code("`${…@P}` (prompt expansion runs the `$(…)` in a value)")
            # lists, compound commands, control flow, function definitions, words, arithmetic:
            # whatever they contain that runs code is found by descending
            for child in node.named_children:
                self.walk(child, depth)
        return []

    def leaf_text(self, node: Node, depth: int) -> None:
        """Text tree-sitter did not parse inside ``${…}`` (``${x%`cmd`}``, ``"${x:-'$(cmd)'}"``:
        bash expands it): analysed as the double-quoted string it is at most."""
        text = _text(node)
        if "$(" in text or "`" in text:
            # as the value of an assignment: parsed, and no program of its own
            self.code_in_substitution('v="' + text.replace('"', '\\"') + '"', depth)

    def redirected(self, node: Node, depth: int) -> list[tuple[str, ...]]:
        body: Node | None = None
        redirects: list[Node] = []
        for child in node.named_children:
            if child.type in _REDIRECTS:
                redirects.append(child)
            elif body is None:
                body = child
            else:
                self.walk(child, depth)
        if body is not None and body.type in _STATEMENTS:
            return self.command(body, depth, redirects)
        outer, self.stdin_readers = self.stdin_readers, {}
        for redirect in redirects:
            if self.redirect(redirect, depth):
                raise _reject(
                    f"words after a redirection of a compound command ({_text(node)[:40]!r}) "
                    "are not valid shell; remove them"
                )
        if body is not None:
            self.walk(body, depth)
        self.settle_stdin(redirects, depth)  # `{ sh; } <<< code`
        self.stdin_readers = outer | self.stdin_readers
        return []

    def command(self, node: Node, depth: int, outer: list[Node]) -> list[tuple[str, ...]]:
        """A simple command (also ``export``/``declare``/``unset``), with the redirections of
        the statement around it."""
        self.visited.add(node.id)
        words: list[tuple[int, Word]] = []
        group: list[Node] = []
        redirects: list[Node] = []
        ends: dict[int, Node] = {}  # end byte → a one-node word ending there

        def flush() -> None:
            if group:
                words.append((group[0].start_byte, self.word(group, depth)))
                if len(group) == 1:
                    ends[group[0].end_byte] = group[0]
                group.clear()

        children = [
            grand
            for child in node.children
            for grand in (child.children if child.type == "command_name" else [child])
        ]
        for child in children:
            if child.type in _REDIRECTS:
                flush()
                redirects.append(child)
            elif child.type == "variable_assignment" and node.type == "command":
                flush()
                self.assignment(self.assignment_word(child, depth), depth)
            elif child.type == "comment":
                flush()
            elif child.type == "variable_assignment":
                flush()
                words.append((child.start_byte, self.assignment_word(child, depth)))
            else:
                if group and group[-1].end_byte != child.start_byte:
                    flush()
                group.append(child)  # adjacent nodes are one shell word (`$"…"`)
        flush()
        redirects.extend(outer)
        for redirect in redirects:
            # bash reads `N<`/`N>` as a descriptor; tree-sitter sometimes makes N an argument
            digits = ends.get(redirect.start_byte)
            if (
                digits is not None
                and _text(digits).isdigit()
                and not any(c.type == "file_descriptor" for c in redirect.children)
            ):
                words = [(pos, w) for pos, w in words if pos != digits.start_byte]
                self.fds[redirect.id] = _text(digits)
        for redirect in redirects:
            extra = self.redirect(redirect, depth)
            words.extend((w.start_byte, self.word([w], depth)) for w in extra)
        if not words:
            return []
        argv_words = [w for _, w in sorted(words, key=lambda item: item[0])]
        saved, self.stdin_readers = self.stdin_readers, {}
        argvs = self.argv(argv_words, depth)
        self.settle_stdin(sorted(redirects, key=lambda r: r.start_byte), depth)
        self.stdin_readers = saved | self.stdin_readers
        return argvs

    def assignment_word(self, node: Node, depth: int) -> Word:
        """``NAME=value``, ``NAME+=value``, ``NAME[i]=value``, ``NAME=(a b)`` as one word."""
        text: list[str] = []
        dynamic = False
        for child in node.children:
            if child.type in ("variable_name", "subscript") or not child.is_named:
                self.walk(child, depth)  # a subscript is expanded: `a[$(cmd)]=1`
                text.append(_text(child))
            elif child.type == "array":
                elements = [
                    self.word([e], depth) for e in child.named_children if e.type != "comment"
                ]
                text.append("(" + " ".join(e.text for e in elements) + ")")
                dynamic = dynamic or any(e.dynamic or e.unsafe for e in elements)
            else:
                value = self.word([child], depth)
                text.append(value.text)
                dynamic = dynamic or value.dynamic or value.unsafe
        return Word(text="".join(text), raw=_text(node), dynamic=dynamic)

    def assignment(self, word: Word, depth: int) -> None:
        """``NAME=value`` (before a command, or for ``export``/``env``/``sudo``/…)."""
        if _IDENTITY_ASSIGNMENT.match(word.text):
            self.out.path_changed = True
        if _SUBSCRIPT_CODE.search(word.text.partition("=")[2]):
            raise _reject(
                f"the value of {word.raw[:40]!r} holds an array subscript with a command "
                "substitution, which arithmetic would run ($((x)), declare -i); the analyser "
                "cannot follow the value, so rewrite it"
            )
        if _CODE_ASSIGNMENT.match(word.text):
            name, _, value = word.text.partition("=")
            code = None if word.dynamic or word.unsafe else Word.literal(value)
            self.code_string(f"`{name.rstrip('+')}=`", code, depth)

    # ---- words

    def word(self, nodes: Sequence[Node], depth: int) -> Word:
        """Adjacent nodes as one :class:`Word` (quote removal as bash does it), with the
        substitutions in them analysed."""
        parts = _WordParts()
        for node in nodes:
            self.word_part(node, depth, parts, quoted=False)
        return Word(
            text="".join(parts.text),
            raw="".join(_text(n) for n in nodes),
            dynamic=parts.dynamic,
            unsafe=parts.unsafe,
        )

    def word_part(self, node: Node, depth: int, parts: _WordParts, quoted: bool) -> None:
        kind, text = node.type, _text(node)
        if kind == "number":
            parts.text.append(text)
        elif kind == "word" or not node.is_named:
            if not node.is_named and kind == "$":
                parts.dynamic = True  # `$"…"`: a translated string
            _unescape_unquoted(text, parts)
        elif kind == "raw_string":
            parts.text.append(text[1:-1])
        elif kind == "string":
            for child in node.children[1:-1]:
                if child.type == "string_content":
                    parts.text.append(_unescape_double(_text(child)))
                elif not child.is_named:
                    parts.text.append(_text(child))
                else:
                    self.word_part(child, depth, parts, quoted=True)
        elif kind == "concatenation":
            for child in node.children:
                self.word_part(child, depth, parts, quoted)
        elif kind in _SUBSTITUTIONS:
            parts.dynamic = True
            parts.unsafe = parts.unsafe or not quoted
            parts.text.append(text)
            self.substitution(node, depth)
        else:
            # expansions, $'…', $"…", brace expansion {a..b}, and anything else: the value is
            # known only at run time; what runs code inside is found by descending
            parts.dynamic = True
            parts.unsafe = parts.unsafe or not quoted or kind == "brace_expression"
            parts.text.append(text)
            self.walk(node, depth)

    def substitution(self, node: Node, depth: int) -> None:
        """``$(…)``, `` `…` ``, ``<(…)``: its code runs with the caller's stdin, unseen."""
        opener = node.children[0].type if node.children else ""
        if opener == "`":
            raw = _text(node)
            if len(raw) < 2 or not raw.endswith("`"):
                raise _reject("unterminated backquote; use $(…)")
            self.visited.update(n.id for n in _descendants(node))
            self.code_in_substitution(_unescape_backticks(raw[1:-1]), depth)
            return
        outer, self.stdin_readers = self.stdin_readers, {}
        for child in node.named_children:
            self.walk(child, depth)
        self.check_substitution_stdin()
        self.stdin_readers = outer

    def code_in_substitution(self, code: str, depth: int) -> None:
        outer, self.stdin_readers = self.stdin_readers, {}
        self.shell(code, depth + 1)
        self.check_substitution_stdin()
        self.stdin_readers = outer

    def check_substitution_stdin(self) -> None:
        if self.stdin_readers:
            raise _stdin_code("the caller's stdin (inside a substitution)", self.stdin_readers)

    def test_command(self, node: Node, depth: int) -> None:
        """``[[ … ]]``: operands of ``-eq`` & co are evaluated as arithmetic, where an array
        subscript runs ``$(…)`` written as plain text (``[[ 'a[$(cmd)]' -eq 1 ]]``)."""
        if node.children and node.children[0].type == "[":
            self.out.programs.append("[")  # `[ … ]` is the builtin `[`
            self.out.program_words.append("[")
            self.out.commands.append(("[",))
        stack = list(node.named_children)
        while stack:
            n = stack.pop()
            if n.type in _SUBSTITUTIONS:
                continue
            if n.child_count == 0 and ("$(" in _text(n) or "`" in _text(n)):
                raise _reject(
                    f"`[[ … ]]` may evaluate {_text(n)!r} (arithmetic runs $(…) in array "
                    "subscripts); the analyser cannot check that, so rewrite it"
                )
            stack.extend(n.named_children)
        for child in node.named_children:
            self.walk(child, depth)

    def redirect(self, node: Node, depth: int) -> list[Node]:
        """Analyse a redirection's target; returns the words after it (command arguments)."""
        if node.type == "heredoc_redirect":
            raise _reject("a here-document could not be set aside; put it in a simpler command")
        _, op, target, extra = _redirect_parts(node, self.fds)
        if target:
            word = self.word(target, depth)
            self.targets[node.id] = word
            heredoc = (
                self.heredocs.lookup(word.text) if op == "<" and word.raw == word.text else None
            )
            if heredoc is not None and not heredoc.quoted:
                self.heredoc_substitutions(heredoc, depth)
        return extra

    def heredoc_substitutions(self, heredoc: _Heredoc, depth: int) -> None:
        """An unquoted heredoc body expands ``$(…)``, ``${…}`` and backticks."""
        if heredoc.node is not None:
            for child in heredoc.node.named_children:
                self.walk(child, depth)
        self.backticks(heredoc.body, depth, "a here-document")  # tree-sitter does not parse them

    def backticks(self, text: str, depth: int, where: str) -> None:
        """Analyse the `` `…` `` in text that tree-sitter left unparsed."""
        i = 0
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == "`":
                j = i + 1
                while j < len(text) and text[j] != "`":
                    j += 2 if text[j] == "\\" else 1
                if j >= len(text):
                    raise _reject(f"unterminated backquote inside {where}; use $(…)")
                self.code_in_substitution(_unescape_backticks(text[i + 1 : j]), depth)
                i = j
            i += 1

    def settle_stdin(self, redirects: Sequence[Node], depth: int) -> None:
        """Decide on programs that read their program from stdin, given these redirections.

        A literal heredoc or here-string is code in the command text: analysed when a POSIX
        shell reads it. A regular file is a script file (like ``bash FILE``). The caller's
        stdin (no redirection, ``< /dev/stdin``, ``<&0``) is decided by the enclosing
        command, compound or pipeline (:meth:`pipeline`, :func:`analyse_command`). Any other
        descriptor is code the policy cannot see.
        """
        if not self.stdin_readers:
            return
        for redirect in reversed(redirects):
            fd, op, _, _ = _redirect_parts(redirect, self.fds)
            if op.startswith("<") and fd in ("", "0"):
                break
        else:
            return
        word = self.targets.get(redirect.id)
        if op == "<&-":
            pass
        elif word is None:
            raise _stdin_code("a redirection the analyser cannot follow", self.stdin_readers)
        elif op == "<<<":
            if word.dynamic or word.unsafe:
                raise _dynamic_code("the code fed to the program on stdin")
            self.stdin_text(word.text, depth)
        elif op == "<&":
            if word.text == "0" and not word.dynamic:
                return  # the same stdin
            if word.text != "-" or word.dynamic:
                raise _stdin_code("a duplicated file descriptor", self.stdin_readers)
        else:
            heredoc = self.heredocs.lookup(word.text) if word.raw == word.text else None
            if heredoc is not None:
                self.stdin_text(heredoc.body, depth)
            else:
                source = script_input(word)
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

    def pipeline(self, node: Node, depth: int) -> None:
        outer: list[tuple[str, ...]] = []
        inner: list[tuple[str, ...]] = []
        readers = self.stdin_readers
        for part in node.named_children:
            if part.type == "comment":
                continue
            self.stdin_readers = {}
            argvs = self.walk(part, depth)
            if self.stdin_readers and outer:
                raise _stdin_code("a pipe", self.stdin_readers)
            readers = readers | self.stdin_readers
            if not argvs:
                argvs = [tuple(_text(part).split())]
            outer.append(argvs[0])
            inner.append(argvs[-1])
        self.stdin_readers = readers
        if len(outer) > 1:
            self.out.pipelines.append(tuple(outer))
            if inner != outer:
                self.out.pipelines.append(tuple(inner))

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
        if text in _RESERVED and word.raw == text:
            raise _reject(
                f"cannot analyse this command: `{text}` here is a construct the shell parser "
                "does not support (`coproc`, `time !`, or a misplaced reserved word); rewrite it"
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
            following = args[i + 1] if i + 1 < len(args) else None
            cluster = t[1:] if t[:1] == "-" and t[1:2] not in ("", "-") else ""
            first = next((k for k, ch in enumerate(cluster) if ch in _STRING_CMD_VALUES[name]), -1)
            is_code, code = True, following
            if cluster and cluster[first : first + 1] == "c":  # -c CODE, -qc CODE, -cCODE
                code = Word.literal(cluster[first + 1 :]) if cluster[first + 1 :] else following
            elif t.startswith(("--command=", "--session-command=")):
                code = Word.literal(t.partition("=")[2])
            else:
                is_code = t in ("--command", "--session-command")
            if is_code:
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

    def h_mapfile(self, name: str, args: list[Word], depth: int) -> list[tuple[str, ...]]:
        """``mapfile -C CALLBACK``: bash evaluates the callback as shell code."""
        res = _parse_options(name, args, _Opts("dnOsuCc"))
        if "-C" in res.values:
            self.code_string(f"`{name} -C`", Word.literal(res.values["-C"]), depth)
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
    "mapfile": _Analyser.h_mapfile,
    "readarray": _Analyser.h_mapfile,
    "git": _Analyser.h_git,
    **{s: _Analyser.h_shell for s in POSIX_SHELLS | OTHER_SHELLS},
}
_WRAPPER_NAMES = frozenset(_SIMPLE_WRAPPERS) | frozenset(_HANDLERS)
"""Programs whose arguments the analyser looks into."""
