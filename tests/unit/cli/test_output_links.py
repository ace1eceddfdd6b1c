"""No writer follows a link it finds inside its -o: each file is renamed over its name (the link is replaced,
what it points at is untouched)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.unit.result.test_report import _frame
from tuner.measure.frames import save_results


def test_report_o_replaces_links_in_the_folder_and_leaves_their_targets(tmp_path: Path) -> None:
    from tuner.cli.bench_cmd import report

    save_results(_frame("base", {"pp": 1, "tg": 1}), tmp_path / "base")
    save_results(_frame("new", {"pp": 1.2, "tg": 1}, seed=3), tmp_path / "new")
    out, victim = tmp_path / "rep", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("someone else's file")
    for name in ("report.md", "depth.png"):
        (out / name).symlink_to(victim)
    r = CliRunner().invoke(report, [str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "someone else's file"
    assert not (out / "report.md").is_symlink() and (out / "report.md").read_text().startswith("# llama-bench")
    assert not (out / "depth.png").is_symlink() and (out / "depth.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in out.iterdir()) == ["depth.png", "report.md"]  # no temporary file left


IN_PLACE = (
    ["bench"],
    ["check"],
    ["ab"],
    ["equivalence"],
    ["sweep", "run"],
    ["sweep", "mmq"],
    ["sweep", "confirm", "."],
)


@pytest.mark.parametrize("command", IN_PLACE, ids=lambda c: " ".join(c[:2]))
def test_a_run_dir_holding_a_link_is_refused_before_anything_runs(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Commands that write logs and stores into -o as it stands refuse a link anywhere below it (exit 2,
    naming it); what it points at is untouched and nothing is written into the folder."""
    from tuner.cli import main

    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    (out / "logs").mkdir(parents=True)
    victim.write_text("someone else's file")
    (out / "logs" / "bench.log").symlink_to(victim)
    monkeypatch.setattr(sys, "argv", ["tuner", *command, "-o", str(out)])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert f"{out / 'logs' / 'bench.log'} is a symbolic link" in err and "Traceback" not in err
    assert victim.read_text() == "someone else's file"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["logs", "logs/bench.log"]
