#!/usr/bin/env bash
# The whole test suite: install (with test tools), lint, type-check, then every test
# (unit, integration, security) against real sandboxes. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh --dev
echo "==> ruff"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
echo "==> mypy"
.venv/bin/mypy
echo "==> pytest"
# A throwaway AGENTBOX_HOME per run: tests never touch a real installation's sandboxes.
export AGENTBOX_HOME="${AGENTBOX_TEST_HOME:-$(mktemp -d /var/tmp/agentbox-test.XXXXXX)}"
exec .venv/bin/pytest "$@"
