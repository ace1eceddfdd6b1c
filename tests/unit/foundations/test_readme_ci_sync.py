"""The README's two "Set up" commands are what CI runs, character for character."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def readme_setup_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Set up\n(.*?)^## ", text, re.S | re.M)
    assert m, "README.md has no '## Set up' section"
    blocks = re.findall(r"^```(?:bash|sh|console)?\n(.*?)^```", m.group(1), re.S | re.M)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def ci_command_lines() -> list[str]:
    return [
        ln.strip()
        for ln in (REPO / ".ci" / "run").read_text().splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]


def test_readme_has_the_two_commands() -> None:
    cmds = readme_setup_commands()
    assert len(cmds) == 2, cmds
    assert any("pytest" in c for c in cmds) and any("tuner search" in c for c in cmds), cmds


def test_ci_runs_the_readme_commands_verbatim() -> None:
    lines = ci_command_lines()
    for cmd in readme_setup_commands():
        # The command starts a line of .ci/run (optionally followed by `|| die ...`), not a comment.
        hits = [ln for ln in lines if ln == cmd or ln.startswith(cmd + " ||")]
        assert hits, f"README command {cmd!r} is not a line of .ci/run; keep the two in sync"


def test_ci_uses_a_fresh_venv_without_system_site_packages() -> None:
    text = (REPO / ".ci" / "run").read_text()
    assert "set -euo pipefail" in text
    assert re.search(r'python3 -m venv "\$1"', text) and "--system-site-packages" not in text
    assert "deptry" in text and "tuner validate results/" in text
