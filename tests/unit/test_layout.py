"""The stage layout holds: `lint-imports` passes on the package, and a back-import breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports is not installed; `pip install -e '.[test]'` brings import-linter.")
    # PYTHONPATH first, so the tuner under `cwd` is the one analysed (not the installed one).
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [exe, "--no-cache", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_stage_contracts_are_kept() -> None:
    res = _lint_imports(REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.parametrize(
    ("module", "back_import"),
    [
        ("plan/space.py", "from tuner.result import export"),  # a lower stage importing a higher one
        ("result/export.py", "from tuner.search import study"),  # result reading the study machinery
        ("errors.py", "from tuner.source import fetch"),  # a foundation importing a stage
        ("sweep/grid.py", "from tuner.search import pipeline"),  # the sweep and the search are peers
        ("search/tune.py", "from tuner.sweep import grid"),
        ("rounds/stats.py", "from tuner.search import pipeline"),  # the round engine sits below both
    ],
)
def test_a_back_import_breaks_the_contracts(tmp_path: Path, module: str, back_import: str) -> None:
    shutil.copytree(REPO / "tuner", tmp_path / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "tuner" / module
    target.write_text(target.read_text() + f"\n{back_import}  # deliberately wrong\n")
    res = _lint_imports(tmp_path)
    assert res.returncode != 0, res.stdout + res.stderr
    importer = "tuner." + module.removesuffix(".py").replace("/", ".")
    assert "BROKEN" in res.stdout and importer in res.stdout, res.stdout + res.stderr
