"""config.toml's [gate], report.md's gate section, `tuner export`'s refusal and `tuner validate`'s gate check.

The records are what :mod:`tuner.rounds.output_gate` stores (fake numbers shaped like the real ones;
the real CPU run is tests/integration/test_pipeline_export.py)."""

from __future__ import annotations

import pytest

from tuner.errors import UsageError
from tuner.result.pipeline_export import _checked_gate, gate_table, summary_line
from tuner.result.pipeline_report import gate_section
from tuner.result.validate import _gate_finding
from tuner.study.record import SearchOutcome, outcome_from_attrs


def _outcome(result: dict) -> SearchOutcome:
    """The typed record of a study whose stored result is ``result``."""
    return outcome_from_attrs({"result": result})


THR = {"mean_kld": 1e-5, "p99_kld": 1e-4, "same_top_pct": 98.0}


def check(name: str, mode: str, *, mean: float = 0.0, strict: bool = True, passed: bool = True) -> dict:
    return {
        "name": name,
        "mode": mode,
        "strict": strict,
        "verdict": "pass" if passed else "fail",
        "passed": passed,
        "reasons": [] if passed else [f"Mean KLD {mean:.6f} > threshold 1e-05."],
        "deterministic": True,
        "identical_to_upstream": strict,
        "why": "-t changed",
        "thresholds": THR,
        "stats": {"mean_kld": mean, "p99_kld": 1e-6, "max_kld": 2e-6, "same_top_pct": 100.0 if passed else 48.413},
        "settings": {
            "ctx": 128,
            "chunks": 2,
            "candidate_args": ["-fa", "on", "-t", "1"],
            "upstream_args": ["-fa", "on"],
        },
        "logs": {"kld": "equivalence/abc/decode_process/kld.log"},
        "seconds": 6.2,
    }


PASS = {
    "verdict": "pass",
    "checks": [check("decode process", "decode"), check("prefill process", "prefill", mean=1e-6)],
}


def test_gate_table_has_the_worst_numbers_and_each_check() -> None:
    t = gate_table(PASS)
    assert t["verdict"] == "pass" and t["modes"] == ["decode", "prefill"] and t["tool"] == "llama-perplexity"
    assert (t["mean_kld"], t["max_kld"], t["same_top_pct"], t["deterministic"]) == (1e-6, 2e-6, 100.0, True)
    assert t["thresholds"] == THR and (t["ctx"], t["chunks"]) == (128, 2)
    assert t["checks"][0]["candidate_args"] == ["-fa", "on", "-t", "1"] and "/" not in t["checks"][0]["logs"]["kld"][:1]
    text = gate_section(t)
    assert "Verdict: **PASS** in mode(s) decode, prefill" in text and "| decode process" in text and "0.000001" in text


def test_not_needed_and_rejected_are_reported() -> None:
    assert (
        _checked_gate("s", _outcome({"rules": [], "tuned": None}))["verdict"] == "not needed"
    )  # a pre-gate study, no change
    rejected = {
        "verdict": "not needed",
        "checks": [],
        "why": "the final config failed the gate",
        "rejected": {
            "rules": ["decode:0-=MMA"],
            "tuned": None,
            "gate": {
                "verdict": "fail",
                "checks": [check("decode decode:0-=MMA", "decode", mean=0.006275, strict=False, passed=False)],
            },
        },
    }
    t = gate_table(_checked_gate("s", _outcome({"rules": [], "tuned": None, "gate": rejected})))
    assert t["verdict"] == "not needed" and t["rejected"]["checks"][0]["mean_kld"] == 0.006275
    text = gate_section(t)
    assert "FAILED the gate and is not exported" in text and "Mean KLD 0.006275 > threshold" in text
    assert "FAILED the output-equivalence gate (decode decode:0-=MMA)" in summary_line(
        _outcome({"rows": [], "gate": rejected})
    )


def test_export_refuses_a_failed_or_ungated_change() -> None:
    with pytest.raises(UsageError, match="failed the output-equivalence gate .*never exported"):
        _checked_gate(
            "s",
            _outcome(
                {
                    "rules": ["decode:0-=MMA"],
                    "gate": {
                        "verdict": "fail",
                        "checks": [check("decode decode:0-=MMA", "decode", mean=0.006, passed=False)],
                    },
                }
            ),
        )
    with pytest.raises(UsageError, match="no output-equivalence gate record.*Rerun the same `tuner search`"):
        _checked_gate("s", _outcome({"rules": ["decode:0-=MMA"], "tuned": None}))


def cfg(schema: int, arch: str, gate: dict, **choice) -> dict:
    return {
        "schema": schema,
        "target": {"arch": arch},
        "gate": gate,
        "choice": {"fa_rules": [], "compile": {}, **choice},
    }


def test_validate_judges_the_recorded_numbers_again() -> None:
    ok = _gate_finding(cfg(3, "cpu", gate_table(PASS)))
    assert ok.ok and ok.detail.startswith("pass in decode, prefill: 2 check(s)")
    edited = gate_table(PASS)
    edited["checks"][0]["mean_kld"] = 0.0005  # a number above the threshold under a "pass" verdict
    bad = _gate_finding(cfg(3, "cpu", edited))
    assert not bad.ok and "decode process: Mean KLD 0.000500 > threshold 1e-05." in bad.detail
    nondet = gate_table(PASS)
    nondet["checks"][1]["deterministic"] = False
    assert "Not deterministic" in _gate_finding(cfg(3, "cpu", nondet)).detail
    failed = _gate_finding(cfg(3, "cpu", {**gate_table(PASS), "verdict": "fail"}))
    assert not failed.ok and "only a passing gate may be exported" in failed.detail


def test_validate_not_needed_only_for_upstreams_config() -> None:
    nn = gate_table({"verdict": "not needed", "checks": [], "why": "x"})
    assert _gate_finding(cfg(3, "cpu", nn)).ok
    assert not _gate_finding(cfg(3, "cpu", nn, fa_rules=["decode:0-=MMA"])).ok


def test_validate_results_exported_before_the_gate() -> None:
    gpu = _gate_finding(cfg(2, "sm_90", {"status": "pass"}))
    assert gpu.ok and gpu.detail.startswith("gate not run: needs a sm_90 GPU")
    cpu = _gate_finding(cfg(2, "cpu", {"status": "skipped"}))
    assert not cpu.ok and "exported before the output-equivalence gate" in cpu.detail
