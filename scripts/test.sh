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
# It is removed afterwards (its network number on this host is then free again).
if [ -n "${AGENTBOX_TEST_HOME:-}" ]; then
  export AGENTBOX_HOME="$AGENTBOX_TEST_HOME"; throwaway=""
else
  export AGENTBOX_HOME="$(mktemp -d /var/tmp/agentbox-test.XXXXXX)"; throwaway=1
fi
status=0
# The slowest tests are listed at the end: where the suite's time goes, run by run.
.venv/bin/pytest --durations=30 "$@" || status=$?
if [ -n "$throwaway" ]; then
  # The disk pool (an XFS mount in the home) and the init tmpfs go first;
  # --one-file-system: never descend into a mount a leaked sandbox may have left.
  umount "$AGENTBOX_HOME/disks" "$AGENTBOX_HOME/initfs" 2>/dev/null || true
  rm -rf --one-file-system "$AGENTBOX_HOME" 2>/dev/null || true
fi
exit "$status"
