"""The package's layers, read from its imports: no cycle, and each layer imports only below it.

Every `import` counts, also those inside functions and under `TYPE_CHECKING`: a cycle that only
the type checker sees still ties two modules together for a reader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "render_server"

# a layer → the layers of the package it must not import
FORBIDDEN: dict[str, set[str]] = {
    "protocol": {
        "signaling", "worker", "stream", "transport", "render", "encode", "backends", "tools",
        "cli", "metrics", "logs",
    },
    "signaling": {"worker", "stream", "transport", "render", "encode", "backends", "tools", "cli"},
    "worker": {"signaling", "tools", "cli"},
    "stream": {"signaling", "worker", "tools", "cli", "backends"},
    "transport": {"signaling", "worker", "stream", "render", "tools", "cli"},  # packets: encode
    "render": {"signaling", "worker", "stream", "transport", "encode", "tools", "cli"},
    "encode": {"signaling", "worker", "stream", "transport", "tools", "cli"},
    "backends": {"signaling", "worker", "transport", "tools", "cli"},  # bench times the stream
    "tools": {"signaling", "worker", "stream", "render", "backends", "cli"},
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path, name: str, known: set[str]) -> Iterator[str]:
    """The package's modules that `path` imports (a `from pkg import module` names the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("render_server") and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: set(imports_of(path, name, known)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_reader_finds_imports_of_every_kind(tmp_path: Path) -> None:
    edges = graph()
    # a lazy import inside a function counts (the CLI imports the server processes lazily)
    assert "render_server.cli.process" in edges["render_server.cli.serve"]
    assert "render_server.config" in edges["render_server.cli.options"]


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("upper", sorted(FORBIDDEN))
def test_each_layer_imports_only_what_it_may(upper: str) -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph().items()
        if layer(module) == upper
        for target in targets
        if layer(target) in FORBIDDEN[upper]
    )
    assert wrong == []


def test_modules_stay_readable_in_one_sitting() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > 450
    }
    assert long == {}
