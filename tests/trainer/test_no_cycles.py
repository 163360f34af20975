"""No import cycles among the in-process packages, counting every import: module level, inside
functions, and under ``TYPE_CHECKING`` (each of those still ties the modules together)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "trainer", "core")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """Every module of ``modules`` that ``path`` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` depends on a.b.c; keep the longest prefix that is one of ours.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in packages for p in (ROOT / pkg).rglob("*.py")}
    modules = set(files)
    return {name: _imports(path, name, modules) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_sees_a_cycle_and_a_clean_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_counts_function_level_and_type_checking_imports():
    graph = import_graph()
    assert "agent.hooks" in graph["trainer.commands"]  # a module-level import is seen
    assert "agent.dispatch" in graph["trainer.commands"]
    assert "agent.publisher" in graph["agent.hooks"]  # imported inside a method


def test_no_import_cycles_in_the_in_process_packages():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])
