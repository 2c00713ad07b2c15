"""``agentbox --help`` from a file: importing click and building the command tree is most
of that call, and the text only changes with the code that makes it.

The text click renders is saved under the user's cache directory, named by a hash of
everything it depends on: the program name, the width click wraps to, and the size and
mtime of the CLI's modules, the package's ``__init__`` and click's. Any change renders it
anew; a cache that cannot be written is only slower (tests/unit/test_help_cache.py
checks the text is click's own).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

HELP_ARGS = (["--help"], ["-h"])  # the top-level group's help_option_names


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "agentbox")


def print_cached(args: list[str]) -> bool:
    """Print the top-level help if ``args`` asks for it and a saved text is current."""
    if args not in HELP_ARGS:
        return False
    try:
        with open(_path(), "rb") as f:
            text = f.read()
    except OSError:
        return False
    sys.stdout.buffer.write(text)
    sys.stdout.flush()
    return True


def render(click_main: Callable[[], None]) -> NoReturn:
    """Run click (which prints the help and exits), keep what it printed, pass it on."""
    import io

    buffer = io.StringIO()
    real, sys.stdout = sys.stdout, buffer
    code: object = 0
    try:
        click_main()
    except SystemExit as e:
        code = e.code
    finally:
        sys.stdout = real
    text = buffer.getvalue()
    if code in (0, None):
        _save(text)
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.exit(code)  # type: ignore[arg-type]


def _save(text: str) -> None:
    """Keep the help click rendered for the next call (best effort)."""
    path = _path()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(text.encode())
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old text or the new
    except OSError:
        import contextlib  # a miss: click is loaded already, this is no cost

        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _path() -> str:
    from _sha256 import sha256  # type: ignore[import-not-found]  # hashlib: OpenSSL, ms

    key = "\0".join([os.path.basename(sys.argv[0]), str(_width()), *_sources()])
    return os.path.join(cache_dir(), f"help-{sha256(key.encode()).hexdigest()[:24]}.txt")


def _width() -> int:
    """The columns click's formatter sees (``shutil.get_terminal_size``, without shutil)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _sources() -> list[str]:
    """Size and mtime of each file the help is made from."""
    from importlib.machinery import PathFinder

    cli = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(cli, name) for name in sorted(os.listdir(cli)) if name.endswith(".py")]
    files.append(os.path.join(os.path.dirname(cli), "__init__.py"))
    click = PathFinder.find_spec("click")
    files.append(click.origin if click is not None and click.origin else "(no click)")
    out = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            out.append(f"{path}:-")
            continue
        out.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return out
