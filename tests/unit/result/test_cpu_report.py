"""CPU% / busiest core / GPU% in the pipeline report and the decode Pareto plot; old studies without them still report."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from tuner.measure.paired import CPU_REJECTED
from tuner.result.pipeline_export import pareto_points
from tuner.result.pipeline_report import report_text
from tuner.result.plots import pareto_front, plot_pareto
from tuner.study.record import load_outcome

OLD = Path(__file__).resolve().parents[3] / "tests" / "data" / "studies" / "sm90-l8b-v3-no-cpu.db.xz"


@pytest.fixture
def old_study(tmp_path: Path):
    import optuna

    db = tmp_path / "study.db"
    db.write_bytes(lzma.decompress(OLD.read_bytes()))  # a real H100 study recorded before CPU% was measured
    return optuna.load_study(study_name="sm90-l8b-v3", storage=f"sqlite:///{db}")


def _confirm_table(report: str) -> list[list[str]]:
    part = report.split("\n| Test ", 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in ln.split("|")[1:-1]] for ln in part.splitlines()[2:]]


def test_an_old_study_reports_dashes_and_gets_no_pareto_plot(old_study) -> None:
    rows = _confirm_table(report_text(load_outcome(old_study)))
    assert len(rows) == 10 and all(r[5] == r[6] == r[7] == "—" for r in rows)  # CPU%, busiest core, GPU%
    assert rows[2][-1] == "faster" and rows[2][4] == "173.58 → 188.13"
    assert pareto_points(load_outcome(old_study)) == []


def test_cpu_columns_and_a_rejected_point(old_study, tmp_path: Path) -> None:
    res = dict(old_study.user_attrs["result"])
    rows = [dict(r) for r in res["rows"]]
    for r in rows:  # CPU-backend-like numbers: the final config burns a second core at d0 for nothing
        r.update(
            base_cpu=100.0,
            tuned_cpu=100.4,
            cpu_delta=0.4,
            cpu_ci_low=-1.0,
            cpu_ci_high=1.8,
            cpu_noise=2.5,
            base_core=99.0,
            tuned_core=99.5,
            base_gpu=float("nan"),
            tuned_gpu=float("nan"),
        )
    rows[0].update(tuned_cpu=190.0, cpu_delta=90.0, cpu_ci_low=86.0, cpu_ci_high=94.0, verdict=CPU_REJECTED)
    res["rows"] = rows
    old_study.set_user_attr("result", res)
    screen = dict(old_study.user_attrs["screen_tg"])
    screen["0"] = {
        **screen["0"],
        "cpu_noise": 2.0,
        "levels": {
            "upstream": {"ts": 270.0, "cpu": 101.0, "core": 99.0, "gpu": 97.0},
            "MMA": {"ts": 262.0, "cpu": 104.0, "core": 99.0, "gpu": 98.0},
        },
    }
    old_study.set_user_attr("screen_tg", screen)
    report = report_text(load_outcome(old_study))
    table = _confirm_table(report)
    assert table[0][5] == "100 → 190 (Δ +90.0 [+86.0..+94.0], noise ±2.5)" and table[0][-1] == CPU_REJECTED
    assert table[0][6] == "99 → 100" and table[0][7] == "—"  # no GPU library: not measured, not 0
    screen_d0 = next(
        [c.strip() for c in ln.split("|")[1:-1]] for ln in report.splitlines() if ln.startswith("| tg@d0 ")
    )
    assert (
        screen_d0[2:7] == ["267.27", "101", "99", "97", "±2.0% (VEC); floor ±2.4%; CPU ±2.0"]
        and "(CPU" not in screen_d0[7]
    )
    assert "rejected: CPU% up without a t/s gain" in report.split("| Model", 1)[1]  # the compare table says it too

    pts = pareto_points(load_outcome(old_study))
    assert {(p["config"], p["stage"]) for p in pts if p["depth"] == 0} == {
        ("upstream", "screen"),
        ("MMA", "screen"),
        ("upstream", "confirm"),
        ("final", "confirm"),
    }
    png = plot_pareto(pts, tmp_path / "pareto_decode.png", title="test")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_pareto_front_keeps_the_non_dominated_points() -> None:
    pts = [
        {"cpu": 100, "ts": 150},
        {"cpu": 190, "ts": 240},
        {"cpu": 195, "ts": 238},
        {"cpu": 120, "ts": 140},
        {"cpu": 100, "ts": 149},
    ]
    assert [(p["cpu"], p["ts"]) for p in pareto_front(pts)] == [(100, 150), (190, 240)]
