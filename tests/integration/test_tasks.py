"""Batch tasks end to end: a real gateway's workers run the reference loop against a
scripted model (a fake OpenAI provider on loopback) and real sandbox tools; accounting,
cancellation, the CLI, and resuming after the gateway is killed mid-task."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox.runtime.host import release_home_mounts
from fakeproviders import FakeProvider, Reply
from gateway_harness import GatewayProcess

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: GATEWAY_PROCESS_TOKEN, rate_limit_per_minute: 1000000}}
sandbox:
  limits: {{memory: 128MiB, disk: 64MiB, idle_timeout: 0}}
  network: {{mode: none}}
tools:
  - name: terminal.run
    allow: [bash, sh, echo, cat, sleep, "true", wc]
audit:
  path: {home}/audit/audit.jsonl
providers:
  - name: scripted
    kind: openai
    base_url: BASE_URL
    api_key_env: FAKE_KEY
    models: [fake-model]
    prices: {{fake-model: {{input_per_mtok: 2, output_per_mtok: 10}}}}
tasks: {{workers: 1, lease_seconds: 2}}
"""


def act(tool: str, **arguments: Any) -> Reply:
    return Reply(text=json.dumps({"tool": tool, "arguments": arguments}),
                 input_tokens=100, output_tokens=10)  # fmt: skip


def finish(summary: str) -> Reply:
    return Reply(text=json.dumps({"finish": summary}), input_tokens=100, output_tokens=10)


@pytest.fixture
def model() -> Iterator[FakeProvider]:
    with FakeProvider("openai") as fake:
        yield fake


@pytest.fixture
def gateway(host_ready: None, model: FakeProvider) -> Iterator[GatewayProcess]:
    with running(CONFIG.replace("BASE_URL", model.base_url)) as gw:
        yield gw


@contextlib.contextmanager
def running(config: str) -> Iterator[GatewayProcess]:
    """A gateway on a home of its own, everything of it gone afterwards."""
    home = Path(tempfile.mkdtemp(prefix="agentbox-tasks-", dir="/var/tmp"))
    home.chmod(0o711)
    gw = GatewayProcess(home, config, {"FAKE_KEY": "k"})
    gw.start()
    try:
        yield gw
    finally:
        with contextlib.suppress(AssertionError, ProcessLookupError, subprocess.TimeoutExpired):
            gw.kill(signal.SIGTERM)
        subprocess.run([AGENTBOX, "recover"], env={**os.environ, "AGENTBOX_HOME": str(home)},
                       capture_output=True, check=False)  # fmt: skip
        with contextlib.suppress(Exception):
            from agentbox.runtime.runtime import Runtime

            runtime = Runtime(home)
            for record in runtime.store.list():
                runtime.destroy(record.id)
        release_home_mounts(home)
        shutil.rmtree(home, ignore_errors=True)


def wait_state(gw: GatewayProcess, task_id: str, states: tuple[str, ...], timeout: float = 60
               ) -> dict[str, Any]:  # fmt: skip
    deadline = time.monotonic() + timeout
    with gw.client() as op:
        while True:
            task = op.get(f"/v1/tasks/{task_id}").json()
            if task["state"] in states or time.monotonic() > deadline:
                return dict(task)
            time.sleep(0.1)


def test_a_task_runs_to_the_end_with_exact_accounting(
    gateway: GatewayProcess, model: FakeProvider
) -> None:
    model.script(
        act("fs_write", path="/workspace/notes.txt", content="hello tasks"),
        act("terminal_run", command="wc -c < /workspace/notes.txt"),
        finish("wrote the notes and counted them"),
    )
    with gateway.client() as op:
        r = op.post("/v1/tasks", json={"goal": "write notes, count bytes", "project": "p1"})
        assert r.status_code == 201, r.text
        task_id = r.json()["id"]
    task = wait_state(gateway, task_id, ("succeeded", "failed"))
    assert task["state"] == "succeeded", task
    assert task["result"] == "wrote the notes and counted them"
    assert (task["steps"], task["tool_calls"], task["tool_errors"]) == (3, 2, 0)
    assert (task["tokens_in"], task["tokens_out"]) == (300, 30)
    assert task["cost_usd"] == pytest.approx(3 * (100 * 2 + 10 * 10) / 1e6)
    assert task["duration_s"] > 0 and task["sandbox"].startswith("sb-")
    with gateway.client() as op:
        steps = op.get(f"/v1/tasks/{task_id}/steps").json()
        usage = {u["project"]: u for u in op.get("/v1/usage").json()}
    assert steps[1]["result"]["stdout"].strip() == "11"
    assert usage["p1"]["tokens"] == 330
    # the model saw the goal and each result, in the transcript
    turns = model.requests[-1].json()["messages"]
    assert "Task: write notes, count bytes" in turns[1]["content"]  # after the system prompt
    assert turns[-1]["content"].startswith("Result of step 2:") and "11" in turns[-1]["content"]
    # the CLI through the gateway
    env = {**os.environ, "AGENTBOX_URL": gateway.url, "AGENTBOX_TOKEN": gateway.token}
    listed = subprocess.run([AGENTBOX, "task", "ls"], env=env, capture_output=True, text=True)
    assert task_id in listed.stdout and "succeeded" in listed.stdout
    logs = subprocess.run([AGENTBOX, "task", "logs", task_id], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert "[1] fs_write" in logs.stdout and "[3] finish" in logs.stdout


def test_bad_model_output_and_tool_errors_are_categorised(
    gateway: GatewayProcess, model: FakeProvider
) -> None:
    model.script(act("fs_read", path="/workspace/missing"), Reply(text=""))
    with gateway.client() as op:
        task_id = op.post("/v1/tasks", json={"goal": "g"}).json()["id"]
    task = wait_state(gateway, task_id, ("succeeded", "failed"))
    assert task["state"] == "failed" and task["failure"] == "bad_model_output"
    assert "answered nothing" in task["result"]
    assert task["tool_errors"] == 1 and task["tokens_in"] == 111  # the failed turn counts too


def test_a_model_that_refuses_tools_falls_back_to_the_json_protocol(
    gateway: GatewayProcess, model: FakeProvider
) -> None:
    model.script(
        Reply(status=400, error="this model does not support tools"),
        act("terminal_run", command="echo fallback"),
        finish("done without native tools"),
    )
    with gateway.client() as op:
        task_id = op.post("/v1/tasks", json={"goal": "echo"}).json()["id"]
    task = wait_state(gateway, task_id, ("succeeded", "failed"))
    assert task["state"] == "succeeded", task
    assert task["steps"] == 2 and task["tool_calls"] == 1
    sent = [r.json() for r in model.requests[-3:]]
    assert "tools" in sent[0] and "tools" not in sent[1] and "tools" not in sent[2]


def test_native_tool_calls_drive_the_loop_and_a_plain_answer_ends_it(
    gateway: GatewayProcess, model: FakeProvider
) -> None:
    model.script(
        Reply(tool_call=("fs_write", {"path": "/workspace/n.txt", "content": "native"})),
        Reply(tool_call=("terminal_run", {"command": "cat /workspace/n.txt"})),
        Reply(text="Wrote n.txt; it says native."),  # no call: done
    )
    with gateway.client() as op:
        task_id = op.post("/v1/tasks", json={"goal": "write n.txt"}).json()["id"]
    task = wait_state(gateway, task_id, ("succeeded", "failed"))
    assert task["state"] == "succeeded", task
    assert task["result"] == "Wrote n.txt; it says native."
    assert (task["steps"], task["tool_calls"], task["tool_errors"]) == (3, 2, 0)
    with gateway.client() as op:
        steps = op.get(f"/v1/tasks/{task_id}/steps").json()
    assert steps[1]["result"]["stdout"] == "native"
    last = model.requests[-1].json()  # the turn after the second call
    assert {"fs_write", "terminal_run"} <= {t["function"]["name"] for t in last["tools"]}
    turns = last["messages"]
    assert turns[-2]["tool_calls"][0]["function"]["name"] == "terminal_run"
    assert turns[-1]["role"] == "tool" and turns[-1]["tool_call_id"] == "call_1"
    assert json.loads(turns[-1]["content"])["stdout"] == "native"


def test_cancel_interrupts_a_running_command(gateway: GatewayProcess, model: FakeProvider) -> None:
    model.script(act("terminal_run", command="sleep 60", timeout_ms=120000))
    with gateway.client() as op:
        task_id = op.post("/v1/tasks", json={"goal": "wait"}).json()["id"]
        wait_state(gateway, task_id, ("running",))
        deadline = time.monotonic() + 30
        while not model.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the command is running now
        started = time.monotonic()
        assert op.post(f"/v1/tasks/{task_id}/cancel").status_code == 200
    task = wait_state(gateway, task_id, ("cancelled", "failed", "succeeded"), timeout=30)
    assert task["state"] == "cancelled" and task["failure"] == "cancelled"
    assert time.monotonic() - started < 15  # not the 60 s of the command


def test_a_task_resumes_after_its_last_step_when_the_gateway_is_killed(
    gateway: GatewayProcess, model: FakeProvider
) -> None:
    model.script(
        act("terminal_run", command="echo step >> /workspace/count"),
        act("terminal_run", command="sleep 4"),  # the gateway dies during this one
        act("terminal_run", command="sleep 0.1"),  # asked again after the restart
        act("terminal_run", command="cat /workspace/count"),
        finish("done"),
    )
    with gateway.client() as op:
        task_id = op.post("/v1/tasks", json={"goal": "count once"}).json()["id"]
        deadline = time.monotonic() + 60
        while len(model.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(op.get(f"/v1/tasks/{task_id}/steps").json()) == 1
    gateway.kill(signal.SIGKILL)
    gateway.start()
    task = wait_state(gateway, task_id, ("succeeded", "failed"), timeout=90)
    assert task["state"] == "succeeded", task
    assert task["attempts"] == 2
    with gateway.client() as op:
        steps = op.get(f"/v1/tasks/{task_id}/steps").json()
    assert [s["n"] for s in steps] == [1, 2, 3, 4]
    assert steps[2]["result"]["stdout"] == "step\n"  # step 1 ran once: not from scratch


def test_the_cli_queues_and_cancels_without_a_gateway(tmp_path: Path) -> None:
    """In-process, the CLI writes to the home's queue (a gateway on it would run the task)."""
    env = {**os.environ, "AGENTBOX_HOME": str(tmp_path)}
    env.pop("AGENTBOX_URL", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENTBOX, "task", *args], env=env, capture_output=True, text=True)

    submitted = cli("submit", "--goal", "tidy the repo", "--project", "p9", "--json")
    assert submitted.returncode == 0, submitted.stderr
    task = json.loads(submitted.stdout)
    assert task["state"] == "queued" and task["project"] == "p9"
    assert task["id"] in cli("ls").stdout
    assert cli("cancel", task["id"]).stdout.strip() == f"{task['id']} cancelled"
    shown = json.loads(cli("show", task["id"]).stdout)
    assert shown["state"] == "cancelled" and shown["failure"] == "cancelled"
    again = cli("cancel", task["id"])
    assert again.returncode == 1 and "already" in again.stderr


def wait_sandbox(gw: GatewayProcess, sandbox_id: str, gone_or_state: str) -> str:
    """The sandbox's state once it is ``gone_or_state`` ("gone": destroyed), or the last
    one seen when that does not happen within a minute."""
    deadline = time.monotonic() + 60
    with gw.client() as op:
        while True:
            r = op.get(f"/v1/sandboxes/{sandbox_id}")
            state = "gone" if r.status_code == 404 else str(r.json()["state"])
            if state == gone_or_state or time.monotonic() > deadline:
                return state
            time.sleep(0.1)


def test_a_failed_task_ends_its_sandbox_and_its_logs_say_why(
    gateway: GatewayProcess, model: FakeProvider
) -> None:
    model.script(act("terminal_run", command="echo working"), Reply(text=""))
    with gateway.client() as op:
        task_id = op.post("/v1/tasks", json={"goal": "g"}).json()["id"]
    task = wait_state(gateway, task_id, ("succeeded", "failed"))
    assert task["state"] == "failed" and task["failure"] == "bad_model_output", task
    assert wait_sandbox(gateway, task["sandbox"], "gone") == "gone"  # tasks.on_end: destroy
    env = {**os.environ, "AGENTBOX_URL": gateway.url, "AGENTBOX_TOKEN": gateway.token}
    logs = subprocess.run([AGENTBOX, "task", "logs", task_id], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert logs.returncode == 0, logs.stderr
    assert "[1] terminal_run" in logs.stdout and "working" in logs.stdout
    assert f"failed (bad_model_output) after {task['steps']} steps: {task['result']}" in (
        logs.stdout
    )


def test_tasks_on_end_stop_keeps_the_disk(host_ready: None, model: FakeProvider) -> None:
    config = CONFIG.replace("BASE_URL", model.base_url).replace(
        "tasks: {{workers: 1,", "tasks: {{on_end: stop, workers: 1,"
    )
    model.script(act("fs_write", path="/workspace/kept.txt", content="kept"), finish("done"))
    with running(config) as gw:
        with gw.client() as op:
            task_id = op.post("/v1/tasks", json={"goal": "g"}).json()["id"]
        task = wait_state(gw, task_id, ("succeeded", "failed"))
        assert task["state"] == "succeeded", task
        assert wait_sandbox(gw, task["sandbox"], "stopped") == "stopped"
        with gw.client() as op:
            sandbox = f"/v1/sandboxes/{task['sandbox']}"
            assert op.post(f"{sandbox}/resume").status_code == 200
            r = op.post(f"{sandbox}/commands", json={"command": "cat /workspace/kept.txt"})
        assert r.status_code == 200 and r.json()["stdout"] == "kept", r.text


def test_submit_is_refused_when_no_provider_is_configured(host_ready: None) -> None:
    config = CONFIG[: CONFIG.index("providers:")] + "tasks: {{workers: 1}}\n"
    with running(config) as gw:
        with gw.client() as op:
            r = op.post("/v1/tasks", json={"goal": "g"})
            assert r.status_code == 409, r.text
            error = r.json()["error"]
            assert error["code"] == "tasks_not_configured" and "`providers:`" in error["message"]
            assert op.get("/v1/tasks").json() == []  # nothing was queued
        env = {**os.environ, "AGENTBOX_URL": gw.url, "AGENTBOX_TOKEN": gw.token}
        cli = subprocess.run([AGENTBOX, "task", "submit", "--goal", "g"], env=env,
                             capture_output=True, text=True)  # fmt: skip
        assert cli.returncode != 0 and "providers:" in cli.stderr, cli.stderr
