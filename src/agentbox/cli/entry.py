"""The ``agentbox`` console script: the plain ``sandbox exec ID -- ARGV`` without click
(``cli.execute``), the top-level help from a file when it is current (``cli.help_cache``),
everything else through the click command tree (``cli.main``).

The command scripts/install.sh writes (``cli.script``) starts Python without ``site``
(``-S``); any path but the light exec runs it first (``script.ensure_site``), as if Python
had started with it."""

from __future__ import annotations

import sys

from agentbox.cli.script import ensure_site


def main() -> None:
    from agentbox.cli.execute import plain_form

    plain = plain_form(sys.argv[1:])
    if plain is not None:
        from agentbox.cli.execute import run_plain

        run_plain(*plain)
    ensure_site()
    help_asked = sys.argv[1:] in (["--help"], ["-h"])
    if help_asked:
        from agentbox.cli import help_cache

        if help_cache.print_cached(sys.argv[1:]):
            sys.exit(0)
    from agentbox.cli.main import main as click_main

    if help_asked:
        help_cache.render(click_main)
    click_main()
