"""Look for secrets in a sandbox's files before they are snapshotted.

A snapshot outlives its sandbox and may be shared, so credentials an agent left in a
file (``.env``, ``~/.aws/credentials``, a private key) should be noticed first. The
detectors are the gateway's (``agentbox.policy.redaction``): the pattern detectors of
detect-secrets, not the entropy or keyword ones, which flag ordinary code everywhere.
One detector is added: ``aws_secret_access_key = …`` without quotes, the form of an AWS
credentials file, which detect-secrets only finds quoted.

The tree belongs to the sandbox and is treated as hostile: it is walked through directory
file descriptors without following symlinks (so a link to ``/etc/shadow``, or a directory
swapped for a link mid-walk, leads nowhere), only regular files are opened, FIFOs and
devices never are.

Every data byte of every regular file is scanned: big files, binaries (a NUL anywhere),
databases, core dumps. A file is read once, in 1 MiB chunks that overlap (a secret across
a chunk boundary is whole in one of them), holes skipped (SEEK_DATA: zeros hold no
secret, so a sparse 10 GiB file costs what it stores). Each chunk is also read as its
even and its odd bytes, which turns UTF-16 (and NUL-interleaved text in a binary) into
plain text. A pre-filter (``secretwindows``, its pass in C) finds where a detector could
match; the detectors run only on the lines around those places. The bytes read are
bounded by ``max_scan_bytes`` over the whole tree: what is past it, and what could not be
read, is listed in the result (``ScanResult.unscanned``), never dropped.

A finding names the file, line and kind, never the secret: findings go into logs and
error messages. ``scan_tree`` returns a ``ScanResult``, a list of findings that also says
which files were not wholly read, and why. In a binary the line is the count of newline
bytes before the finding, plus one.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fnmatch
import functools
import os
import queue
import re
import stat
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agentbox.errors import InvalidRequest
from agentbox.storage import secrethits, secretwindows, treewalk

if TYPE_CHECKING:
    from agentbox.policy.redaction import Redactor

# The default budget of a snapshot's scan: far past a sandbox's disk quota, so in practice
# only a tree built to waste the scan's time meets it (and is then reported).
MAX_SCAN_BYTES = 64 * 1024**3
_CHUNK = 1 << 20
_OVERLAP = 4 * secretwindows.WINDOW  # > a window's reach ahead of its hit (2 lines)
_MIN_VALUE = 8  # a shorter capture group is a token's prefix (ghp_, glpat-), not its value
_PRIVATE_KEY = "private-key"
_AWS = "AWS Access Key"
_AWS_CREDENTIALS_LINE = re.compile(
    r"aws_?secret_?access_?key[\"']?[ \t]*[:=][ \t]*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    re.IGNORECASE,
)
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_ALLOW_SYNTAX = (
    "an entry is a path glob (a whole file, e.g. tests/fixtures/*), path-glob:LINE, "
    "or kind=<secret type> (e.g. kind=AWS Access Key)"
)


@dataclass(frozen=True, order=True)
class Finding:
    path: str  # relative to the scanned root, POSIX
    line: int  # 1-based; a private key's BEGIN line
    kind: str  # detect-secrets' secret type, e.g. "AWS Access Key", "Private Key"


class ScanResult(list[Finding]):
    """The findings, sorted, plus the files left unscanned (relative paths)."""

    def __init__(
        self,
        findings: Iterable[Finding] = (),
        over_budget: Iterable[str] = (),
        skipped_unreadable: Iterable[str] = (),
    ) -> None:
        super().__init__(sorted(findings))
        self.over_budget = list(over_budget)  # not wholly read: max_scan_bytes ran out
        self.skipped_unreadable = list(skipped_unreadable)  # permission, I/O, too deep
        self.scanned_bytes = 0  # data bytes read

    def unscanned(self) -> list[dict[str, str]]:
        """What was not (wholly) scanned and why, for a snapshot's record and audit."""
        return [{"path": p, "reason": "over the scan budget"} for p in self.over_budget] + [
            {"path": p, "reason": "unreadable"} for p in self.skipped_unreadable
        ]


@dataclass(frozen=True)
class _Match:
    kind: str
    start: int  # character offsets of the secret value in the decoded text
    end: int


@functools.cache
def _engine() -> tuple[Redactor, dict[str, str]]:
    """The gateway's detectors, and their kind slugs mapped back to detect-secrets' names."""
    # detect-secrets (and requests under it) costs ~50 ms to import: only a scan pays it.
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    from agentbox.policy.redaction import Redactor

    names = {_slug(t): t for t in get_mapping_from_secret_type_to_class()}
    return Redactor(), names


def _slug(kind: str) -> str:
    """The gateway's short name of a detect-secrets kind (imported on use, as above)."""
    from agentbox.policy.redaction import kind_slug as slug

    return slug(kind)


# Letters outside ASCII that IGNORECASE matches to ASCII ones (long s, Kelvin sign, the
# dotted and the dotless i): text without them can be pre-filtered in ASCII lower case.
_FOLDING = re.compile("[\u017f\u212a\u0130\u0131]")


def _lowered(text: str) -> str | None:
    """``text`` with ASCII letters lower-cased, when a case-insensitive detector's
    literal can be looked for in it exactly; None when it cannot (then they all run)."""
    if text.isascii():
        return text.lower()
    if _FOLDING.search(text):
        return None
    # Binary and non-English text: only ASCII letters may be folded, offsets do not matter.
    return text.encode("utf-8", "surrogateescape").lower().decode("ascii", "replace")


_FOLDING_UTF8 = tuple(c.encode() for c in "\u017f\u212a\u0130\u0131")


def _searched(text: str, raw: bytes | None) -> tuple[str, str | None]:
    """What the detectors' literals are looked for in: ``text`` and ``_lowered(text)``;
    or, given the bytes ``text`` was decoded from (UTF-8, surrogateescape), those bytes
    read as Latin-1, and lower-cased: the same answers for the literals and words, all
    ASCII (an ASCII character of the text is an ASCII byte of its UTF-8, and no other
    byte is ASCII), at a byte a character (a decoded window of a binary has escaped
    bytes, two bytes a character), and no decoding to lower it: on noise the searches
    were most of a window's cost."""
    if raw is None or not _ascii_prefilters():
        return text, _lowered(text)
    if any(trap in raw for trap in _FOLDING_UTF8):
        return text, None
    return raw.decode("latin-1"), raw.lower().decode("latin-1")


@functools.cache
def _ascii_prefilters() -> bool:
    return all((d.literal + "".join(d.words)).isascii() for d in _engine()[0].detectors)


@functools.cache
def _gates() -> tuple[dict[str, re.Pattern[str]], dict[str, re.Pattern[str]], re.Pattern[str]]:
    """Gates by detector pattern: secretwindows' shapes; the keyword detectors' values;
    and one class holding every value's characters, as long as the shortest value, which
    a window must hold before any value gate is looked for (one search, not four)."""
    gates = {k: re.compile(v) for k, v in secretwindows.GATES.items()}
    values: dict[str, re.Pattern[str]] = {}
    for detector in _engine()[0].detectors:
        if detector.words and detector.pattern.pattern not in gates:
            gate = _value_gate(detector.pattern)
            if gate is not None and gate.flags == re.IGNORECASE | re.UNICODE:
                values[detector.pattern.pattern] = gate
    runs = [_VALUE_RUN.fullmatch(g.pattern) for g in values.values()]
    insides = [m.group(1) for m in runs if m is not None]
    # Classes joined into one: only those that cannot run into their neighbour (an
    # unescaped "-" at either end, a leading "^"), else no joint gate (it passes all).
    plain = len(insides) == len(runs) and all(
        i and i[0] not in "-^" and (not i.endswith("-") or i.endswith("\\-")) for i in insides
    )
    shortest = min((int(m.group(2)) for m in runs if m is not None), default=0)
    joint = f"[{''.join(insides)}]{{{shortest}}}" if plain and insides else ""
    any_value = re.compile(joint, re.IGNORECASE)
    return gates, values, any_value


_VALUE = re.compile(r"\((\[[^\]]*\]\{\d+\})")
_VALUE_RUN = re.compile(r"\[([^\]]*)\]\{(\d+)\}")  # a class's inside, its count


def _value_gate(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """A keyword detector's value as a gate: its first group, a run of one class (40
    token characters, 64 hex digits) that every match holds, and that the lines around
    a keyword in random bytes almost never do; its lookbehinds and alternations are then
    run on a few windows, not on every one. None unless that group is plainly there,
    not optional (at the top of the pattern)."""
    from re import _parser  # type: ignore[attr-defined]  # as policy.redaction does

    m = _VALUE.search(pattern.pattern)
    if m is None or "(" in pattern.pattern[: m.start()].replace("(?", ""):
        return None  # not the first group
    try:
        tree = _parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # a private module: if it changes, there is simply no gate
        return None
    if not any(op is _parser.SUBPATTERN and arg[0] == 1 for op, arg in tree):
        return None  # group 1 inside an alternation or a repeat: it may not be there
    return re.compile(m.group(1), pattern.flags)


def _matches(text: str, raw: bytes | None = None) -> list[_Match]:
    """Every detector's matches in ``text``; ``raw``: the bytes it was decoded from."""
    redactor, names = _engine()
    gates, values, any_value = _gates()
    searched, lowered = _searched(text, raw)
    found: list[_Match] = []
    has_value: bool | None = None  # any keyword detector's value in text: asked once
    for detector in redactor.detectors:
        if len(text) < detector.min_length:
            break  # sorted by min_length: no later detector can match either
        # The redactor's exact prefilters (a literal, or one of some words, every match
        # holds), so that most detectors cost one substring search.
        if not detector.may_match(searched, lowered):
            continue
        gate = gates.get(detector.pattern.pattern) or values.get(detector.pattern.pattern)
        if gate is not None and detector.pattern.pattern in values:
            if has_value is None:
                has_value = any_value.search(text) is not None
            if not has_value:
                continue
        if gate is not None and not gate.search(text):
            continue
        kind = names.get(detector.kind, detector.kind)
        for m in detector.pattern.finditer(text):
            if m.end() == m.start():
                continue
            start, end = m.span()
            # A private key is the whole block. Elsewhere a capture group, where there is
            # one, is the value (the 40 characters after aws_secret_access_key = ').
            value = m.group(1) if m.re.groups and detector.kind != _PRIVATE_KEY else None
            if value and len(value) >= _MIN_VALUE:
                start, end = m.span(1)
            found.append(_Match(kind, start, end))
    if lowered is None or "secret" in lowered:
        for m in _AWS_CREDENTIALS_LINE.finditer(text):
            found.append(_Match(_AWS, *m.span(1)))
    return found


def _line_starts(text: str) -> list[int]:
    return [0, *(m.end() for m in re.finditer("\n", text))]


def _line_of(starts: list[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset)


def scan_text(path: str, text: str) -> list[Finding]:
    """Findings in one file's text, one per line and kind."""
    starts = _line_starts(text)
    return sorted({Finding(path, _line_of(starts, m.start), m.kind) for m in _matches(text)})


@dataclass(frozen=True)
class AllowList:
    """Findings an operator has declared harmless (test fixtures, documented examples)."""

    files: tuple[str, ...] = ()  # globs: these files are not scanned at all
    lines: tuple[tuple[str, int], ...] = ()  # (glob, line)
    kinds: frozenset[str] = field(default_factory=frozenset)  # slugs

    @classmethod
    def from_file(cls, path: Path) -> AllowList:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"cannot read the allow-list {path}: {e}", file=str(path)) from e
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, source: str = "allow-list") -> AllowList:
        """One entry a line: ``path-glob``, ``path-glob:LINE`` or ``kind=<secret type>``;
        ``#`` comments and blank lines are ignored. Globs are matched (fnmatch, ``*`` also
        crosses ``/``) against the finding's path: relative to the scanned root for
        ``scan_tree``, the path inside the sandbox (``/workspace/...``) for snapshots."""
        files: list[str] = []
        lines: list[tuple[str, int]] = []
        kinds: set[str] = set()
        known = _engine()[1]
        for number, raw in enumerate(text.splitlines(), 1):
            entry = raw.strip()
            if not entry or entry.startswith("#"):
                continue

            def bad(problem: str, number: int = number) -> InvalidRequest:
                return InvalidRequest(
                    f"{source}:{number}: {problem}; {_ALLOW_SYNTAX}", file=source, line=number
                )

            if entry.startswith("kind="):
                # Spelled as detect-secrets names it ("AWS Access Key") or as a slug.
                name = entry.removeprefix("kind=").strip()
                if _slug(name) not in known:
                    names = ", ".join(sorted(known.values()))
                    raise bad(f"unknown secret type {name!r} (known: {names})")
                kinds.add(_slug(name))
                continue
            glob, line = entry, 0
            head, colon, tail = entry.rpartition(":")
            if colon and (not tail or tail.isdigit()):
                if not tail.isdigit() or int(tail) < 1:
                    raise bad("expected a line number (1 or more) after ':'")
                glob, line = head, int(tail)
            glob = glob.removeprefix("./")
            if not glob:
                raise bad("missing path glob")
            if line:
                lines.append((glob, line))
            else:
                files.append(glob)
        return cls(tuple(files), tuple(lines), frozenset(kinds))

    def allows_file(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, g) for g in self.files)

    def allows(self, finding: Finding) -> bool:
        return (
            _slug(finding.kind) in self.kinds
            or self.allows_file(finding.path)
            or any(
                line == finding.line and fnmatch.fnmatchcase(finding.path, g)
                for g, line in self.lines
            )
        )


def _extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """[start, end) of the file's data: a hole reads as zeros, which hold no secret, so a
    sparse 10 GiB file costs what it stores, not what it claims."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data after pos
                return
            yield pos, size  # SEEK_DATA unsupported here: all of it is data
            return
        if start >= size:
            return
        yield start, min(end, size)
        pos = end


class Budget:
    """Bytes a whole scan may still read; what is past it is reported, not skipped."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit
        self.taken = 0

    def take(self, wanted: int) -> int:
        granted = wanted if self.left is None else min(wanted, self.left)
        if self.left is not None:
            self.left -= granted
        self.taken += granted
        return granted


def _scan_views(path: str, buf: bytes, lo: int, hi: int, line0: int) -> set[Finding]:
    """Findings whose candidate starts in buf[lo:hi); ``line0``: lines before buf[0]."""
    # UTF-16 (and NUL-interleaved text in binaries): ASCII characters sit at even
    # offsets (little endian) or odd ones (big endian); each view is then plain text.
    # buf starts at an even file offset, so the views are the same in every chunk. The
    # C pass looks at all three in one loop; of a view, only the bytes around its hits
    # are ever copied out.
    plain, even, odd = secretwindows.view_hits(buf, lo, hi, b"\0" in buf)
    found: set[Finding] = set()
    for parity, hits in ((-1, plain), (0, even), (1, odd)):
        if hits:
            found |= _scan_view(path, buf, parity, hits, line0)
    return found


def _scan_view(path: str, buf: bytes, parity: int, hits: list[int], line0: int) -> set[Finding]:
    """Findings around ``hits`` of buf (``parity`` -1) or of its even (0) or odd (1)
    bytes, read in pieces around the hits: a piece reaches as far as a window can."""
    found: set[Finding] = set()
    stride, first = (1, 0) if parity < 0 else (2, parity)
    size = len(buf) if parity < 0 else (len(buf) - parity + 1) // 2
    line, counted = line0, 0  # newlines in the view before ``counted``
    for start, end, group in _pieces(hits, size):
        piece = buf[first + stride * start : first + stride * end : stride]
        for w_start, w_end in secretwindows.windows(piece, [h - start for h in group]):
            raw = piece[w_start:w_end]
            text = raw.decode("utf-8", "surrogateescape")
            matches = _matches(text, raw)
            if not matches:
                continue  # no line to name: the newlines up to it are counted later, if ever
            at = start + w_start
            line += secrethits.newlines(buf, first + stride * counted, first + stride * at, stride)
            counted = at
            starts = _line_starts(text)
            found.update(Finding(path, line + _line_of(starts, m.start), m.kind) for m in matches)
    return found


def _pieces(hits: list[int], size: int) -> Iterator[tuple[int, int, list[int]]]:
    """[start, end) spans of a view of ``size`` bytes holding every window of the hits
    (sorted) in them, hits whose windows could touch in the same span."""
    reach = 2 * secretwindows.WINDOW + 2  # a window's end: its line's and the next one's
    group: list[int] = []
    start = end = 0
    for h in hits:
        lo, hi = max(0, h - secretwindows.WINDOW), min(size, h + reach)
        if group and lo <= end:
            group.append(h)
            end = hi
            continue
        if group:
            yield start, end, group
        group, start, end = [h], lo, hi
    if group:
        yield start, end, group


class FileScan:
    """The scan of one file, fed its data in order as it is read (by a snapshot's archive
    as it writes it: the bytes scanned are the bytes stored). Runs of data (``extent``)
    are fed in chunks that overlap, so a secret across a chunk boundary is whole in one of
    them; memory stays at one chunk whatever the file's size."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.found: set[Finding] = set()
        self.left_out = 0  # data bytes not scanned (over the budget)
        self._buf = b""
        self._lo = 0  # where in _buf the next candidates may start
        self._lines = 0  # newline bytes in the file before _buf[_lo] (holes hold none)

    def extent(self, start: int) -> None:
        """The next data starts at file offset ``start`` (the first, or after a hole)."""
        # Views need an even start: the byte before an odd one is in a hole, a zero.
        self._buf, self._lo = (b"\0" if start % 2 else b""), 0

    def feed(self, data: bytes, last: bool) -> None:
        """The next bytes; ``last``: the end of this extent (or of what will be read)."""
        buf = self._buf + data if self._buf else data
        hi = len(buf) if last else len(buf) - _OVERLAP
        if hi <= self._lo:
            self._buf = buf
            return
        line0 = self._lines - secrethits.newlines(buf, 0, self._lo)  # before buf[0]
        self.found |= _scan_views(self.path, buf, self._lo, hi, line0)
        self._lines += secrethits.newlines(buf, self._lo, hi)
        keep = 0 if last else max(0, hi - _OVERLAP)  # back context for the next hits
        keep -= keep % 2
        self._buf, self._lo = (b"", 0) if last else (buf[keep:], hi - keep)


_ZEROS = bytes(_CHUNK)
_AHEAD = 8 * _CHUNK  # how far ahead of the chunk being read the kernel is asked to read


def read_file(
    fd: int, size: int, scan: FileScan, budget: Budget, *, archive: bool
) -> Iterator[bytes]:
    """With ``archive``: the file's bytes [0, size) in order (holes as zeros, never read),
    each data chunk fed to ``scan`` right after it is yielded, while ``budget`` lasts;
    a file that ends early raises ``InvalidRequest``. Without: its data chunks, until
    ``budget`` runs out. Either way ``scan.left_out`` counts the data bytes not scanned."""
    done = 0
    extents = list(_extents(fd, size))
    ahead = _ReadAhead(fd) if size > _AHEAD else None
    try:
        for index, (start, end) in enumerate(extents):
            if archive:
                yield from _zeros(start - done)
            scan.extent(start)
            pos = start
            _read_ahead(fd, start, min(end, start + _AHEAD))
            while pos < end:
                want = min(_CHUNK, end - pos)
                if ahead is not None:
                    ahead.want(pos + _AHEAD, min(end, pos + _AHEAD + want))
                if not archive and budget.left is not None:
                    if budget.left == 0:  # the rest is not read at all
                        scan.left_out += end - pos + sum(e - s for s, e in extents[index + 1 :])
                        return
                    want = min(want, budget.left)
                data = os.pread(fd, want, pos)
                if ahead is not None and archive and (pos + len(data)) % _AHEAD == 0:
                    ahead.done(pos + len(data) - _AHEAD, pos + len(data))  # read once
                if len(data) < want and archive:
                    raise _changed()
                granted = budget.take(len(data))
                yield data  # first: the archive's writer works on it while it is scanned
                pos += len(data)
                last = pos >= end or budget.left == 0 or len(data) < want
                if granted:
                    scan.feed(data if granted == len(data) else data[:granted], last)
                scan.left_out += len(data) - granted
                if len(data) < want:
                    break
            done = end
        if archive:
            yield from _zeros(size - done)
            if os.fstat(fd).st_size != size:  # cut short: its end was taken for a hole
                raise _changed()
    finally:
        if ahead is not None:
            ahead.close()


class _ReadAhead:
    """``_read_ahead`` calls for one file on a thread of their own. Each asks the kernel
    to read a MiB of a fresh clone into its cache, which took ~0.5 ms of the reading
    thread's time a MiB (page allocation, I/O submission): a quarter of that thread's
    time, and it is the thread a snapshot waits for. The thread has its own descriptor of
    the file (a duplicate, closed when it is done): the caller's may be closed meanwhile."""

    def __init__(self, fd: int) -> None:
        self._fd = os.dup(fd)
        self._wanted: queue.SimpleQueue[tuple[int, int, bool] | None] = queue.SimpleQueue()
        thread = threading.Thread(target=self._run, name="snapshot-readahead", daemon=True)
        thread.start()

    def want(self, start: int, end: int) -> None:
        self._wanted.put((start, end, False))

    def done(self, start: int, end: int) -> None:
        """[start, end) was read: its cached pages can go now, not all at the end (at
        1 GB the clone's unmount, which freed them, took 0.13 s after the last read,
        and they held as much memory as the file till then)."""
        self._wanted.put((start, end, True))

    def close(self) -> None:
        """No more; the thread ends after the calls already asked for (not waited for:
        they are hints)."""
        self._wanted.put(None)

    def _run(self) -> None:
        try:
            while (span := self._wanted.get()) is not None:
                start, end, drop = span
                (_drop if drop else _read_ahead)(self._fd, start, end)
        finally:
            os.close(self._fd)


def _read_ahead(fd: int, start: int, end: int) -> None:
    """Have the kernel read [start, end) now, while earlier chunks are scanned: a
    snapshot reads a fresh clone of the disk (nothing cached), whose device reads ahead
    only 128 KiB, so each 1 MiB read used to wait for the disk."""
    if end > start:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)


def _drop(fd: int, start: int, end: int) -> None:
    """Have the kernel drop its cached copy of [start, end), read and not needed again."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)


def _changed() -> InvalidRequest:
    return InvalidRequest(
        "a file changed while the snapshot read it (its frozen copy cannot change: the "
        "host's disk is failing?); take the snapshot again"
    )


def _zeros(count: int) -> Iterator[bytes]:
    while count > 0:
        yield _ZEROS if count >= _CHUNK else _ZEROS[:count]
        count -= _CHUNK


def open_regular(dir_fd: int, name: str) -> int | None:
    """A descriptor of the entry if it is a regular file, else None. Never opens a FIFO or
    device: lstat first, and O_NONBLOCK|O_NOFOLLOW in case the entry was swapped since."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        return None
    fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def scan_tree(
    root: Path, allowlist: AllowList | None = None, max_scan_bytes: int | None = None
) -> ScanResult:
    """Every secret under ``root`` not allowed by ``allowlist``, sorted by path and line.
    Every data byte of every regular file is read, up to ``max_scan_bytes`` in all (None:
    no limit); files not wholly read are listed in ``over_budget``."""
    allow = allowlist or AllowList()
    budget = Budget(max_scan_bytes)
    findings: list[Finding] = []
    over: list[str] = []
    unreadable: list[str] = []
    for entry in treewalk.walk(Path(root), unreadable):
        if allow.allows_file(entry.path):
            continue
        scan = FileScan(entry.path)
        try:
            fd = open_regular(entry.dir_fd, entry.name)
            if fd is None:
                continue
            try:
                size = os.fstat(fd).st_size
                for _ in read_file(fd, size, scan, budget, archive=False):
                    pass
            finally:
                os.close(fd)
        except FileNotFoundError:
            continue  # removed meanwhile
        except OSError:
            unreadable.append(entry.path)
            continue
        if scan.left_out:
            over.append(entry.path)
        findings.extend(f for f in scan.found if not allow.allows(f))
    result = ScanResult(findings, over, unreadable)
    result.scanned_bytes = budget.taken
    return result


def redact_file(data: bytes, findings: Iterable[Finding]) -> bytes:
    """``data`` with the secret of each finding (this file's) replaced by
    ``[REDACTED:<kind>]``, a private key from its BEGIN line to its END line. A finding
    whose value is no longer where it was (the file changed) costs its whole line."""
    wanted = {(f.line, f.kind) for f in findings}
    if not wanted:
        return data
    # surrogateescape keeps invalid UTF-8 exactly as it was around the replacements.
    text = data.decode("utf-8", "surrogateescape")
    starts = _line_starts(text)
    spans: list[tuple[int, int, str]] = []
    located: set[tuple[int, str]] = set()
    for m in _matches(text):
        where = (_line_of(starts, m.start), m.kind)
        if where in wanted:
            spans.append((m.start, m.end, m.kind))
            located.add(where)
    for line, kind in wanted - located:
        if 1 <= line <= len(starts):
            start = starts[line - 1]
            end = starts[line] - 1 if line < len(starts) else len(text)
            if end > start and text[end - 1] == "\r":
                end -= 1
            spans.append((start, end, kind))
    out: list[str] = []
    cursor = 0
    for start, end, kind in sorted(spans):
        if start < cursor:  # overlaps the previous replacement: widen that one
            cursor = max(cursor, end)
            continue
        out += [text[cursor:start], f"[REDACTED:{kind}]"]
        cursor = end
    out.append(text[cursor:])
    return "".join(out).encode("utf-8", "surrogateescape")


def _shown(path: str) -> str:
    """A file name fit for a terminal: the sandbox chose it, and it may hold escape
    sequences, newlines (a forged report line) or bytes that are not UTF-8."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_report(findings: Iterable[Finding]) -> str:
    """One line per finding, ``path:line: kind``, and how to go on. Never a secret value."""
    found = sorted(findings)
    if not found:
        return "No secrets found."
    lines = [f"Found {len(found)} possible secret(s):"]
    lines += [f"  {_shown(f.path)}:{f.line}: {f.kind}" for f in found]
    lines += [
        "To go on, remove them from the sandbox, or take the snapshot with --redact to",
        "replace each with [REDACTED:<kind>], or list false positives in an allow-list",
        "file (one a line: path-glob, path-glob:LINE or kind=<secret type>).",
    ]
    return "\n".join(lines)


__all__ = [
    "MAX_SCAN_BYTES",
    "AllowList",
    "Budget",
    "FileScan",
    "Finding",
    "ScanResult",
    "format_report",
    "open_regular",
    "read_file",
    "redact_file",
    "scan_text",
    "scan_tree",
]
