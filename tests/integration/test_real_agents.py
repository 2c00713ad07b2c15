"""The real coding agents end to end through agentbox: Claude Code and Codex, installed
from npm at the versions pinned in tests/agents/package.json, each run non-interactively
with the README's settings, its model a scripted one behind the gateway.

The script makes the agent try its own local tools first (a shell command, a file write
on the host), which must be refused, then work only through agentbox's MCP tools: open
the package page in the sandbox's browser (the test internet), read the latest version,
read and edit requirements.txt, pip install from the index through the egress proxy, run
the project's tests. The test then checks the sandbox (the manifest, the installed
version, the tests), the audit trail (every step, under the agent's session token), and
the host (no marker file, the agent's working directory unchanged).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from agentbox.audit.log import read_records
from agentbox.config.settings import ProviderSettings
from agentbox.egressd import daemon as egressd
from agentbox.models.providers import anthropic as anthropic_adapter
from browserkit import require_browser
from gateway_harness import RunningGateway, running_gateway
from pkgindex import (
    HOST,
    INDEX,
    INSTALL,
    INSTALL_TIMEOUT_MS,
    LATEST,
    MAKE_VENV,
    NETWORK_YAML,
    PROJECT_TEST,
    REQUIREMENTS,
    RUN_TESTS,
    VENV,
    package_site,
)
from readmekit import snippet
from scriptedagent import ScriptedAgentModel, Step

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "tests" / "agents" / "node_modules"
CLAUDE = AGENTS / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
CODEX = AGENTS / "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
RUN_TIMEOUT = 240  # seconds for one agent run: a client stuck on the network fails
TASK = "Upgrade demo to its latest version and make sure the project's tests pass."
FINAL = f"demo upgraded to {LATEST}; tests pass"
# What every client is told to leave alone: no update checks, telemetry or error reports
# (the host has no internet; a client waiting on it would hang until the timeout).
QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
         "DO_NOT_TRACK": "1"}  # fmt: skip


def agent_binary(path: Path) -> Path:
    """A pinned client, or a failure that says how to install it."""
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path.relative_to(ROOT)} is missing: the real-agent tests need the clients "
            "pinned in tests/agents/package.json; scripts/install.sh --dev installs them "
            "(npm ci --ignore-scripts in tests/agents)"
        )
    return path


EDIT = {"path": "/workspace/requirements.txt", "old": "demo==1.0.0", "new": f"demo=={LATEST}"}


def chain(local: list[Step]) -> list[Step]:
    """The agent's own tools first (each must be refused), then the work in the sandbox."""
    return [
        *local,
        Step("browser_open", {"url": f"{INDEX}/project/demo/"}, rf"Latest version: {LATEST}"),
        Step("fs_read", {"path": "/workspace/requirements.txt"}, r"demo==1\.0\.0"),
        Step("fs_edit", EDIT, r'"replacements":\s*1'),
        Step(
            "terminal_run",
            {"command": MAKE_VENV, "timeout_ms": INSTALL_TIMEOUT_MS},
            r'"exit_code":\s*0\b',
        ),
        Step(
            "terminal_run",
            {"command": INSTALL, "timeout_ms": INSTALL_TIMEOUT_MS},
            r'"exit_code":\s*0\b',
        ),
        Step("terminal_run", {"command": RUN_TESTS}, r'(?=.*"exit_code":\s*0\b).*Ran 1 test.*OK'),
    ]


@dataclass
class Box:
    sandbox: str
    token: str
    token_id: str


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require_browser()
    with package_site(tmp_path_factory.mktemp("agents-site")) as root:
        yield root


def _gateway_yaml(model: ScriptedAgentModel, aliases: dict[str, str]) -> str:
    return f"""sandbox:
  limits: {{memory: 1GiB, disk: 1GiB, idle_timeout: 0}}
{NETWORK_YAML}providers:
  - name: scripted
    kind: anthropic
    base_url: {model.base_url}
    api_key_env: SCRIPTED_MODEL_KEY
    aliases: {json.dumps(aliases)}
"""


def readme_aliases() -> dict[str, str]:
    """The model aliases of the README's providers example."""
    (provider,) = yaml.safe_load(snippet("model", "providers"))["providers"]
    return ProviderSettings.model_validate(provider).aliases  # a valid provider, too


@contextlib.contextmanager
def agent_world(tmp: Path, model: ScriptedAgentModel, agentbox_home: Path,
                aliases: dict[str, str] | None = None
                ) -> Iterator[tuple[RunningGateway, Box]]:  # fmt: skip
    """The scripted model, a gateway whose provider it is (serving ``aliases`` as their
    targets), and a sandbox holding the project, with a session token for the agent."""
    extra = _gateway_yaml(model, aliases or {})
    with model, running_gateway(agentbox_home, tmp / "gw", extra_yaml=extra,
                                env={"SCRIPTED_MODEL_KEY": "k"},
                                timeout_ms=INSTALL_TIMEOUT_MS) as gw:  # fmt: skip
        with gw.operator() as op:
            r = op.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            sandbox = r.json()["id"]
            try:
                for path, content in (("requirements.txt", REQUIREMENTS),
                                      ("tests/test_demo.py", PROJECT_TEST)):  # fmt: skip
                    args = {"sandbox_id": sandbox, "path": f"/workspace/{path}",
                            "content": content}  # fmt: skip
                    w = op.post("/v1/tools/fs_write", json={"arguments": args})
                    assert w.status_code == 200, w.text
                issued = op.post("/v1/tokens", json={"sandbox": sandbox}).json()
                yield gw, Box(sandbox, issued["token"], issued["id"])
            finally:
                op.delete(f"/v1/sandboxes/{sandbox}")


def host_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@dataclass
class Host:
    """The agent's side of the machine: its own home and config, a working directory with
    a file in it, and where the script's local tool calls would leave a marker."""

    home: Path
    cwd: Path
    marker: Path

    @classmethod
    def make(cls, tmp: Path) -> Host:
        home, cwd = tmp / "home", tmp / "work"
        home.mkdir()
        cwd.mkdir()
        (cwd / "notes.txt").write_text("the agent's working directory\n")
        return cls(home, cwd, tmp / "HOST-MARKER")

    def env(self, **more: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "TMPDIR": str(self.home),
                "LANG": "C.UTF-8", **QUIET, **more}  # fmt: skip


def local(text: str, gw: RunningGateway, token: str) -> str:
    return text.replace("127.0.0.1:8848", f"127.0.0.1:{gw.port}").replace(
        "$AGENTBOX_SESSION_TOKEN", token
    )


def exports(text: str) -> dict[str, str]:
    """The variables of the snippet's ``export`` lines."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export "):
            for word in shlex.split(line)[1:]:
                name, _, value = word.partition("=")
                found[name] = value
    return found


def command(text: str, program: str) -> list[str]:
    (line,) = [x for x in text.splitlines() if x.startswith(program + " ")]
    return [TASK if word == "$TASK" else word for word in shlex.split(line)]


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{argv[0]} did not finish in {RUN_TIMEOUT}s:\n{e.stdout!r}\n"
                             f"{e.stderr!r}") from None  # fmt: skip


def check_the_work(gw: RunningGateway, box: Box, model: ScriptedAgentModel, host: Host,
                   cwd_before: dict[str, bytes]) -> None:  # fmt: skip
    out = model.outcome
    assert not out.failures, (out.failures, out.results)
    assert out.finished, (out.results, out.tool_names)
    # The sandbox: the manifest edited, the latest version installed, the tests passing.
    with gw.operator() as op:
        manifest = op.get(f"/v1/sandboxes/{box.sandbox}/files",
                          params={"path": "/workspace/requirements.txt"})  # fmt: skip
        assert manifest.json()["content"] == f"demo=={LATEST}\n", manifest.text
        probe = {"sandbox_id": box.sandbox, "command":
                 f"{VENV}/bin/python3 -c 'import demo; print(demo.__version__)'"}  # fmt: skip
        installed = op.post("/v1/tools/terminal_run", json={"arguments": probe}).json()
    assert installed["stdout"] == f"{LATEST}\n", installed
    # The audit trail: each sandbox step, in order, allowed, under the agent's token; and
    # the agent's model calls under the same token.
    actor = f"token:{box.token_id}"
    records = [r for r in read_records(gw.audit_path, limit=None) if r.get("actor") == actor]
    sandbox_steps = [s.tool for s in model.steps if not s.local]
    calls = [r for r in records if r.get("tool") in sandbox_steps]
    assert [r["tool"] for r in calls] == sandbox_steps, calls
    assert {(r["decision"], r["sandbox"]) for r in calls} == {("allowed", box.sandbox)}, calls
    assert [r for r in records if r["decision"] == "model_call"], records
    # pip reached the index through the sandbox's egress proxy, and only the index.
    egress = [r for r in read_records(egressd.audit_path(gw.home), limit=None)
              if r["sandbox"] == box.sandbox]  # fmt: skip
    assert {(r["decision"], r["host"]) for r in egress} == {("egress_allowed", HOST)}, egress
    # The host: the local tools ran nothing.
    assert not host.marker.exists(), "the agent's own tool ran on the host"
    assert host_tree(host.cwd) == cwd_before


def test_claude_code(tmp_path: Path, agentbox_home: Path, host_ready: None,
                     site: Path) -> None:  # fmt: skip
    claude = str(agent_binary(CLAUDE))
    host = Host.make(tmp_path)
    refused = r"No such tool|not available|denied"
    model = ScriptedAgentModel(chain([
        Step("Bash", {"command": f"touch {host.marker}", "description": "marker"}, refused,
             error=True, local=True),
        Step("Write", {"file_path": str(host.marker), "content": "x"}, refused, error=True,
             local=True),
    ]), FINAL)  # fmt: skip
    with agent_world(tmp_path, model, agentbox_home) as (gw, box):
        env = host.env(CLAUDE_CONFIG_DIR=str(host.home / ".claude"))
        before = host_tree(host.cwd)
        add = local(snippet("connect", "claude"), gw, box.token)
        added = run([claude, *shlex.split(add)[1:]], env, host.cwd)
        assert added.returncode == 0, added.stderr
        settings = local(snippet("model", "claude"), gw, box.token)
        argv = command(settings, "claude")
        done = run([claude, *argv[1:], "--output-format", "json", "--model", "fake-model"],
                   env | exports(settings), host.cwd)  # fmt: skip
        detail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{model.outcome}"
        assert done.returncode == 0, detail
        assert json.loads(done.stdout)["result"] == FINAL, detail
        check_the_work(gw, box, model, host, before)
    # Its betas (which its context_management and effort fields need) reached the model.
    betas = {
        r.headers.get("anthropic-beta", "") for r in model.requests if r.path == "/v1/messages"
    }
    assert betas and all("claude-code-20250219" in b for b in betas), betas


def test_codex(tmp_path: Path, agentbox_home: Path, host_ready: None, site: Path) -> None:
    codex = str(agent_binary(CODEX))
    host = Host.make(tmp_path)
    patch = f"*** Begin Patch\n*** Add File: {host.marker}\n+x\n*** End Patch\n"
    refused = r"^unsupported call: "  # Codex's answer to a call of a tool it does not have
    # Its GPT models' profile keeps apply_patch: the read-only sandbox refuses the write.
    blocked = r"^patch rejected: writing is blocked by read-only sandbox"
    model = ScriptedAgentModel(chain([
        Step("shell", {"command": ["touch", str(host.marker)]}, refused, local=True),
        Step("exec_command", {"cmd": f"touch {host.marker}"}, refused, local=True),
        Step("apply_patch", {"input": patch}, f"{refused}|{blocked}", local=True),
        Step("view_image", {"path": str(host.cwd / "notes.txt")}, refused, local=True),
    ]), FINAL)  # fmt: skip
    # Codex's own GPT model name, as the README sets it (Codex then defers its MCP tools
    # behind tool_search, and sends reasoning.effort and text.verbosity), served by the
    # scripted Anthropic model through the README's alias.
    codex_model = tomllib.loads(snippet("model", "codex"))["model"]
    aliases = readme_aliases()
    assert codex_model.startswith("gpt-") and codex_model in aliases, (codex_model, aliases)
    with agent_world(tmp_path, model, agentbox_home, aliases) as (gw, box):
        codex_home = host.home / ".codex"
        codex_home.mkdir()
        # The README's two blocks, its model settings first (top-level keys before tables).
        config = snippet("model", "codex") + "\n" + snippet("connect", "codex")
        (codex_home / "config.toml").write_text(local(config, gw, box.token))
        env = host.env(CODEX_HOME=str(codex_home), AGENTBOX_SESSION_TOKEN=box.token)
        before = host_tree(host.cwd)
        argv = command(local(snippet("model", "codex-run"), gw, box.token), "codex")
        last = tmp_path / "last-message.txt"
        done = run([codex, *argv[1:], "--ephemeral", "--color", "never", "-o", str(last)],
                   env, host.cwd)  # fmt: skip
        detail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{model.outcome}"
        assert done.returncode == 0, detail
        assert last.read_text().strip() == FINAL, detail
        check_the_work(gw, box, model, host, before)
    # Every sandbox tool was found by a search first (deferred), and asked for under the
    # alias's target model, with Codex's verbosity in words.
    assert sorted(set(model.outcome.searches)) == sorted(
        {s.tool for s in model.steps if not s.local}
    ), model.outcome
    main = [r.json() for r in model.requests if "tool_search" in r.body.decode()]
    assert main and {r["model"] for r in main} == {aliases[codex_model]}
    assert all(anthropic_adapter.VERBOSITY["low"] in r["system"] for r in main)
