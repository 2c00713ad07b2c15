#!/usr/bin/env bash
# E2B's own Python SDK test suite against agentbox's E2B front door (/e2b).
#
#   scripts/e2b_suite.sh E2B_CHECKOUT [PYTEST_ARGS...]
#
# E2B_CHECKOUT: github.com/e2b-dev/E2B at the tag @e2b/python-sdk@2.45.1. The suite runs
# with that same SDK release, in a virtualenv of its own (.venv keeps the pinned e2b of
# our tests). Sandbox and API tests run, sync and async; template builds, volumes, secrets
# and git helpers are E2B services agentbox does not serve. Tests that cannot apply are
# listed, each with its reason, in tests/e2b_suite/expected_failures.txt (xfail).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
suite="$(cd "${1:?usage: scripts/e2b_suite.sh E2B_CHECKOUT [PYTEST_ARGS...]}" && pwd)"
shift
: "${AGENTBOX_HOME:?set AGENTBOX_HOME (a home of your own)}"
venv=/var/tmp/agentbox-e2b-suite-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "e2b==2.45.1" "pytest==8.4.2" \
  "pytest-asyncio==1.5.0" "pytest-timeout==2.4.0" "attrs" "python-dotenv"
port="$("$repo/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# Older SDKs (2.45) accept only keys shaped like E2B's: e2b_ and 40 hex digits.
token="e2b_$("$repo/.venv/bin/python" -c 'import secrets; print(secrets.token_hex(20))')"
# A trail of its own: a previous run's gateway may still be closing its streams.
audit="$(mktemp -d /var/tmp/agentbox-e2b-suite-audit.XXXXXX)"
E2B_SUITE_OPERATOR_TOKEN="$token" "$repo/.venv/bin/python" "$repo/tests/e2b_suite/serve.py" \
  "$port" "$audit/audit.jsonl" &
gateway=$!
trap 'kill "$gateway" 2>/dev/null; wait "$gateway" || true; rm -rf "$audit"' EXIT
until curl -fs "http://127.0.0.1:$port/healthz" >/dev/null; do
  kill -0 "$gateway" 2>/dev/null || { echo "the gateway did not start" >&2; exit 1; }
  sleep 0.1
done
cd "$suite/packages/python-sdk"
E2B_API_URL="http://127.0.0.1:$port/e2b" E2B_SANDBOX_URL="http://127.0.0.1:$port/e2b" \
E2B_API_KEY="$token" PYTHONPATH="$repo/tests/e2b_suite" \
  "$venv/bin/python" -m pytest -p expected -p no:cacheprovider -o asyncio_mode=auto \
  --timeout 60 --tb=line -q -rfX tests/sync/sandbox_sync tests/sync/api_sync \
  tests/async/sandbox_async tests/async/api_async "$@"
