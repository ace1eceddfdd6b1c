"""What the export's plots are drawn from (not their pixels): the speedup plot's kernel spans and depth
axis, and whether the decode Pareto plot is drawn at all."""

from __future__ import annotations

import lzma
from pathlib import Path

import optuna

from tuner.plan.fa_rules import parse_fa_rules
from tuner.result.pipeline_export import _write_pareto, pareto_differs, pareto_points
from tuner.result.plots import depth_axis, plot_speedup, speedup_spans
from tuner.study.record import SearchOutcome, load_outcome, outcome_from_attrs

ROOT = Path(__file__).resolve().parents[3]
DEPTHS = (0, 4096, 16384, 32768, 65536)


def _points(kernel_from: int) -> list[dict]:
    return [
        {
            "phase": "tg",
            "test": "tg128",
            "depth": d,
            "upstream_kernel": "VEC",
            "kernel": "TILE" if d >= kernel_from else "VEC",
            "speedup": 1.0,
            "ci_low": 0.98,
            "ci_high": 1.02,
            "aa_noise_pct": 2.0,
            "verdict": "no difference",
            "base_ts": 100.0,
            "tuned_ts": 100.0,
        }
        for d in DEPTHS
    ]


def test_rule_span_starts_at_the_rule_threshold(tmp_path: Path) -> None:
    # The rule switches at n_kv 20000, between the screened depths 16384 and 32768: the span starts there,
    # not at their midpoint (24576), and runs to the right edge (the rule has no upper bound).
    pts = _points(32768)
    spans = speedup_spans(pts, parse_fa_rules("decode/D64/gqa4/kvf16:20000-=TILE"))
    assert spans == {
        "tg": [
            {"x0": 20000, "x1": None, "kernel": "TILE", "upstream": "VEC", "rule": "decode/D64/gqa4/kvf16:20000-=TILE"}
        ]
    }
    bounded = speedup_spans(pts, parse_fa_rules("prefill:1024-8192=MMA"))
    assert [(s["x0"], s["x1"]) for s in bounded["pp"]] == [(1024, 8192)] and "tg" not in bounded
    assert (
        plot_speedup(pts, tmp_path / "s.png", rules=parse_fa_rules("decode/D64/gqa4/kvf16:20000-=TILE")).stat().st_size
        > 0
    )


def test_without_rules_spans_follow_the_measured_kernels() -> None:
    spans = speedup_spans(_points(32768))["tg"]
    assert [(s["x0"], s["x1"], s["kernel"]) for s in spans] == [((16384 + 32768) / 2, None, "TILE")]


def test_depth_axis_is_numeric() -> None:
    ax = depth_axis(list(DEPTHS))
    assert ax["ticks"] == list(DEPTHS) and ax["linthresh"] == 4096
    assert ax["left"] < 0 < 20000 < ax["right"] and ax["right"] > 65536


def _attrs(*, cpu_ci: tuple[float, float], cpu_noise: float, verdict: str = "no difference") -> SearchOutcome:
    cell = {
        "noise_pct": 3.0,
        "cpu_noise": cpu_noise,
        "levels": {"upstream": {"ts": 100.0, "cpu": 105.0}, "TILE": {"ts": 100.5, "cpu": 104.0}},
        "effects": {
            "TILE": {
                "ratio": 1.005,
                "ci_low": 0.99,
                "ci_high": 1.02,
                "verdict": verdict,
                "cpu": {"mean": sum(cpu_ci) / 2, "ci_low": cpu_ci[0], "ci_high": cpu_ci[1]},
            }
        },
    }
    return outcome_from_attrs({"screen_tg": {"4096": cell}, "result": {"rows": []}})


def test_pareto_needs_a_difference_beyond_the_noise(tmp_path: Path) -> None:
    o = _attrs(cpu_ci=(-3.0, 1.0), cpu_noise=4.0)  # CPU Δ inside its noise, t/s no difference
    assert pareto_points(o) and not pareto_differs(o)
    _write_pareto(tmp_path / "p.png", o, title="x")
    assert not (tmp_path / "p.png").exists()
    o = _attrs(cpu_ci=(-9.0, -5.0), cpu_noise=4.0)  # 5-9 points less CPU, beyond the noise
    assert pareto_differs(o)
    _write_pareto(tmp_path / "p.png", o, title="x")
    assert (tmp_path / "p.png").stat().st_size > 0
    o = _attrs(cpu_ci=(-3.0, 1.0), cpu_noise=4.0, verdict="faster")  # t/s beyond the A/A noise
    assert pareto_differs(o)
    row = {
        "phase": "tg",
        "depth": 0,
        "verdict": "no difference",
        "cpu_ci_low": 4.5,
        "cpu_ci_high": 7.0,
        "cpu_noise": 4.0,
    }
    assert pareto_differs(outcome_from_attrs({"result": {"rows": [row]}}))  # the confirm's CPU Δ alone


def _stored(tmp_path: Path, xz: Path) -> optuna.Study:
    db = tmp_path / "study.db"  # SQLite reads only a plain file
    db.write_bytes(lzma.decompress(xz.read_bytes()))
    return optuna.load_study(study_name="paced-4", storage=f"sqlite:///{db}")


def test_stored_cpu_noise_study_draws_no_front(tmp_path: Path) -> None:
    # paced-4 in an earlier state (the host-paced 1B before its tune found -ub): every decode CPU Δ and
    # t/s change is inside its noise, so a "front" through those points would rank noise.
    s = _stored(tmp_path, ROOT / "tests" / "data" / "studies" / "paced-4-early.db.xz")
    o = load_outcome(s)
    assert pareto_points(o) and not pareto_differs(o)


def test_stored_study_beyond_the_noise_draws_it(tmp_path: Path) -> None:
    # paced-4 as exported (results/sm_90/llama-3.2-1b-q4_k_m-ngl8-cpus0-3): the tuned -ub doubles decode t/s at d0,
    # far beyond the A/A noise.
    s = _stored(tmp_path, ROOT / "results" / "sm_90" / "llama-3.2-1b-q4_k_m-ngl8-cpus0-3" / "evidence" / "study.db.xz")
    assert pareto_differs(load_outcome(s))
