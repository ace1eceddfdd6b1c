"""No writer follows a link it finds inside its -o: each file is renamed over its name (the link is replaced,
what it points at is untouched)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tests.unit.result.test_report import _frame
from tuner.measure.bench import save_results


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
