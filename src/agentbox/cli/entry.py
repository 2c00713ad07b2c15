"""The ``agentbox`` console script: the plain ``sandbox exec ID -- ARGV`` without click
(``cli.execute``), everything else through the click command tree (``cli.main``)."""

from __future__ import annotations

import sys


def main() -> None:
    from agentbox.cli.execute import plain_form

    plain = plain_form(sys.argv[1:])
    if plain is not None:
        from agentbox.cli.execute import run_plain

        run_plain(*plain)
    from agentbox.cli.main import main as click_main

    click_main()
