"""Size that shows structure: no function body over FUNCTION_LIMIT code lines, no module over
MODULE_LIMIT lines, except those in EXCEPTIONS, a list that can only shrink. Read from the source
with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "shardwise"

FUNCTION_LIMIT = 60  # code lines of a function's body: its docstring, comments and blanks not
MODULE_LIMIT = 450  # lines of a module, all of them

# name -> its size when listed. A listed item may not grow, and one that got under its limit
# must leave the list (the tests below say so), so the list only shrinks.
EXCEPTIONS: dict[str, int] = {}


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def function_sizes(source: str, prefix: str = "") -> dict[str, int]:
    """``prefix + Qualified.name`` -> code lines of the body of every function in ``source``
    (nested ones too, which also count in their outer function): from the first statement after
    the docstring to the function's end, without blank and comment-only lines."""
    lines = source.splitlines()
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                body = child.body[1:] if _is_docstring(child.body[0]) else child.body
                if body and child.end_lineno is not None:
                    code = lines[body[0].lineno - 1 : child.end_lineno]
                    count = sum(1 for s in code if s.strip() and not s.strip().startswith("#"))
                else:
                    count = 0
                sizes[f"{prefix}{scope}{child.name}"] = count
                visit(child, f"{scope}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{scope}{child.name}.")
            else:
                visit(child, scope)

    visit(ast.parse(source), "")
    return sizes


def measure(package: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(``module.py:function`` -> code lines, ``module.py`` -> lines) for every module under
    ``package``, named by their path relative to it."""
    functions: dict[str, int] = {}
    modules: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        text = path.read_text()
        modules[name] = len(text.splitlines())
        functions.update(function_sizes(text, f"{name}:"))
    return functions, modules


def _limit(name: str) -> int:
    return FUNCTION_LIMIT if ":" in name else MODULE_LIMIT


def _over(sizes: dict[str, int]) -> dict[str, int]:
    return {n: s for n, s in sizes.items() if s > _limit(n) and n not in EXCEPTIONS}


def test_no_function_is_longer_than_the_limit() -> None:
    functions, _ = measure(PACKAGE)
    assert len(functions) > 500  # the walk found the package's functions
    assert _over(functions) == {}


def test_no_module_is_longer_than_the_limit() -> None:
    _, modules = measure(PACKAGE)
    assert "codec/shard.py" in modules and "xarray/writer.py" in modules
    assert _over(modules) == {}


def test_the_exceptions_only_shrink() -> None:
    """Every listed item still exists, has not grown, and is still over its limit (one that got
    under it leaves the list)."""
    functions, modules = measure(PACKAGE)
    sizes = functions | modules
    assert sorted(n for n in EXCEPTIONS if n not in sizes) == []
    grown = {n: (sizes[n], s) for n, s in EXCEPTIONS.items() if n in sizes and sizes[n] > s}
    assert grown == {}, "grown past their listed size (now, listed)"
    under = {n: sizes[n] for n in EXCEPTIONS if n in sizes and sizes[n] <= _limit(n)}
    assert under == {}, "under the limit now: remove them from EXCEPTIONS"


def test_a_body_counts_code_lines_without_docstring_comments_or_blanks() -> None:
    source = '''
def short(x):
    """A docstring
    of three lines
    is not counted."""
    # nor a comment

    return x


class Box:
    def method(self):
        y = 1

        def inner():
            return y

        return inner


async def bare():
    """Only a docstring."""
'''
    assert function_sizes(source) == {
        "short": 1,
        "Box.method": 4,
        "Box.method.inner": 1,
        "bare": 0,
    }


def test_a_module_over_the_limit_is_found(tmp_path: Path) -> None:
    """The measure walks subpackages and names what is too long by its path."""
    (tmp_path / "room").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LIMIT + 1))
    (tmp_path / "room" / "long.py").write_text(f"def long():\n{body}\n")
    (tmp_path / "big.py").write_text("x = 1\n" * (MODULE_LIMIT + 1))
    functions, modules = measure(tmp_path)
    assert _over(functions) == {"room/long.py:long": FUNCTION_LIMIT + 1}
    assert _over(modules) == {"big.py": MODULE_LIMIT + 1}
