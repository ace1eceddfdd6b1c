"""Replay of the exhaustive grid recorded on the H100 (tests/data/replay)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.errors import UsageError
from tuner.search.replay import load_grid

GRID = sorted((Path(__file__).resolve().parents[2] / "data" / "replay").glob("*.jsonl"))


def test_grid_loads_every_kernel_and_depth_recorded() -> None:
    g = load_grid(GRID)
    assert g.kernels("tg") == ["default", "MMA", "TILE", "VEC"] and g.kernels("pp") == ["default", "MMA", "TILE"]
    assert g.depths("tg") == [0, 4096, 16384, 32768]


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
