"""The import graph holds the house's layering (read from the source with ``ast``, so imports
inside functions and under ``TYPE_CHECKING`` count as much as module-level ones).

- Every part is imported as ``cliffguard.<part>``: no module imports a bare ``core``, ``agent``,
  ``controller``, ``dashboard`` or ``trainer`` (those names belong to users' programs).
- ``cliffguard.core`` imports no other project package: every process can import it.
- ``cliffguard.agent`` (the in-process runtime) is imported only by the trainer, the integrations
  inside the agent itself, and benchmarks; never by the controller or dashboard, and the CLI
  (``cliffguard.cli``, ``cliffguard.commands``, ...) never reaches its runtime modules (hooks,
  publisher, listener).
- No module but a test imports a private (``_name``) object from another part.
- Shared test helpers live in ``testing`` (used by ``tests`` and ``bench``); product code imports
  neither, and ``bench`` never imports from ``tests``.
- There is no import cycle between project modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder of the repository root -> the package it is imported as (setup.py maps them)
FOLDERS = {"core": "cliffguard.core", "agent": "cliffguard.agent", "trainer": "cliffguard.trainer",
           "controller": "cliffguard.controller", "dashboard": "cliffguard.dashboard", "cliffguard": "cliffguard",
           "bench": "bench", "testing": "testing", "tests": "tests"}
PARTS = ("core", "agent", "trainer", "controller", "dashboard")
BARE = set(PARTS)
AGENT_RUNTIME = ("cliffguard.agent.hooks", "cliffguard.agent.publisher", "cliffguard.agent.listener")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([FOLDERS[parts[0]], *parts[1:]])


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if "migrations" not in path.parts:
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def part_of(module: str) -> str:
    """The part a module belongs to: ``core``, ``agent``, ..., ``cliffguard`` (the CLI and tools),
    ``bench`` or ``tests``."""
    head, _, rest = module.partition(".")
    if head == "cliffguard" and rest.split(".")[0] in PARTS:
        return rest.split(".")[0]
    return head


def _ours(name: str) -> bool:
    return name.split(".")[0] in ("cliffguard", "bench", "testing", "tests")


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    is_pkg = MODULES[importer].name == "__init__.py"
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str) -> list[tuple[str, str | None]]:
    """(imported project module, imported name or None) for every import statement in it."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if _ours(a.name)]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if not _ours(target):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, None) if sub in MODULES else (target, alias.name))
    return out


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _name in imports_of(module):
            while target and target not in MODULES:  # `import a.b.c` of a non-module name
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    return graph


def bare_imports(source: str) -> list[str]:
    """The generic top-level names a module's source imports (``import core.x``, ``from agent import y``)."""
    tree = ast.parse(source)
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] in BARE]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out += [node.module] if node.module.split(".")[0] in BARE else []
    return out


def test_the_graph_sees_every_part():
    assert {part_of(m) for m in MODULES} == {*PARTS, "cliffguard", "bench", "testing", "tests"}


def test_only_tests_and_benchmarks_import_the_testing_helpers():
    bad = [(m, t) for m in MODULES if part_of(m) not in ("tests", "bench", "testing")
           for t, _ in imports_of(m) if part_of(t) in ("testing", "tests")]
    assert bad == []


def test_the_shared_helpers_do_not_reach_into_tests_or_benchmarks():
    bad = [(m, t) for m in MODULES if part_of(m) == "testing"
           for t, _ in imports_of(m) if part_of(t) in ("tests", "bench")]
    bad += [(m, t) for m in MODULES if part_of(m) == "bench"
            for t, _ in imports_of(m) if part_of(t) == "tests"]
    assert bad == []


def test_no_module_imports_a_bare_part_name():
    bad = {m: found for m, path in MODULES.items() if (found := bare_imports(path.read_text()))}
    assert bad == {}


def test_the_bare_name_check_catches_one():
    planted = "from core.events import Event\nimport agent.hooks as hooks\nfrom cliffguard.core import keys\n"
    assert bare_imports(planted) == ["core.events", "agent.hooks"]


def test_core_imports_no_other_project_package():
    bad = [(m, t) for m in MODULES if part_of(m) == "core"
           for t, _ in imports_of(m) if part_of(t) != "core"]
    assert bad == []


def test_only_the_trainer_and_benchmarks_import_the_agent():
    bad = []
    for m in MODULES:
        top = part_of(m)
        for t, _ in imports_of(m):
            if part_of(t) != "agent":
                continue
            runtime = t.startswith(AGENT_RUNTIME)
            if top in ("controller", "dashboard", "core") or (top == "cliffguard" and runtime):
                bad.append((m, t))
    assert bad == []


def test_no_private_name_crosses_a_package():
    # (tests may reach a module's private helpers; benchmarks and product code may not)
    bad = [(m, f"{t}.{name}") for m in MODULES if part_of(m) != "tests" for t, name in imports_of(m)
           if name and name.startswith("_") and part_of(t) != part_of(m)]
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter
                counter += 1
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return out


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_edges()) == []
