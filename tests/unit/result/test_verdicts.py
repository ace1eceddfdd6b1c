"""One verdict rule for every comparison: no faster/slower without a noise reference (issue 27, point 1).

Real data only: two `tuner bench` runs of one H100 build (tests/data/bench/h100), the raw llama-bench JSONL of
the 8B search's confirm rounds (tests/data/bench/h100/confirm-l8b: upstream, upstream again, and the final config
whose decode MMA rule is the stored 8B result's +14% at d65536), and the recorded A/A floors.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tuner.measure.frames import load_results
from tuner.measure.stats import NoiseRef, Verdict, judge, run_floor
from tuner.result.report import aa_warning, compare_points

ROOT = Path(__file__).resolve().parents[3]
S1 = ROOT / "tests" / "data" / "bench" / "h100"
LOGS = ROOT / "tests" / "data" / "bench" / "h100" / "confirm-l8b"


def _log(round_: int, name: str) -> Path:
    return LOGS / f"confirm-tg+pp-r{round_}-{name}+{name}-pp+tg.log"


def _verdicts(points: list[dict]) -> dict[str, str]:
    from tuner.result.tables import bench_test_name

    return {bench_test_name(p["test"], p["depth"]): p["verdict"] for p in points}


def test_same_h100_build_twice_gives_no_verdict() -> None:
    a, b = load_results(S1 / "default-run1.jsonl"), load_results(S1 / "default-run2.jsonl")
    v = _verdicts(compare_points(a, b))
    assert set(v.values()) <= {"no difference", "within noise"}, v
    assert v["pp512"] == "within noise" and v["tg128@d32768"] == "within noise"  # were ✓ faster and ✗ slower
    assert "A/A comparison" in aa_warning(a, b) and "same llama-bench binary" in aa_warning(a, b)


def test_raw_llama_bench_aa_pair_gives_no_verdict() -> None:
    up, aa = load_results(_log(0, "upstream")), load_results(_log(0, "upstream-aa"))
    pts = compare_points(up, aa)
    assert len(pts) == 10 and {p["noise_kind"] for p in pts} == {"floor"}
    assert not {"faster", "slower"} & set(_verdicts(pts).values())
    assert "A/A comparison" in aa_warning(up, aa)


def test_recorded_8b_win_is_still_faster() -> None:
    up, fin = load_results(_log(0, "upstream")), load_results(_log(0, "final"))
    v = _verdicts(compare_points(up, fin))
    assert v["tg128@d65536"] == "faster" and v["tg128@d49152"] == "faster"
    assert v["tg128"] in ("no difference", "within noise") and "slower" not in v.values()
    # judged by this machine's own A/A pair instead of the floor: still faster
    pts = compare_points(up, fin, aa=(load_results(_log(0, "upstream")), load_results(_log(1, "upstream-aa"))))
    d65 = next(p for p in pts if p["test"] == "tg128" and p["depth"] == 65536)
    assert d65["verdict"] == "faster" and d65["noise_kind"] == "A/A" and d65["ci_low"] > 1.1


def test_cli_raw_files_data_on_stdout_messages_on_stderr() -> None:
    from tuner.cli.bench_cmd import compare

    r = CliRunner().invoke(
        compare,
        [
            str(_log(0, "upstream")),
            str(_log(0, "final")),
            "--aa",
            str(_log(0, "upstream")),
            str(_log(0, "upstream-aa")),
        ],
    )
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    assert all(line.startswith("|") for line in out) and len(out) == 12
    assert any("tg128@d65536" in line and "✓ faster" in line and "A/A" in line for line in out)
    assert "looks like an A/A comparison" in r.stderr and "noise reference" in r.stderr


def test_judge_needs_a_noise_reference() -> None:
    clear = Verdict(delta_pct=10.0, ci_low=8.0, ci_high=12.0, p_value=0.001, verdict="faster", confidence=0.95)
    assert judge(clear, NoiseRef(pct=math.inf, kind="none")) == "no noise reference"
    assert judge(clear, NoiseRef(pct=9.0, kind="floor")) == "within noise"
    assert judge(clear, NoiseRef(pct=5.0, kind="A/A")) == "faster"
    assert judge(clear, NoiseRef(pct=5.0, kind="A/A"), min_effect_pct=8.5) == "within noise"
    slow = Verdict(delta_pct=-10.0, ci_low=-12.0, ci_high=-8.0, p_value=0.001, verdict="slower", confidence=0.95)
    assert judge(slow, NoiseRef(pct=5.0, kind="floor")) == "slower"
    assert run_floor("Metal", "tg").kind == "none" and run_floor("CUDA", "tg").kind == "floor"
    assert run_floor("CUDA,RPC", "pp").pct == run_floor("CUDA", "pp").pct


def test_floors_file_is_what_the_recorded_data_give() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "aa_floors.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    # decode is steadier than prefill on the H100
    assert 0 < run_floor("CUDA", "tg").pct < run_floor("CUDA", "pp").pct < 100
    # the CPU's 15 recorded pairs are too few for a floor: a CPU comparison without --aa claims nothing
    cpu = run_floor("CPU", "tg")
    assert cpu.kind == "none" and "only 15 recorded A/A pairs" in cpu.source


def test_the_recorded_tuner_bench_pair_stays_within_the_cuda_floor() -> None:
    # A floor is the 95th percentile of |Δ| over the recorded A/A pairs; this pair is one of them.
    a, b = load_results(S1 / "default-run1.jsonl"), load_results(S1 / "default-run2.jsonl")
    for p in compare_points(a, b):
        assert abs(p["speedup"] - 1) * 100 <= run_floor("CUDA", p["phase"]).pct


def test_bench_of_two_builds_prints_compare_table(tmp_path: Path, monkeypatch: object) -> None:
    import types

    import pandas as pd

    import tuner.measure.interleave as interleave_mod
    from tuner.cli.bench_cmd import bench

    a, b = load_results(S1 / "default-run1.jsonl"), load_results(S1 / "default-run2.jsonl")

    def fake_interleaved(cands, anchor, model, **kw):  # type: ignore[no-untyped-def]
        return types.SimpleNamespace(
            frames={anchor.label: a, cands[0].label: b}, anchors=pd.DataFrame(), drift=pd.DataFrame()
        )

    monkeypatch.setattr(interleave_mod, "run_interleaved", fake_interleaved)
    for d in ("one", "two"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "llama-bench").write_text("")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    r = CliRunner().invoke(
        bench,
        [
            "--build",
            str(tmp_path / "one"),
            "--build",
            str(tmp_path / "two"),
            "--model",
            str(tmp_path / "m.gguf"),
            "-o",
            str(tmp_path / "out"),
        ],
    )
    assert r.exit_code == 0, r.output
    table = r.stdout.split("| Model")[1]
    assert "tg128@d32768" in table and "floor" in table and "faster" not in table and "slower" not in table
    assert "noise reference: run-to-run floor CUDA" in r.stderr
