"""The package's layers import downward: the entry points sit on top, and nothing below them imports them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "moonmind_worker"

#: Import cycles that exist today, each with why it is tolerated; a new one fails the test.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        out[name.removesuffix(".__init__") if name != "__init__" else ""] = path
    return out


def _imports() -> dict[str, set[str]]:
    """Every module's imports of other modules of the package, at any depth of its code."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".") if package else []
                    base = parts[: len(parts) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.startswith("moonmind_worker"):
                    target = node.module.removeprefix("moonmind_worker").lstrip(".")
                else:
                    continue
                targets = [target] + [f"{target}.{a.name}".lstrip(".") for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.removeprefix("moonmind_worker").lstrip(".") for a in node.names
                           if a.name.startswith("moonmind_worker")]
            else:
                continue
            # a module's own packages are imported before it, whatever it says: no edge of the layering
            graph[name].update(t for t in targets if t in modules and t != name and not name.startswith(f"{t}."))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports of the CLI from outside it (the console entry `__main__` excepted)."""
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if target.startswith("cli") and not name.startswith("cli") and name != "__main__")


def test_nothing_below_the_cli_imports_it():
    upward = _upward(_imports())
    assert not upward, "move what these need below the CLI (moonmind_worker/entry.py):\n" + "\n".join(upward)


def test_no_import_cycle_beyond_the_known_ones():
    new = [sorted(c) for c in _cycles(_imports()) if c not in KNOWN_CYCLES]
    assert not new, f"new import cycles: {new}"


#: A module past this many lines holds more than one thing: split it along what it holds.
MODULE_LINES = 600


def test_no_module_is_over_600_lines():
    long = [f"{path.relative_to(PACKAGE)}: {n}" for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MODULE_LINES]
    assert not long, "split these:\n" + "\n".join(long)


def test_the_checker_sees_an_upward_import_and_a_cycle():
    graph = {"cli.rag": {"transports"}, "transports": {"cli.rag"}, "store": set()}
    assert _cycles(graph) == [frozenset({"cli.rag", "transports"})]
    assert _upward(graph) == ["transports -> cli.rag"]
    real = _imports()
    assert "entry" in real["cli.rag"] and "errors" in real["entry"]  # relative imports resolved, at any depth
