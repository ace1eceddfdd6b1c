"""Every third-party import under tuner/ and tests/ is declared in pyproject.toml (checked by deptry)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytest.importorskip("deptry", reason="deptry is in the [test] extra: pip install -e '.[test]'")


def _deptry(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deptry", ".", "--no-ansi", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pyproject_declares_every_import() -> None:
    res = _deptry(REPO / "pyproject.toml")
    assert res.returncode == 0, res.stdout + res.stderr


def test_removing_scipy_fails_naming_it(tmp_path: Path) -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^\s*"scipy[><=~!]', text, re.M), "scipy is no longer a runtime dependency?"
    cut = tmp_path / "pyproject.toml"
    cut.write_text(re.sub(r'^\s*"scipy[><=~!][^\n]*\n', "", text, flags=re.M))
    res = _deptry(cut)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    # DEP001 (missing) in a venv without scipy; DEP003 (transitive) where something else pulled it in.
    assert re.search(r"tuner/\S+\.py:\d+:\d+: DEP00[13] 'scipy' imported but", out), out
