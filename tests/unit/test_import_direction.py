"""Imports point down, and nothing imports in a circle (docs/design.md, "Layout").

Read from the source with ``ast``, not by importing it, so that every import counts:
module level, inside a function (imported late, still a dependency) and under
``TYPE_CHECKING`` (a type is a dependency too). A function-level import that must point
up says why in a comment on it or on the line above: ``# upward: <reason>``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "agentbox"

# Bottom first. A package may import only packages on a lower line; those on one line
# are independent of each other. Top-level modules (errors.py, ...) count as packages.
LAYERS: list[set[str]] = [
    {"hints", "lightimport"},  # what an error says to do next; standard modules, lightly
    {"endpoint"},  # which backend the SDK and the CLI reach (a gateway, or in-process)
    {"errors"},  # the one error tree
    {"units", "fsutil", "digest"},  # sizes and durations; durable writes, locks, access
    # kinds; SHA-256 names and random ids without hashlib
    {"state"},  # the state database (SQLite, PostgreSQL)
    {"isolation"},  # kernel mechanisms: namespaces, cgroups, seccomp, disks, gVisor
    {"network", "volumes"},  # the egress library (names, proxy, netns plane); cache volumes
    {"config"},  # every settings model (the specs check names with network's rules)
    {"audit"},  # the hash-chained trail: whoever records imports it
    {"policy"},  # tool policy, shell analysis, approvals, redaction, the principal
    {"storage"},  # object stores, snapshot codecs, the secret scan (policy's detectors)
    {"runtime"},  # sandbox lifecycle on one host
    {"browser"},  # Chromium inside a sandbox
    {"desktop"},  # Xvnc + openbox inside a sandbox (drives the browser's launcher)
    {"egressd", "observability"},  # the egress daemon; metrics, traces, events
    {"models"},  # the model endpoint's service and wire formats, the provider pool
    {"tasks"},  # batch agent tasks: queue and worker
    {"client"},  # the SDK: local and remote backends
    {"gateway"},  # front ends: HTTP app, REST, MCP, stdio, auth, console, E2B
    {"cluster"},  # cluster mode: the node role and the gateway replica (on the gateway app)
    {"cli"},  # the command line
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
MARK = "# upward:"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _package(module: str) -> str:
    """``agentbox.gateway.rest`` -> ``gateway``; the root package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _target(name: str) -> str:
    """The agentbox module an imported dotted name lives in (a name in a module, or a
    module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported agentbox module, line, marked upward with a reason) for every import."""
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        # the statement and the line above it (a comment of its own)
        statement = "\n".join(lines[node.lineno - 2 : (node.end_lineno or node.lineno)])
        marked = MARK in statement and bool(statement.split(MARK, 1)[1].strip())
        for name in names:
            if name == "agentbox" or name.startswith("agentbox."):
                found.append((_target(name), node.lineno, marked))
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in MODULES} - {""}
    assert packages - RANK.keys() == set(), "place the new package in LAYERS"
    assert RANK.keys() - packages == set(), "LAYERS names a package that is gone"


def test_imports_point_down() -> None:
    upward = []
    for module, found in GRAPH.items():
        source = _package(module)
        if not source:  # the root package: the public facade, it may name anything
            continue
        for target, line, marked in found:
            dest = _package(target)
            # `from agentbox import __version__`: importing any module loads the root anyway
            if not dest or dest == source or marked:
                continue
            if RANK[dest] >= RANK[source]:
                upward.append(f"{MODULES[module].relative_to(SRC)}:{line}: {source} -> {dest}")
    assert upward == [], "imports that point up or sideways:\n" + "\n".join(upward)


def test_upward_marks_are_function_level_and_few() -> None:
    # A mark excuses a late import only: a module-level upward import is a design error.
    marked = set()  # one statement may import several names: counted once
    for module in GRAPH:
        tree = ast.parse(MODULES[module].read_text())
        top = {n.lineno for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)}
        for _, line, is_marked in GRAPH[module]:
            if is_marked:
                assert line not in top, f"{module}:{line}: a marked import at module level"
                marked.add(f"{module}:{line}")
    assert len(marked) <= 1, f"upward imports grow: {marked}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_circle_between_packages() -> None:
    # A marked upward import is the one excused edge (counted above).
    edges: dict[str, set[str]] = {}
    for module, found in GRAPH.items():
        source = _package(module)
        if source:
            edges.setdefault(source, set()).update(
                _package(t) for t, _, up in found if _package(t) not in ("", source) and not up
            )
    assert _cycles(edges) == []


def test_no_circle_between_modules() -> None:
    # Within a package too: a circle means two modules are one job, or one of them holds
    # something a third, lower module should.
    edges = {
        module: {t for t, _, _ in found if t != module and t != "agentbox"}
        for module, found in GRAPH.items()
    }
    assert _cycles(edges) == []


def test_the_check_sees_imports() -> None:
    # Guards the reader: these edges exist and point down.
    assert ("agentbox.errors", True) in {
        (t, _package(t) == "errors") for t, _, _ in GRAPH["agentbox.runtime.runtime"]
    }
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lower_planes_load_no_front_end() -> None:
    # Loaded for real: every module below the gateway (the SDK and the runtime a plain
    # in-process `Sandbox.create(network=...)` runs, the egress library and daemon, ...)
    # imports no module of the gateway or the CLI.
    below = sorted(m for m in MODULES if _package(m) and RANK[_package(m)] < RANK["gateway"])
    probe = (
        "import importlib, sys\n"
        f"for name in {below!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[1:2] in (['gateway'], ['cli'])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
