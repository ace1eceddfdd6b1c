"""The residency gate's decisions on llama.cpp logs recorded on the H100 (tests/data/residency/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tuner.measure.residency import parse_residency
from tuner.search import residency_gate as rg

DATA = Path(__file__).resolve().parents[2] / "data" / "residency"
FULL = parse_residency((DATA / "cuda-full-offload.log").read_text())  # 1B, -ngl 99: 2 splits, KV on CUDA0
NKVO = parse_residency((DATA / "cuda-nkvo.log").read_text())  # the same with -nkvo 1: 34 splits, KV on the host
INPUT_MIB = 205.49  # the 1B's token embeddings, which llama.cpp keeps on the host


@pytest.mark.parametrize(("args", "full"), [
    ((), True), (("-ngl", "99"), True), (("-ngl", "17"), True), (("-ngl", "16"), False), (("-ngl", "8"), False),
    (("-nkvo", "1"), False), (("-nkvo", "0"), True), (("--no-kv-offload", "1"), False), (("-t", "4", "-ub", "512"), True),
])
def test_full_offload_is_read_from_the_configs_arguments(args: tuple[str, ...], full: bool) -> None:
    assert rg.full_offload(args, 16) is full  # 16 layers + the output layer


def test_the_same_config_as_upstream_passes_when_upstream_does() -> None:
    rec = rg.decide(FULL, None, full=True, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "pass" and rec["final"] is None and rec["upstream"]["splits_tg"] == 2
    assert rec["upstream"]["kv_buffers"] == {"CUDA0": 24.0} and rec["upstream"]["layers_offloaded"] == 17


def test_a_final_config_that_moves_the_kv_cache_to_the_host_unasked_fails_and_upstream_is_exported() -> None:
    rec = rg.decide(FULL, NKVO, full=True, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "fail" and rec["final"]["splits_tg"] == 34
    assert any("34 splits" in r for r in rec["reasons"]) and any("host memory" in r for r in rec["reasons"])
    result = {"rules": ["decode/D64/gqa4/kvf16:32768-=TILE"], "tuned": {"values": {"threads": 4}}, "rows": [{"phase": "tg"}]}
    out = rg.residency_result(result, rec)
    assert out["rules"] == [] and out["tuned"] is None and out["rows"] == []
    assert out["residency"]["rejected"]["rules"] == result["rules"]
    assert "residency" in out["dropped"]["decode/D64/gqa4/kvf16:32768-=TILE"]


def test_more_decode_splits_than_upstream_fail_even_within_the_absolute_limit() -> None:
    up = dataclasses.replace(FULL, splits_tg=1, splits_pp=1)
    assert rg.decide(up, FULL, full=True, host_weights_mib=INPUT_MIB)["verdict"] == "fail"


def test_a_config_that_asks_for_host_kv_is_reported_not_judged() -> None:
    rec = rg.decide(NKVO, NKVO, full=False, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "pass" and "partial offload" in rec["why"]


def test_when_upstream_fails_the_same_way_the_check_cannot_tell_and_keeps_the_final_config() -> None:
    rec = rg.decide(NKVO, NKVO, full=True, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "not judged" and "cannot tell" in rec["why"]
    result = {"rules": ["decode:0-=MMA"], "tuned": None, "rows": [{"phase": "tg"}]}
    assert rg.residency_result(result, rec)["rules"] == ["decode:0-=MMA"]


def test_a_failed_probe_of_the_final_config_fails_it() -> None:
    broken = dataclasses.replace(FULL, error="llama-bench exited with code 1")
    rec = rg.decide(FULL, broken, full=True, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "fail" and rec["final"]["error"] and "residency run failed" in rec["reasons"][0]


def test_validate_accepts_a_rejected_final_config_only_when_upstreams_selection_was_exported() -> None:
    from tuner.result.pipeline_export import residency_table
    from tuner.result.validate import _residency_finding

    rec = rg.residency_result({"rules": ["decode:0-=TILE"], "tuned": None, "rows": []},
                              rg.decide(FULL, NKVO, full=True, host_weights_mib=INPUT_MIB))["residency"]
    table = residency_table(rec)
    assert table["verdict"] == "fail" and table["rejected_rules"] == ["decode:0-=TILE"] and "log" not in table["final"]
    assert _residency_finding({"residency": table, "choice": {"fa_rules": []}}).ok
    assert not _residency_finding({"residency": table, "choice": {"fa_rules": ["decode:0-=TILE"]}}).ok
    passed = residency_table(rg.decide(FULL, FULL, full=True, host_weights_mib=INPUT_MIB))
    f = _residency_finding({"residency": passed, "choice": {"fa_rules": []}})
    assert f.ok and f.detail == "pass: decode graph splits 2, 17/17 layers on the GPU"
