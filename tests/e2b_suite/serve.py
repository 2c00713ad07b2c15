"""A gateway for E2B's own SDK suite: permissive tools (the suite runs arbitrary commands
and writes under /home/user), the E2B front door at /e2b. Runs until killed.

    serve.py PORT AUDIT_FILE    (operator token in $E2B_SUITE_OPERATOR_TOKEN; AGENTBOX_HOME)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import uvicorn

from agentbox.config.settings import parse_settings
from agentbox.gateway.app import create_app

CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: E2B_SUITE_OPERATOR_TOKEN, rate_limit_per_minute: 1000000}}
sandbox:
  limits: {{memory: 512MiB, disk: 1GiB}}
tools:
  - name: terminal.run
    timeout_ms: 120000
    terminals: true  # sandbox.pty: an interactive shell on a terminal
  - name: fs.read
    root: /
    max_bytes: 16777216
  - name: fs.write
    root: /
audit:
  path: {audit}
"""


def main() -> None:
    port = int(sys.argv[1])
    home = Path(os.environ["AGENTBOX_HOME"])
    text = CONFIG.format(port=port, audit=sys.argv[2])
    token = os.environ["E2B_SUITE_OPERATOR_TOKEN"]
    app = create_app(parse_settings(text, "e2b-suite.yaml"), operator_token=token, home=home)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
