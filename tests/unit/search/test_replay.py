"""Replay of the exhaustive grid recorded on the H100 (tests/data/replay)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.errors import UsageError
from tuner.search.replay import load_grid, objective

GRID = sorted((Path(__file__).resolve().parents[2] / "data" / "replay").glob("*.jsonl"))


def test_grid_loads_and_objective_is_relative_to_default() -> None:
    g = load_grid(GRID)
    assert g.kernels("tg") == ["default", "MMA", "TILE", "VEC"] and g.kernels("pp") == ["default", "MMA", "TILE"]
    assert g.depths("tg") == [0, 4096, 16384, 32768]
    w = {"pp": 0.5, "tg": 0.5}
    assert objective(g, {"pp": "default", "tg": "default"}, w) == pytest.approx(1.0)
    # forcing TILE for prefill on the H100 halves pp at depth (recorded): a clearly worse config
    assert objective(g, {"pp": "TILE", "tg": "default"}, w) < 0.8


def test_bad_file_name_is_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "run.jsonl"
    bad.write_text(GRID[0].read_text())
    with pytest.raises(UsageError, match="<pp|tg>"):
        load_grid([bad])


def test_cli_output_is_labelled_replay() -> None:
    from tuner.cli import cli

    res = CliRunner().invoke(cli, ["search", "--replay", *map(str, GRID)])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("|") and "---" not in ln and "mode" not in ln]
    assert lines and all("REPLAY" in ln for ln in lines)
