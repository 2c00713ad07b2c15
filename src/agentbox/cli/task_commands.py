"""``agentbox task``: submit batch tasks and follow them.

Through the gateway ``AGENTBOX_URL`` names, else the home's gateway when one serves its
socket (``agentbox.endpoint``); otherwise straight to the home's task queue (a gateway
started on the home later picks the task up).
"""

from __future__ import annotations

import os
from typing import Any

import click

from agentbox import endpoint
from agentbox.cli.errors import reports_errors
from agentbox.cli.output import print_json, print_listing
from agentbox.cli.params import SuggestingGroup
from agentbox.config.host import agentbox_home
from agentbox.tasks.store import TaskStore


class _Tasks:
    """The same five calls, over REST or on the local store."""

    def __init__(self) -> None:
        self.client: Any = None
        self.store: TaskStore | None = None
        url = endpoint.gateway_url()
        if url:
            from agentbox.client.remote import connect

            self.client = connect(url, os.environ.get("AGENTBOX_TOKEN"))
        else:
            self.store = TaskStore(agentbox_home() / "tasks.db")

    def submit(self, goal: str, template: str, project: str, max_steps: int) -> dict[str, Any]:
        if self.store is not None:
            return self.store.submit(goal, template, project, max_steps).to_dict()
        body = {"goal": goal, "template": template, "project": project, "max_steps": max_steps}
        return dict(self.client.request("POST", "/v1/tasks", json=body))

    def all(self) -> list[dict[str, Any]]:
        if self.store is not None:
            return [t.to_dict() for t in self.store.list()]
        return list(self.client.request("GET", "/v1/tasks"))

    def show(self, task_id: str) -> dict[str, Any]:
        if self.store is not None:
            return self.store.get(task_id).to_dict()
        return dict(self.client.request("GET", f"/v1/tasks/{task_id}"))

    def steps(self, task_id: str) -> list[dict[str, Any]]:
        if self.store is not None:
            self.store.get(task_id)
            return [s.to_dict() for s in self.store.steps(task_id)]
        return list(self.client.request("GET", f"/v1/tasks/{task_id}/steps"))

    def cancel(self, task_id: str) -> dict[str, Any]:
        if self.store is not None:
            return self.store.request_cancel(task_id).to_dict()
        return dict(self.client.request("POST", f"/v1/tasks/{task_id}/cancel"))


@click.group(cls=SuggestingGroup)
def task() -> None:
    """Batch tasks: a goal, run by the reference agent loop in a fresh sandbox.

    \b
    Workers run inside `agentbox serve` (the model comes from its `providers`); every
    step is stored, so a task survives a gateway restart and resumes after its last
    completed step.
    """


@task.command("submit")
@click.option("--goal", required=True, help="What the agent should achieve.")
@click.option("--template", "-t", default="default", show_default=True)
@click.option("--project", default="default", show_default=True, help="For budgets.")
@click.option("--max-steps", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the task as a JSON object.")
@reports_errors()
def task_submit(goal: str, template: str, project: str, max_steps: int, as_json: bool) -> None:
    """Queue a task and print its id."""
    data = _Tasks().submit(goal, template, project, max_steps)
    print_json(data) if as_json else click.echo(data["id"])


@task.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@reports_errors()
def task_ls(as_json: bool) -> None:
    """List tasks, newest first."""

    def line(t: dict[str, Any]) -> str:
        failure = f" ({t['failure']})" if t.get("failure") else ""
        return (f"{t['id']}  {t['state']}{failure}  {t['steps']} steps  "
                f"${t['cost_usd']:.4f}  {t['goal'][:60]}")  # fmt: skip

    print_listing(
        _Tasks().all(), as_json, line,
        empty='no tasks (submit one with `agentbox task submit --goal "..."`)',
    )  # fmt: skip


@task.command("show")
@click.argument("task_id")
@reports_errors()
def task_show(task_id: str) -> None:
    """A task with its accounting (steps, tool calls, tokens, cost, duration)."""
    print_json(_Tasks().show(task_id))


@task.command("logs")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the steps as JSON.")
@reports_errors()
def task_logs(task_id: str, as_json: bool) -> None:
    """Every completed step: what the model chose and what came back; then how a task
    that is over ended (a failed one: why)."""
    tasks = _Tasks()
    steps = tasks.steps(task_id)
    if as_json:
        print_json(steps)
        return
    for s in steps:
        action = s["action"]
        what = (
            f"finish: {action['finish']}"
            if "finish" in action
            else f"{action['tool']} {action.get('arguments', {})}"
        )
        click.echo(f"[{s['n']}] {what}")
        if "finish" not in action:
            click.echo(f"    -> {str(s['result'])[:300]}")
    t = tasks.show(task_id)
    if t["state"] in ("failed", "cancelled"):
        click.echo(f"{t['state']} ({t['failure']}) after {t['steps']} steps: {t['result']}")


@task.command("cancel")
@click.argument("task_id")
@reports_errors()
def task_cancel(task_id: str) -> None:
    """Stop a task (a running command is killed)."""
    data = _Tasks().cancel(task_id)
    click.echo(
        f"{data['id']} {data['state']}{' (cancelling)' if data['state'] == 'running' else ''}"
    )
