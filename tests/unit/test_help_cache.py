"""``agentbox --help`` answered from a saved text (``cli.help_cache``): it must be click's
own text for the same program name and width, and a second call must not load click."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
# What click prints, run without the console script's shortcuts.
CLICK = "import sys; sys.argv[0] = 'agentbox'; from agentbox.cli.main import main; main()"


def _run(argv: list[str], env: dict[str, str]) -> bytes:
    done = subprocess.run(argv, capture_output=True, env=env, timeout=60, check=True)
    return done.stdout


def test_saved_help_is_clicks_own_text_per_width(tmp_path: Path) -> None:
    for columns in ("80", "57"):
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "COLUMNS": columns}
        expected = _run([sys.executable, "-c", CLICK, "--help"], env)
        assert expected.startswith(b"Usage: agentbox ")
        assert _run([AGENTBOX, "--help"], env) == expected  # rendered by click, saved
        assert _run([AGENTBOX, "--help"], env) == expected  # from the saved text
        assert _run([AGENTBOX, "-h"], env) == expected
    assert len(list((tmp_path / "agentbox").iterdir())) == 2  # one text per width


def test_second_help_call_loads_no_click(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    probe = (
        "import sys, atexit; sys.argv[0] = 'agentbox';"
        " atexit.register(lambda: print('click' in sys.modules, file=sys.stderr));"
        " from agentbox.cli.entry import main; main()"
    )
    first = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True,
                           env=env, timeout=60, check=True)  # fmt: skip
    second = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True,
                            env=env, timeout=60, check=True)  # fmt: skip
    assert (first.stderr.strip(), second.stderr.strip()) == (b"True", b"False")
    assert first.stdout == second.stdout


def test_an_unwritable_cache_only_costs_time(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    env = {**os.environ, "XDG_CACHE_HOME": str(blocked)}
    assert _run([AGENTBOX, "--help"], env).startswith(b"Usage: agentbox ")
