"""The output-equivalence gate as the search's last stage: what runs, resumes, and what a failure exports.

llama-perplexity is faked here (its real runs: tests/integration/test_equivalence_cpu.py and the CPU
pipeline in tests/integration/test_pipeline_export.py)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from tests.unit.search.conftest import search_run
from tuner.plan.fa_rules import parse_fa_rules
from tuner.rounds import output_gate as og
from tuner.search.final_gates import run_output_gate as _output_gate
from tuner.study.record import SearchOutcome
from tuner.study.state import StudyState

RULES = parse_fa_rules(
    "decode/D64/gqa4/kvf16:0-4096=VEC,decode/D64/gqa4/kvf16:32768-=MMA,decode/D64/gqa4/kvf16:65536-=MMA"
)


def plan(**kw):
    base = dict(
        rules=[], base_env={}, base_args=[], final_env={}, final_args=[], changed={}, build_changed=False, era="mma"
    )
    return og.plan_checks(**{**base, **kw})


def test_no_change_needs_no_gate() -> None:
    assert plan() == []
    assert plan(base_args=["-t", "1"], final_args=["-t", "1"]) == []  # pinned on both sides: not a change


def test_rules_are_checked_per_kernel_widened_in_their_phase() -> None:
    checks = plan(rules=RULES)
    assert [(c.mode, c.env["GGML_TUNER_FA_RULES"], c.strict) for c in checks] == [
        ("decode", "decode/D64/gqa4/kvf16:0-=VEC", False),
        ("decode", "decode/D64/gqa4/kvf16:0-=MMA", False),
    ]
    assert all(c.args == ("-fa", "on") and c.upstream_args == ("-fa", "on") for c in checks)


def test_threads_alone_are_strict_in_both_modes() -> None:
    checks = plan(final_args=["-t", "1", "-ub", "512"], changed={"-t": ("pp", "tg")})
    assert [(c.mode, c.strict, c.args) for c in checks] == [
        ("decode", True, ("-fa", "on", "-t", "1")),
        ("prefill", True, ("-fa", "on", "-t", "1")),
    ]
    assert checks[1].not_applied == ()  # -ub 512 is upstream's own micro-batch, not a change
    graph = plan(final_env={"GGML_CUDA_GRAPH_OPT": "1"}, changed={"GGML_CUDA_GRAPH_OPT": ("pp", "tg")})
    assert all(c.strict and c.env == {"GGML_CUDA_GRAPH_OPT": "1"} for c in graph)


def test_numeric_knobs_builds_and_microbatches_are_not_strict() -> None:
    fa = plan(final_args=["-fa", "off", "-t", "1"], changed={"-fa": ("pp", "tg"), "-t": ("pp", "tg")})
    assert [(c.mode, c.strict, c.args) for c in fa] == [
        ("decode", False, ("-fa", "off", "-t", "1")),
        ("prefill", False, ("-fa", "off", "-t", "1")),
    ]
    ub = plan(final_args=["-ub", "128"], changed={"-ub": ("pp",)})
    assert [(c.mode, c.strict, c.not_applied) for c in ub] == [("prefill", False, ("-ub", "128"))]
    built = plan(build_changed=True, rules=parse_fa_rules("prefill:0-=TILE"))
    assert [(c.name, c.strict) for c in built] == [("decode process", False), ("prefill prefill:0-=TILE", False)]
    assert plan(final_args=["-fa", "0"], changed={"-fa": ("pp", "tg")}, era="rocwmma")[0].args == ()  # bare switch, off
    assert plan(rules=parse_fa_rules("prefill:0-=TILE"), era="rocwmma")[0].upstream_args == ("-fa",)


def _rec(passed: bool, mode: str = "decode") -> dict:
    return {
        "verdict": "pass" if passed else "fail",
        "passed": passed,
        "mode": mode,
        "strict": False,
        "reasons": [] if passed else ["Mean KLD 0.006275 > threshold 1e-05."],
        "deterministic": True,
        "stats": {"mean_kld": 0.0 if passed else 0.006275, "p99_kld": 1e-6, "max_kld": 1e-6, "same_top_pct": 100.0},
        "thresholds": {"mean_kld": 1e-5, "p99_kld": 1e-4, "same_top_pct": 98.0},
        "settings": {"ctx": 128, "chunks": 2},
    }


def test_run_checks_resumes_and_judges_all() -> None:
    checks = plan(rules=RULES)
    ran, saved = [], {}

    def run_one(c):
        ran.append(c.name)
        return _rec(True)

    gate = og.run_checks(
        checks,
        done={checks[0].name: {**_rec(True), "name": checks[0].name}},
        run_one=run_one,
        on_check=saved.__setitem__,
    )
    assert ran == [checks[1].name] and list(saved) == ran  # the recorded check is not run again
    assert gate["verdict"] == "pass" and len(gate["checks"]) == 2
    failed = og.run_checks(checks, done={}, run_one=lambda c: _rec(c.name.endswith("MMA")), on_check=lambda *_: None)
    assert failed["verdict"] == "fail"
    assert og.run_checks([], done={}, run_one=run_one, on_check=saved.__setitem__)["verdict"] == "not needed"


def test_a_failing_final_config_exports_upstream_and_keeps_the_numbers() -> None:
    result = {
        "rules": RULES[:1],
        "tuned": {"values": {"threads": 1}},
        "rows": [{"verdict": "faster"}],
        "dropped": {},
        "upstream_phases": [],
    }
    gate = {"verdict": "fail", "checks": [{**_rec(False), "name": "decode decode/D64/gqa4/kvf16:0-=VEC"}]}
    out = og.gated_result(result, gate)
    assert out["rules"] == () and out["tuned"] is None and out["rows"] == [] and out["upstream_phases"] == ["tg", "pp"]
    assert out["gate"]["verdict"] == "not needed" and out["gate"]["rejected"]["rules"] == RULES[:1]
    assert out["gate"]["rejected"]["gate"]["checks"][0]["stats"]["mean_kld"] == 0.006275
    assert "output-equivalence gate" in out["dropped"][RULES[0]]
    ok = og.gated_result(result, {"verdict": "pass", "checks": [_rec(True)]})
    assert ok["rules"] == RULES[:1] and ok["gate"]["verdict"] == "pass"


class _Study:
    def __init__(self) -> None:
        self.user_attrs: dict = {}

    def set_user_attr(self, k, v) -> None:
        self.user_attrs[k] = v


class _Builds:
    def get(self, variant, compile_values):
        return types.SimpleNamespace(build_id=f"{variant}-{sorted(compile_values)}")


@pytest.fixture()
def stage(tmp_path: Path):
    from tuner.plan.derive import legal_values, resolve_space
    from tuner.plan.space import load_space
    from tuner.targets.host import Cpus

    cfg = types.SimpleNamespace(
        variants=None, run_dir=tmp_path, model=tmp_path / "m.gguf", jobs=1, source=types.SimpleNamespace(era="mma")
    )
    study = _Study()
    calls = []

    def run(passed):
        def equivalence(check, up_build, fin_build, work_dir):
            calls.append((check.name, check.strict, up_build.build_id, fin_build.build_id, work_dir.parent.name))
            return _rec(passed, check.mode)

        return equivalence

    # threads' legal values are derived per machine (plan/derive.py); a fixed 2-core machine here
    space = resolve_space(
        load_space("cpu", "mma"),
        legal_values(load_space("cpu", "mma"), cpus=Cpus(ids=(0, 1), physical=2, masked=False)),
    )

    def go(result, passed=True):  # the result as the study stores it, in and out
        r = search_run(cfg, study, space=space, builds=_Builds(), equivalence=run(passed))
        return _output_gate(r, SearchOutcome.from_result(r.header, result)).result_json()

    return types.SimpleNamespace(go=go, calls=calls, st=StudyState(study))


def test_stage_runs_the_gate_once_and_stores_it(stage) -> None:
    tuned = {"trial": 3, "values": {"threads": 1, "ubatch": 512, "flash_attn": "on"}, "params": {}}
    res = stage.go({"rules": [], "tuned": tuned, "rows": [], "dropped": {}})
    assert [c[:4] for c in stage.calls] == [
        ("decode process", True, "cpu-[]", "cpu-[]"),
        ("prefill process", True, "cpu-[]", "cpu-[]"),
    ]
    assert res["gate"]["verdict"] == "pass" and res["tuned"] == tuned
    assert set(stage.st.equivalence_checks(stage.calls[0][4])) == {"decode process", "prefill process"}
    again = stage.go({"rules": [], "tuned": tuned, "rows": [], "dropped": {}})
    assert len(stage.calls) == 2 and again["gate"] == res["gate"]  # resumed: nothing runs again


def test_stage_not_needed_and_failing(stage) -> None:
    res = stage.go({"rules": [], "tuned": None, "rows": [], "dropped": {}})
    assert res["gate"]["verdict"] == "not needed" and stage.calls == []
    off = {"trial": 0, "values": {"flash_attn": "off"}, "params": {}}
    bad = stage.go({"rules": [], "tuned": off, "rows": [{}], "dropped": {}}, passed=False)
    assert [c[1] for c in stage.calls] == [False, False]  # -fa off changes numerics: not strict
    assert bad["tuned"] is None and bad["gate"]["rejected"]["tuned"] == off


CALIB = Path(__file__).resolve().parents[3] / "tests" / "data" / "equivalence" / "h100-calib"


@pytest.mark.parametrize(("model", "kernel"), [("1b", "TILE"), ("8b", "MMA")])
def test_the_kernel_band_admits_upstreams_kernels_and_rejects_a_q4_0_kv_cache(model: str, kernel: str) -> None:
    """llama-perplexity's numbers recorded on the H100 (tests/data/equivalence/h100-calib, `tuner equivalence`):
    under the CPU-calibrated defaults the searches' own kernel rules failed (1B TILE mean KLD 9.6e-4, 8B
    MMA 7.2e-3); judged by the kernel band (upstream's VEC/TILE/MMA forced vs its pick, x2) they pass,
    and a q4_0 KV cache (50x the band) still fails."""
    import json

    recs = {p.stem.split("-", 2)[2]: json.loads(p.read_text()) for p in CALIB.glob(f"{model}-decode-*.json")}
    checks = plan(rules=parse_fa_rules(f"decode/D64/gqa4/kvf16:32768-={kernel}"))
    band = og.plan_band(checks, {"decode": ["VEC", "TILE", "MMA"], "prefill": ["TILE", "MMA"]})
    assert [b.name for b in band] == ["band decode VEC", "band decode TILE", "band decode MMA"]
    assert all(b.env["GGML_TUNER_FA_RULES"] == f"decode:0-={b.name.split()[-1]}" for b in band)
    assert not og.run_checks(checks, done={}, run_one=lambda c: recs[kernel], on_check=lambda *_: None)["checks"][0][
        "passed"
    ]

    def run(candidate: str):
        return og.run_checks(
            checks,
            done={},
            band=band,
            on_check=lambda *_: None,
            run_one=lambda c: recs[c.name.split()[-1] if c.name.startswith("band") else candidate],
        )

    gate = run(kernel)
    assert gate["verdict"] == "pass" and len(gate["band"]) == 3
    t = gate["checks"][0]["thresholds"]
    widest = max(recs[k]["stats"]["mean_kld"] for k in ("VEC", "TILE", "MMA"))
    assert t["mean_kld"] == pytest.approx(og.BAND_FACTOR * widest, rel=1e-3)
    bad = run("kvq4")
    assert bad["verdict"] == "fail" and any("Mean KLD" in r for r in bad["checks"][0]["reasons"])
    # a mode without a band (no kernels to force: the CPU backend) keeps the CPU-calibrated defaults
    assert og.plan_band(checks, {}) == [] and og.band_thresholds([]) is None


def test_llama_benchs_valued_switches_are_spelled_as_llama_perplexitys_bare_flags() -> None:
    # on the H100 `-nkvo 1` reached llama-perplexity as is ("error: invalid argument: 1") and the gate failed the config
    assert og.perplexity_args(["-t", "4", "-ngl", "8", "-nkvo", "1"], "mma") == (
        ["-fa", "on", "-t", "4", "-ngl", "8", "-nkvo"],
        [],
    )
    assert og.perplexity_args(["-nkvo", "0", "--repack", "0", "-nopo", "1"], "mma")[0] == [
        "-fa",
        "on",
        "--no-repack",
        "--no-op-offload",
    ]
    with pytest.raises(og.UsageError, match="takes 0 or 1"):
        og.perplexity_args(["-nkvo", "yes"], "mma")


def test_a_check_whose_run_failed_keeps_its_error_when_judged_by_the_band() -> None:
    failed = {
        **_rec(False),
        "stats": None,
        "deterministic": None,
        "reasons": ["The candidate's run A failed: llama-perplexity failed (exit 1): error: invalid argument: 1."],
    }
    out = og._rejudged(failed, og.Thresholds(mean_kld=1e-4, p99_kld=1e-4, same_top_pct=90.0))
    assert out["verdict"] == "fail" and out["reasons"] == failed["reasons"]


def test_a_stored_check_whose_run_failed_is_run_again_on_resume() -> None:
    checks = plan(rules=RULES)
    broken = {**_rec(False), "stats": None, "name": checks[0].name, "reasons": ["The candidate's run A failed: ..."]}
    measured_fail = {**_rec(False), "name": checks[1].name}  # a real measurement stays as it was
    ran: list = []
    gate = og.run_checks(
        checks,
        done={checks[0].name: broken, checks[1].name: measured_fail},
        run_one=lambda c: ran.append(c.name) or _rec(True),
        on_check=lambda *_: None,
    )
    assert ran == [checks[0].name]
    assert [c["verdict"] for c in gate["checks"]] == ["pass", "fail"] and gate["verdict"] == "fail"


def test_a_band_under_half_same_top_floors_the_threshold_at_zero() -> None:
    """cuBLAS against MMQ on the H100's random-weight 8B at Q5_K_M agreed on 41.27% of top tokens; twice that
    distance would ask for -17.46%, which reads as a bug: the floor says 'any share' as 0%."""
    band = [{"stats": {"mean_kld": 0.05746, "p99_kld": 0.142648, "same_top_pct": 41.27}}]
    thr = og.band_thresholds(band)
    assert thr is not None and thr.same_top_pct == 0.0 and thr.mean_kld == 0.11492
