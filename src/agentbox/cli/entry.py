"""The ``agentbox`` console script: the plain ``sandbox exec ID -- ARGV`` without click
(``cli.execute``), the top-level help from a file when it is current (``cli.help_cache``),
everything else through the click command tree (``cli.main``).

The command scripts/install.sh writes (``cli.script``) starts Python without ``site``
(``-S``): processing the environment's .pth files is a fifth of a light exec's start-up.
Any other path runs it first (``ensure_site``), as if Python had started with it."""

from __future__ import annotations

import sys


_site_done = False


def ensure_site() -> None:
    """Add the environment's site directories (and run its .pth files) if Python started
    without them: before importing anything but the standard library and agentbox."""
    global _site_done
    if sys.flags.no_site and not _site_done:
        _site_done = True
        import site

        site.main()


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
