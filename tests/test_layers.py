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
    "scene_formats": {  # model files checked below render (and signaling's upload checks)
        "signaling", "worker", "stream", "transport", "render", "encode", "backends", "tools",
        "cli", "metrics", "logs",
    },
}  # fmt: skip


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in root.rglob("*.py")}


def imports_of(path: Path, name: str, known: set[str]) -> Iterator[str]:
    """The modules among `known` that `path` imports (a `from pkg import module` names the
    module); `known` is one package's modules."""
    top = name.partition(".")[0]
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
            if (target == top or target.startswith(top + ".")) and target != name:
                yield target


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package at `root` → the package's modules it imports."""
    found = modules(root)
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


# a small package with an import of every kind, and the edges the reader must find in it
EVERY_KIND = {
    "pkg/__init__.py": "from . import base  # relative, naming a module\n",
    "pkg/base.py": "import os  # outside the package: not an edge\n",
    "pkg/named.py": "from pkg import base  # names a module\nfrom pkg.base import thing\n",
    "pkg/lazy.py": "def late():\n    import pkg.named  # inside a function\n",
    "pkg/typed.py": (
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from pkg.lazy import late  # for the type checker only\n"
    ),
    "pkg/sub/__init__.py": "",
    "pkg/sub/deep.py": "from .. import typed  # two levels up\nfrom ..base import thing\n",
    "pkg/sub/sibling.py": "from .deep import x  # relative, from a module\nfrom . import deep\n",
}


def test_the_reader_finds_imports_of_every_kind(tmp_path: Path) -> None:
    for name, text in EVERY_KIND.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    # `from pkg import base` imports the package as well as the module: both are edges
    assert graph(tmp_path / "pkg") == {
        "pkg": {"pkg.base"},
        "pkg.base": set(),
        "pkg.named": {"pkg", "pkg.base"},
        "pkg.lazy": {"pkg.named"},
        "pkg.typed": {"pkg.lazy"},
        "pkg.sub": set(),
        "pkg.sub.deep": {"pkg", "pkg.typed", "pkg.base"},
        "pkg.sub.sibling": {"pkg.sub", "pkg.sub.deep"},
    }
    # and in the package itself: a lazy import inside a function counts (the CLI imports the
    # server processes lazily)
    edges = graph()
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
