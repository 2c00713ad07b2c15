"""What a process imports to use agentbox: each entry point, in a fresh interpreter, must
not load a heavy module it does not use. Startup is most of what a short CLI call or SDK
script costs (docs/benchmarks.md, CLI); one eager import in the wrong module undoes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentbox import Sandbox
from fake_socket_gateway import fake_gateway

# Never needed to import the SDK or run the CLI's sandbox commands: the remote client,
# the secret scanner, snapshot codecs, the gateway's web and MCP stacks, cloud SDKs.
HEAVY = (
    "aiohttp",
    "boto3",
    "botocore",
    "cryptography",
    "detect_secrets",
    "fastapi",
    "httpx2",
    "jsonschema",
    "mcp",
    "opentelemetry",
    "playwright",
    "requests",
    "starlette",
    "uvicorn",
    "uvloop",
    "zstandard",
)
# Standard modules that cost a one-shot script a few ms each: for one value (``uuid``
# loads ``platform``, which probes the C library; os.urandom and os.uname give the same),
# for a rare warning (``logging``, with traceback and string) or for what a create never
# does (``tarfile``: importing an image, snapshots, uploads).
STDLIB_HEAVY = ("logging", "platform", "tarfile", "uuid")
# Loaded by no create, command or kill (pydantic's validation aside, which imports
# importlib.metadata): package data is read beside its module (isolation/), names and ids
# come from agentbox.digest (hashlib loads OpenSSL; secrets, hmac and with it OpenSSL).
SDK_NEVER = ("importlib.resources", "hashlib", "_hashlib", "secrets", "hmac")
# Loaded by no create, command or kill of a one-shot script (Sandbox.create(), run, kill):
# shutil (with bz2 and lzma) and tempfile for what a create never does (building a template,
# compiling the seccomp filter or the launcher, spooling a kept stream, a fork's scratch);
# shlex for a CLI hint; the desktop client and the Debian template builder until used;
# inspect (with ast, dis and tokenize), which dataclasses loads to give a class without a
# docstring one (agentbox.lightimport.import_dataclasses): a dataclass without a docstring on this
# path brings it back.
ONESHOT_NEVER = (
    "inspect",
    "ast",
    "dis",
    "tokenize",
    "shutil",
    "tempfile",
    "bz2",
    "lzma",
    "shlex",
    "base64",
    "agentbox.client.desktop",
    "agentbox.runtime.templates.debian",
)
# Also absent until a call needs them: asyncio (AsyncSandbox only: sync users and the CLI
# never run a loop), pydantic (validating a spec: create, not exec) and pyseccomp
# (compiling the seccomp filter, cached on disk after the first time).
LAZY = ("asyncio", "pydantic", "pydantic_core", "pyseccomp")
# The plain `sandbox exec ID -- ARGV` on a running sandbox (runtime.quick_exec) imports
# no more than os, select and sqlite3: each of these costs a share of a call that should
# take little more than the interpreter's start and the command itself.
QUICK_EXEC_NEVER = (
    "datetime",  # sqlite3's adapters: the light path uses its C core, _sqlite3
    "functools",  # _sqlite3 takes lru_cache as it loads (quick_exec._sqlite_core)
    "collections",
    "agentbox.client.sandbox",
    "agentbox.errors",
    "agentbox.runtime.runtime",
    "click",
    "dataclasses",
    "importlib",  # agentbox/__init__ imports it on a public name's first use only
    "hashlib",
    "json",
    "pathlib",
    "re",
    "subprocess",
    "typing",
)

# A one-shot script through the home's gateway (AGENTBOX_URL=unix://HOME/gateway.sock,
# client/unixhttp.py) sends three requests: it loads no runtime (nor its state database),
# no HTTP library (httpx2 and what it brings; h11 too: typing, dataclasses and inspect),
# no validation, not socket.py (its enums and selectors: the C module does), not the error
# tree unless a call fails, and nothing else a whole call would not pay back.
SOCKET_NEVER = (
    "agentbox.runtime.runtime",
    "agentbox.runtime.store",
    "agentbox.runtime.files",
    "agentbox.runtime.processes",
    "agentbox.state",
    "agentbox.config",
    "agentbox.errors",
    "sqlite3",
    "_sqlite3",
    "httpx2",
    "httpcore",
    "h11",
    "anyio",
    "certifi",
    "idna",
    "ssl",
    "http.client",
    "email",
    "socket",
    "selectors",
    "pathlib",
    "urllib.parse",
    "ipaddress",
    "threading",
    "importlib",
    "typing",  # the request and record types build theirs lazily (runtime/request_types.py)
    "contextlib",  # the HTTP client's error mapping is a plain class (client/remote.py)
    "agentbox.runtime.requests_extra",  # requests the script never builds: ~0.7 ms each
)
# Importing the SDK with such a URL set loads the package and the SDK module only: the
# transport and the call's types come with the first call.
SOCKET_IMPORT_NEVER = (
    "typing",
    "dataclasses",
    "re",
    "json",
    "enum",
    "agentbox.client.remote",
    "agentbox.client.unixhttp",
    "agentbox.runtime.requests",
)

# Runs the code given, then writes the names of the loaded modules to a file, one a line
# (stdout belongs to the CLI), whatever way the code exits. It imports nothing itself.
_PROBE = """
import atexit, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sys.modules)))
code = sys.argv.pop(1)
if code == "cli":  # as the console script does
    sys.argv[0] = "agentbox"
    from agentbox.cli.entry import main
    main()
else:
    exec(code)
"""


def loaded(tmp_path: Path, code: str, *argv: str) -> set[str]:
    """Top-level packages loaded by ``code`` (or, for "cli", the console script)."""
    return {m.split(".")[0] for m in loaded_modules(tmp_path, code, *argv)}


def loaded_modules(
    tmp_path: Path, code: str, *argv: str, env: dict[str, str] | None = None
) -> set[str]:
    out = tmp_path / "modules.txt"
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(out), code, *argv],
        capture_output=True,
        env={**os.environ, "AGENTBOX_URL": "", **(env or {})},
        timeout=120,
        check=False,
    )
    assert out.exists(), result.stderr.decode()
    return set(out.read_text().split("\n"))


def heavy_in(modules: set[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(m for m in (*HEAVY, *STDLIB_HEAVY, *LAZY) if m in modules and m not in allowed)


def test_importing_the_package_and_the_sdk_loads_nothing_heavy(tmp_path: Path) -> None:
    package_only = loaded_modules(tmp_path, "import agentbox")
    assert heavy_in({m.split(".")[0] for m in package_only}) == []
    assert "typing" not in package_only  # every entry point imports the package first
    assert heavy_in(loaded(tmp_path, "from agentbox import Sandbox, AsyncSandbox")) == []


def test_dataclasses_without_inspect_still_give_a_class_its_signature() -> None:
    """The stand-in dataclasses sees for inspect imports the real one when a class without
    a docstring needs its signature; every later user gets the real module."""
    code = (
        "import sys\n"
        # A public name whose module defines dataclasses (Sandbox's module defines none
        # and leaves it to its first call: test_a_script_through_the_homes_socket...).
        "from agentbox import CommandResult\n"
        "import dataclasses\n"
        "assert 'inspect' not in sys.modules\n"
        "@dataclasses.dataclass\n"
        "class P:\n"
        "    x: int\n"
        "assert P.__doc__ == 'P(x: int)', P.__doc__\n"
        "import inspect\n"
        "assert type(inspect) is type(sys) and inspect.signature(P) is not None\n"
        "assert str(inspect.signature(P)) == '(x: int) -> None'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        env={**os.environ, "AGENTBOX_URL": ""},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_cli_help_loads_no_command_module(tmp_path: Path) -> None:
    modules = loaded(tmp_path, "cli", "--help")
    assert heavy_in(modules) == []
    assert "agentbox" in modules and "sqlite3" not in modules  # not even the runtime


def test_cli_exec_on_a_sandbox_loads_nothing_heavy(tmp_path: Path, sandbox: Sandbox) -> None:
    modules = loaded(tmp_path, "cli", "sandbox", "exec", sandbox.id, "--", "true")
    assert heavy_in(modules) == []
    assert "click" not in modules  # the plain form skips the command tree (cli.execute)
    quick = loaded_modules(tmp_path, "cli", "sandbox", "exec", sandbox.id, "--", "true")
    assert "agentbox.runtime.quick_exec" in quick
    assert sorted(m for m in QUICK_EXEC_NEVER if m in quick) == []
    with_option = loaded(
        tmp_path, "cli", "sandbox", "exec", "--cwd", "/tmp", sandbox.id, "--", "true"
    )
    assert heavy_in(with_option) == [] and "click" in with_option


def test_sdk_run_on_a_sandbox_needs_no_pydantic(tmp_path: Path, sandbox: Sandbox) -> None:
    code = (
        "from agentbox import Sandbox\n"
        f"assert Sandbox.connect({sandbox.id!r}).commands.run('true').exit_code == 0\n"
    )
    assert heavy_in(loaded(tmp_path, code)) == []


def test_sdk_create_loads_pydantic_but_nothing_heavy(tmp_path: Path, sandbox: Sandbox) -> None:
    code = (
        "from agentbox import Sandbox\n"
        "sb = Sandbox.create(memory='96MiB', disk='64MiB')\n"
        "assert sb.commands.run('true').exit_code == 0\n"
        "sb.kill()\n"
    )
    validating = ("pydantic", "pydantic_core", "platform", "uuid")  # pydantic imports uuid
    assert heavy_in(loaded(tmp_path, code), allowed=validating) == []
    # The same settings again, in a new process: validated before, read back from the
    # home's cache (runtime/spec_cache.py), no pydantic.
    modules = loaded_modules(tmp_path, code)
    assert heavy_in({m.split(".")[0] for m in modules}) == []
    assert sorted(m for m in SDK_NEVER if m in modules) == []
    assert sorted(m for m in ONESHOT_NEVER if m in modules) == []


def test_the_installed_command_runs_the_light_exec_without_site(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """The command scripts/install.sh writes (cli/script.py) starts Python with -S: the
    plain exec never loads site; any other command loads it before click."""
    from agentbox.cli import script

    command = tmp_path / "agentbox"
    script.write(str(command))

    def imported(*argv: str) -> set[str]:
        # PYTHONPROFILEIMPORTTIME: each import on stderr, "import time: us | us | name".
        result = subprocess.run(
            [str(command), *argv],
            capture_output=True,
            env={**os.environ, "AGENTBOX_URL": "", "PYTHONPROFILEIMPORTTIME": "1"},
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        lines = result.stderr.decode().splitlines()
        return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}

    light = imported("sandbox", "exec", sandbox.id, "--", "true")
    assert "agentbox.runtime.quick_exec" in light and "site" not in light
    assert {"site", "click"} <= imported("sandbox", "ls")


def test_a_script_through_the_homes_socket_loads_no_runtime_and_no_http_library(
    tmp_path: Path,
) -> None:
    """Against a stand-in gateway (the real one: tests/integration/test_gateway_socket.py):
    what the client loads does not depend on who answers."""
    path = tmp_path / "gateway.sock"
    env = {"AGENTBOX_URL": f"unix://{path}", "AGENTBOX_TOKEN": "t"}
    code = (
        "from agentbox import Sandbox\n"
        "sb = Sandbox.create()\n"
        "assert sb.commands.run(['true']).stdout == 'hi\\n'\n"
        "sb.kill()\n"
    )
    with fake_gateway(path) as gateway:
        modules = loaded_modules(tmp_path, code, env=env)
        imported = loaded_modules(tmp_path, "from agentbox import Sandbox", env=env)
    assert len(gateway.requests) == 3  # create, run, kill: the script did run
    assert "agentbox.client.unixhttp" in modules
    assert heavy_in({m.split(".")[0] for m in modules}) == []
    never = (*SOCKET_NEVER, *SDK_NEVER, *ONESHOT_NEVER)
    assert sorted(m for m in never if m in modules) == []
    assert sorted(m for m in SOCKET_IMPORT_NEVER if m in imported) == []
