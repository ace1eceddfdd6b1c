"""The seams between modules hold: no module imports another one's private names, and no import circle
exists (function-level imports included, which `lint-imports` does not order within a layer).

A leading underscore on a function, class or constant means "this module's own"; on a module
(``tuner/_run.py``, ``tuner/cli/_params.py``) it means "its package's own", so importing such a
module from inside that package is fine.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (a package folder named like the package)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from X import ...`` in module ``name`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    pkg = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
    up = pkg[: len(pkg) - (node.level - 1)]
    return ".".join([*up, node.module] if node.module else up)


def _imports(name: str, path: Path, mods: dict[str, Path]) -> Iterator[tuple[int, str, list[str]]]:
    """(line, imported module, names taken from it) of every import of a package module, at any depth
    of the file (function bodies and ``if TYPE_CHECKING:`` blocks included)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, path, node)
            if base not in mods:
                continue
            taken = []
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in mods:  # a submodule, not a name defined in ``base``
                    yield node.lineno, sub, []
                else:
                    taken.append(a.name)
            if taken:
                yield node.lineno, base, taken


def private_uses(root: Path) -> list[str]:
    """``file:line: what`` for every private name one module takes from another: ``from X import _name``
    and ``X._name`` where X is an imported package module."""
    mods = _modules(root)
    found = []
    for name, path in mods.items():
        aliases: dict[str, str] = {}
        for line, mod, taken in _imports(name, path, mods):
            found += [
                f"{path.relative_to(root.parent)}:{line}: from {mod} import {t}"
                for t in taken
                if _private(t) and mod != name
            ]
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):  # the local names that stand for a package module
            if isinstance(node, ast.ImportFrom) and (base := _base(name, path, node)) in mods:
                for a in node.names:
                    if f"{base}.{a.name}" in mods:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods:
                        top = a.name.split(".")[0]
                        aliases[a.asname or top] = a.name if a.asname else top
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain, v = [node.attr], node.value
            while isinstance(v, ast.Attribute):
                chain.insert(0, v.attr)
                v = v.value
            if not (isinstance(v, ast.Name) and v.id in aliases):
                continue
            owner = ".".join([aliases[v.id], *chain[:-1]])
            if owner in mods and owner != name and f"{owner}.{node.attr}" not in mods:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {owner}.{node.attr}")
    return sorted(set(found))


def import_cycles(root: Path) -> list[list[str]]:
    """Every import circle of the package's modules (one per strongly connected group, shown as a path).

    An edge is an import of a module anywhere in a file. Importing ``a.b.c`` also runs ``a/b/__init__``,
    but that is not an edge here: a package re-exporting its modules would otherwise always be a circle.
    """
    mods = _modules(root)
    graph = {n: sorted({m for _, m, _ in _imports(n, p, mods) if m != n}) for n, p in mods.items()}
    # Tarjan's strongly connected components, iteratively (no recursion limit on a long chain)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    cycles.append(_circle(sorted(comp), graph))
    return cycles


def _circle(comp: list[str], graph: dict[str, list[str]]) -> list[str]:
    """One circle through the group's first module, as the modules in import order (for the message)."""
    members, first = set(comp), comp[0]
    prev: dict[str, str] = {}
    todo = [first]
    while todo:
        v = todo.pop(0)
        for w in graph[v]:
            if w == first:
                path = [v]
                while path[-1] != first:
                    path.append(prev[path[-1]])
                return [*reversed(path), first]
            if w in members and w not in prev:
                prev[w] = v
                todo.append(w)
    return comp


def test_no_module_imports_another_modules_private_names() -> None:
    found = private_uses(REPO / "tuner")
    assert not found, (
        "private names used across modules (make the name public where it is that module's API, or "
        "move it to a module both import):\n" + "\n".join(found)
    )


def test_no_import_cycles() -> None:
    cycles = import_cycles(REPO / "tuner")
    assert not cycles, "import circles (move the shared piece into a module both import):\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def import_guards(root: Path) -> list[str]:
    """``file:line`` of every ``try: import <package module>`` whose handler catches ImportError: the module
    exists, so a guard only hides a broken import (optional third-party modules are guarded, and not here)."""
    mods = _modules(root)
    found = []
    for _name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Try):
                continue
            caught = (
                {n.id for h in node.handlers for n in ast.walk(h.type) if isinstance(n, ast.Name)}
                if all(h.type is not None for h in node.handlers)
                else {"ImportError"}
            )
            if not caught & {"ImportError", "ModuleNotFoundError"}:
                continue
            body = ast.Module(body=node.body, type_ignores=[])
            pkg_imports = [
                n
                for n in ast.walk(body)
                if isinstance(n, (ast.Import, ast.ImportFrom))
                and any(
                    m.split(".")[0] == root.name
                    for m in ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or root.name])
                )
            ]
            found += [f"{path.relative_to(root.parent)}:{n.lineno}" for n in pkg_imports]
    return found


def test_no_import_guard_around_the_packages_own_modules() -> None:
    assert not import_guards(REPO / "tuner")


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    "text",
    [
        "from pkg.a import _helper\n",
        "def f():\n    from pkg.a import _helper\n",
        "import pkg.a\npkg.a._helper()\n",
        "from pkg import a as other\nother._helper()\n",
        "from . import a\na._helper()\n",
    ],
)
def test_the_private_scan_sees_each_spelling(tmp_path: Path, text: str) -> None:
    root = _package(
        tmp_path,
        {
            "a.py": "def _helper(): ...\n",
            "b.py": text,
            "_priv.py": "",
            "sub/__init__.py": "",
            "sub/c.py": "from pkg import _priv\nfrom pkg.a import _helper as h  # noqa\n",
        },
    )
    found = private_uses(root)
    assert any(f.startswith("pkg/b.py") and "_helper" in f for f in found), found
    # a package-private module is importable inside the package; a name is not
    assert [f for f in found if f.startswith("pkg/sub")] == ["pkg/sub/c.py:2: from pkg.a import _helper"]


def test_the_guard_scan_sees_a_guarded_own_import(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a.py": "try:\n    from pkg import b\nexcept ImportError:\n    b = None\n",
            "b.py": "",
            "c.py": "try:\n    import numpy\nexcept ImportError:\n    numpy = None\n",
        },
    )
    assert import_guards(root) == ["pkg/a.py:2"]


def test_the_cycle_scan_sees_a_function_level_circle(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a.py": "from pkg.b import x\n",
            "b.py": "def x():\n    from pkg import c\n",
            "c.py": "if True:\n    import pkg.a\n",
            "d.py": "from pkg.a import y\n",
            "e/__init__.py": "from pkg.e.f import z\n",
            "e/f.py": "from pkg.a import w\n",
        },
    )
    assert import_cycles(root) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
