"""docs/design.md names the code it describes: every backticked ``package/module.name`` (or
``tuner.package.module.name``, or a ``tuner/...py`` path) in it resolves in this checkout, so a rename or a move
that forgets the document fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "design.md"
PACKAGES = {p.name for p in (ROOT / "tuner").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
MODULES = {p.stem for p in (ROOT / "tuner").glob("*.py")}
# A backticked file name, not code: config.toml, study.db, report.md ...
FILE_SUFFIX = re.compile(
    r"\.(db|toml|md|json|env|png|txt|cu|cuh|cpp|h|j2|sqlite3|xz|gguf|patch|cmake|jsonl|parquet|csv|sh)$"
)
NAME = re.compile(r"^(?:tuner[./])?[a-z_][a-z0-9_]*(?:/[a-z_][a-z0-9_]*)*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?$")


def names() -> list[str]:
    out = []
    for token in re.findall(r"`([^`\n]+)`", DOC.read_text()):
        token = token.strip()
        if FILE_SUFFIX.search(token) and not token.endswith(".py"):
            continue
        if token.endswith(".py"):
            if "/" in token:  # a bare `options.py` is another project's file (cibuildwheel's)
                out.append(token)
            continue
        if not NAME.match(token):
            continue
        head = re.split(r"[./]", token.removeprefix("tuner.").removeprefix("tuner/"))[0]
        dotted = "." in token or "/" in token
        if dotted and (head in PACKAGES or head in MODULES):
            out.append(token)
    return sorted(set(out))


def resolves(token: str) -> bool:
    if token.endswith(".py"):
        return any(ROOT.glob(token)) or any((ROOT / "tuner").glob(token))
    parts = re.split(r"[./]", token.removesuffix("()").removeprefix("tuner.").removeprefix("tuner/"))
    # the longest prefix that imports as a module under tuner, then attributes
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module("tuner." + ".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_design_document_names_something() -> None:
    assert len(names()) > 20  # the parser still finds the document's module names


@pytest.mark.parametrize("token", names())
def test_every_named_module_and_name_resolves(token: str) -> None:
    assert resolves(token), f"docs/design.md names `{token}`, which does not resolve in tuner/"
