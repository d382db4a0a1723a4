"""No import cycle inside a package: each module can be read (and loaded) after the
modules it imports. Every import counts, including those under ``TYPE_CHECKING`` and
inside functions: a cycle that only closes there is still two modules that each need
the other to be understood.

The graph is built from the source with `ast`, without importing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports."""
    paths = {module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from pkg import mod` imports the module pkg.mod; `from mod import x`, mod
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in paths:  # `import a.b.c` needs a.b.c's module
                    target = target.rpartition(".")[0]
                if target and target != name and target != package:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_type_checking_and_package_imports():
    graph = import_graph("workers")
    assert "workers.maildir" in graph["workers.scan"]  # under TYPE_CHECKING
    assert "workers.dead_letters" in graph["workers.maildir"]  # from workers import ...


def test_workers_has_no_import_cycle():
    assert find_cycle(import_graph("workers")) is None


def test_sdk_has_no_import_cycle():
    assert find_cycle(import_graph("sdk")) is None
