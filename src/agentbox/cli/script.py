"""The ``agentbox`` command that starts Python without ``site``.

pip's console script runs ``python`` plainly, so ``site`` processes the environment's .pth
files (an editable install's path, setuptools' distutils shim, the distribution's
sitecustomize) before agentbox runs: about 4 ms of CPU of a light ``sandbox exec``'s 25.
The command written here passes ``-S`` and puts agentbox's own directory on the path;
``ensure_site`` runs ``site`` once a command needs more than the standard
library (everything but the plain exec on a running sandbox).

    python -m agentbox.cli.script PATH     (scripts/install.sh: PATH is .venv/bin/agentbox)
"""

from __future__ import annotations

import os
import sys

import agentbox

_site_done = False


def ensure_site() -> None:
    """Add the environment's site directories (and run its .pth files) if Python started
    without them: before importing anything but the standard library and agentbox."""
    global _site_done
    if sys.flags.no_site and not _site_done:
        _site_done = True
        import site

        site.main()


def text(python: str, package_parent: str) -> str:
    """The script: ``python`` (absolute) runs agentbox found in ``package_parent``."""
    return (
        f"#!{python} -S\n"
        "# Written by `python -m agentbox.cli.script` (src/agentbox/cli/script.py): Python\n"
        "# starts without site; agentbox.cli.script runs it when a command needs it.\n"
        "import sys\n"
        f"sys.path.append({package_parent!r})\n"
        "from agentbox.cli.entry import main\n"
        "sys.exit(main())\n"
    )


def write(path: str, python: str = sys.executable) -> None:
    """Write the script for this interpreter and this agentbox to ``path`` (atomically:
    a concurrent call runs the old script or the new one)."""
    parent = os.path.dirname(os.path.dirname(os.path.abspath(agentbox.__file__)))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text(os.path.abspath(python), parent))
    os.chmod(tmp, 0o755)  # noqa: S103  # a command on PATH, as pip's is
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m agentbox.cli.script PATH")
    write(sys.argv[1])
