"""The package's layers go one way: every import (at module level, inside functions, under
``TYPE_CHECKING``) points to the module's own room or to a room below it, and no modules import
each other in a cycle. Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "shardwise"

# bottom to top; a room may import its own modules and the rooms of lower floors only
FLOORS: list[tuple[str, ...]] = [
    ("errors",),
    ("compat",),
    ("runtime",),  # the pool, unit sizes, memory probes: shared by everything above
    ("core",),
    ("codec",),
    ("storage",),
    ("engine",),
    ("durability",),
    ("write",),  # the one policy, the pipeline and its sessions, write_array's steps, creates
    ("api",),
    ("pyramid",),  # below conversion: convert(pyramid=...) writes through write_pyramid
    ("conversion", "xarray", "batch"),
    ("cli",),
    ("shardwise",),  # the package's __init__: the public names
]


def room(module: str) -> str:
    """A module's room: the package it is in (the top-level modules are rooms of their own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a directory)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, name: str, is_package: bool, mods: set[str]) -> set[str]:
    """The package's modules one statement imports (none when it is not an import)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & mods
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        here = name.split(".") if is_package else name.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join(here + ([node.module] if node.module else []))
    # "from .x import y" loads the module x.y when there is one, else takes y from x
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names} & mods


def imports(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, wherever the import statement is."""
    mods = modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        found = set().union(
            *(_imported(n, name, path.name == "__init__.py", set(mods)) for n in ast.walk(tree))
        )
        graph[name] = found - {name}
    return graph


def floor(name: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if name in rooms)


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, dsts in graph.items():
        out.setdefault(room(src), set()).update(room(d) for d in dsts if room(d) != room(src))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_is_in_a_room_of_a_floor() -> None:
    known = {r for rooms in FLOORS for r in rooms}
    unplaced = sorted(m for m in modules(PACKAGE) if room(m) not in known)
    assert not unplaced, f"place these modules' room in FLOORS: {unplaced}"


def test_rooms_import_only_their_own_and_lower_floors() -> None:
    graph = imports(PACKAGE)
    upward = sorted(
        f"{src} -> {dst}"
        for src, dsts in graph.items()
        for dst in dsts
        if room(src) != room(dst) and floor(room(dst)) >= floor(room(src))
    )
    rooms = room_graph(graph)
    shown = "\n".join(f"  {r} -> {', '.join(sorted(rooms[r]))}" for r in sorted(rooms))
    assert not upward, "imports that go up or sideways:\n" + "\n".join(upward) + "\n" + shown


def test_no_modules_import_each_other_in_a_cycle() -> None:
    found = cycles(imports(PACKAGE))
    assert not found, f"import cycles: {found}"


def test_the_reader_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    """The graph counts every import statement, not only those run at import time."""
    pkg = tmp_path / "shardwise"
    (pkg / "core").mkdir(parents=True)
    (pkg / "engine").mkdir()
    for init in (pkg, pkg / "core", pkg / "engine"):
        (init / "__init__.py").write_text("")
    (pkg / "core" / "low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..engine.high import thing\n"
        "def f():\n    from ..engine import other\n"
    )
    (pkg / "engine" / "high.py").write_text("from ..core.low import f\n")
    (pkg / "engine" / "other.py").write_text("import shardwise.core.low\n")
    graph = imports(pkg)
    assert graph["shardwise.core.low"] == {"shardwise.engine.high", "shardwise.engine.other"}
    assert graph["shardwise.engine.other"] == {"shardwise.core.low"}
    assert cycles(graph) == [
        ["shardwise.core.low", "shardwise.engine.high", "shardwise.engine.other"]
    ]
