"""What a command in a live sandbox is started with: the ``agentbox-nsexec enter`` argv
and the environment it starts from. One definition for ``CommandRunner`` and the CLI's
light exec path (``runtime.quick_exec``); standard modules only, none heavy."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not loaded on the light path
if TYPE_CHECKING:
    from typing import TypedDict

    class EnterOptions(TypedDict, total=False):
        """``launcher_argv``'s options, for the wrappers that pass them on."""

        exit_file: str | None
        hold_stdin: str | None
        setsid: bool
        ctty: bool
        detach: bool


# Ids inside the sandbox: the agent is an ordinary user, never root.
SANDBOX_UID = 1000
SANDBOX_GID = 1000
WORKSPACE = "/workspace"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def base_env(hostname: str) -> dict[str, str]:
    """The environment every process of a sandbox starts from."""
    return {
        "PATH": BASE_PATH,
        "HOME": "/home/user",
        "USER": "user",
        "LOGNAME": "user",
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "HOSTNAME": hostname,
        "TERM": "xterm-256color",
    }


def launcher_argv(
    nsexec: str,
    leaf_dir: str,
    v1_dirs: list[str],
    init_pid: int,
    seccomp: str,
    cwd: str | None,
    argv: list[str],
    *,
    exit_file: str | None = None,
    hold_stdin: str | None = None,
    setsid: bool = False,
    ctty: bool = False,
    detach: bool = False,
) -> list[str]:
    """The launcher argv: join cgroup leaf ``leaf_dir`` (and the sandbox's v1 groups),
    every namespace of ``init_pid``, the sandbox user, no_new_privs and the ``seccomp``
    program, then exec ``argv`` in ``cwd`` (an absolute path; default /workspace)."""
    out = [nsexec, "enter", "--leaf", leaf_dir]
    for d in v1_dirs:
        out += ["--cgroup", d]
    out += [
        "--ns-pid",
        str(init_pid),
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--seccomp",
        seccomp,
        "--cwd",
        cwd or WORKSPACE,
    ]
    if exit_file:
        out += ["--exit-file", exit_file]
    if hold_stdin:  # the launcher holds the FIFO's write end: EOF on request
        out += ["--hold-stdin", hold_stdin]
    if detach:
        out.append("--detach")
    if setsid:
        out.append("--setsid")
    if ctty:
        out.append("--ctty")
    return [*out, "--", *argv]
