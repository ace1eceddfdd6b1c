"""The residency gate's decisions on llama.cpp logs recorded on the H100 (tests/data/residency/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tuner.measure.residency import parse_residency
from tuner.plan.fa_rules import as_stored, parse_fa_rules
from tuner.search import residency_gate as rg

DATA = Path(__file__).resolve().parents[2] / "data" / "residency"
FULL = parse_residency((DATA / "cuda-full-offload.log").read_text())  # 1B, -ngl 99: 2 splits, KV on CUDA0
NKVO = parse_residency((DATA / "cuda-nkvo.log").read_text())  # the same with -nkvo 1: 34 splits, KV on the host
INPUT_MIB = 205.49  # the 1B's token embeddings, which llama.cpp keeps on the host


@pytest.mark.parametrize(
    ("args", "full"),
    [
        ((), True),
        (("-ngl", "99"), True),
        (("-ngl", "17"), True),
        (("-ngl", "16"), False),
        (("-ngl", "8"), False),
        (("-nkvo", "1"), False),
        (("-nkvo", "0"), True),
        (("--no-kv-offload", "1"), False),
        (("-t", "4", "-ub", "512"), True),
    ],
)
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
    result = {
        "rules": parse_fa_rules("decode/D64/gqa4/kvf16:32768-=TILE"),
        "tuned": {"values": {"threads": 4}},
        "rows": [{"phase": "tg"}],
    }
    out = rg.residency_result(result, rec)
    assert out["rules"] == () and out["tuned"] is None and out["rows"] == []
    assert out["residency"]["rejected"]["rules"] == result["rules"]
    assert "residency" in out["dropped"][result["rules"][0]]


def test_more_decode_splits_than_upstream_fail_even_within_the_absolute_limit() -> None:
    up = dataclasses.replace(FULL, splits_tg=1, splits_pp=1)
    assert rg.decide(up, FULL, full=True, host_weights_mib=INPUT_MIB)["verdict"] == "fail"


def test_a_config_that_asks_for_host_kv_is_reported_not_judged() -> None:
    rec = rg.decide(NKVO, NKVO, full=False, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "pass" and "partial offload" in rec["why"]


def test_when_upstream_fails_the_same_way_the_check_cannot_tell_and_keeps_the_final_config() -> None:
    rec = rg.decide(NKVO, NKVO, full=True, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "not judged" and "cannot tell" in rec["why"]
    result = {"rules": parse_fa_rules("decode:0-=MMA"), "tuned": None, "rows": [{"phase": "tg"}]}
    assert rg.residency_result(result, rec)["rules"] == parse_fa_rules("decode:0-=MMA")


def test_a_failed_probe_of_the_final_config_fails_it() -> None:
    broken = dataclasses.replace(FULL, error="llama-bench exited with code 1")
    rec = rg.decide(FULL, broken, full=True, host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "fail" and rec["final"]["error"] and "residency run failed" in rec["reasons"][0]


def test_validate_accepts_a_rejected_final_config_only_when_upstreams_selection_was_exported() -> None:
    from tuner.result.pipeline_export import residency_table
    from tuner.result.validate import _residency_finding

    rec = rg.residency_result(
        {"rules": parse_fa_rules("decode:0-=TILE"), "tuned": None, "rows": []},
        rg.decide(FULL, NKVO, full=True, host_weights_mib=INPUT_MIB),
    )["residency"]
    table = residency_table(as_stored(rec))  # the export reads the record as the study stored it
    assert table["verdict"] == "fail" and table["rejected_rules"] == ["decode:0-=TILE"] and "log" not in table["final"]
    assert _residency_finding({"residency": table, "choice": {"fa_rules": []}}).ok
    assert not _residency_finding({"residency": table, "choice": {"fa_rules": ["decode:0-=TILE"]}}).ok
    passed = residency_table(rg.decide(FULL, FULL, full=True, host_weights_mib=INPUT_MIB))
    f = _residency_finding({"residency": passed, "choice": {"fa_rules": []}})
    assert f.ok and f.detail == "pass: decode graph splits 2, 17/17 layers on the GPU"


def _real(name: str):
    import gzip

    return parse_residency(gzip.decompress((DATA / name).read_bytes()).decode())


def test_real_h100_logs_of_a_full_offload_and_of_nkvo_judge_as_the_written_fixtures_do() -> None:
    # the H100 with the 89-virtual build, the same 1B: -fa 1 and -fa 1 -nkvo 1
    full, nkvo = _real("h100-89v-l1b-full.log.gz"), _real("h100-89v-l1b-nkvo.log.gz")
    assert (full.splits_tg, full.layers_offloaded, dict(full.kv_buffers)) == (
        FULL.splits_tg,
        FULL.layers_offloaded,
        dict(FULL.kv_buffers),
    )
    assert (nkvo.splits_tg, nkvo.host_kv_mib) == (NKVO.splits_tg, NKVO.host_kv_mib)
    assert rg.decide(full, nkvo, full=True, host_weights_mib=INPUT_MIB)["verdict"] == "fail"
    assert rg.decide(full, None, full=True, host_weights_mib=INPUT_MIB)["verdict"] == "pass"


def test_a_partial_offload_scenario_reports_a_tuned_nkvo_and_does_not_reject_it() -> None:
    # the H100's host-paced search (--set ngl=8 --cpu-mask 0-3): upstream -ngl 8 had 2 decode splits, the
    # final config (-t 4 -ub 1024 -b 1024 -ngl 8 -nkvo 1) 16; the gate, judging by the final config's own
    # arguments and counting splits regardless, exported upstream's selection for it. The scenario is upstream's.
    up, final = _real("h100-ngl8-upstream.log.gz"), _real("h100-ngl8-nkvo-t4-final.log.gz")
    assert (up.splits_tg, final.splits_tg, up.layers_offloaded, final.layers_offloaded) == (2, 16, 8, 8)
    assert final.host_kv_mib == 24.0 and up.host_kv_mib == 13.5
    base = ("-ngl", "8")
    assert not rg.full_offload(base, up.layers_total - 1)
    rec = rg.decide(up, final, full=rg.full_offload(base, 16), host_weights_mib=INPUT_MIB)
    assert rec["verdict"] == "pass" and "partial offload" in rec["why"] and rec["final"]["splits_tg"] == 16
    result = {"rules": [], "tuned": {"values": {"no_kv_offload": 1, "threads": 4}}, "rows": [{"phase": "tg"}]}
    assert rg.residency_result(result, rec)["tuned"] == result["tuned"]
    # the same final config where the scenario is a full offload is rejected: its KV cache left the GPU
    assert rg.decide(FULL, final, full=True, host_weights_mib=INPUT_MIB)["verdict"] == "fail"


def test_a_stored_record_is_decided_again_from_its_logs_and_stands_where_they_are_gone(tmp_path: Path) -> None:
    import gzip

    logs = {}
    for side, name in (("upstream", "h100-ngl8-upstream.log.gz"), ("final", "h100-ngl8-nkvo-t4-final.log.gz")):
        logs[side] = tmp_path / side / "residency.log"
        logs[side].parent.mkdir()
        logs[side].write_bytes(gzip.decompress((DATA / name).read_bytes()))
    up, final = (
        dataclasses.replace(parse_residency(logs[s].read_text()), log_file=logs[s]) for s in ("upstream", "final")
    )
    old = rg.decide(up, final, full=True, host_weights_mib=INPUT_MIB)  # judged as a full offload: fail
    assert old["verdict"] == "fail"
    again = rg.redecide(old, full=False, host_weights_mib=INPUT_MIB)
    assert again is not None and again["verdict"] == "pass" and again["final"]["log"] == str(logs["final"])
    assert again["final"]["splits_tg"] == 16
    logs["final"].unlink()
    assert rg.redecide(old, full=False, host_weights_mib=INPUT_MIB) is None  # the stored record stands
    failed = {**old, "upstream": {**old["upstream"], "error": "llama-bench exited with code 1"}}
    assert rg.redecide(failed, full=False, host_weights_mib=INPUT_MIB) is None


def test_the_report_shows_what_the_confirm_measured_of_a_rejected_config() -> None:
    from tuner.result.pipeline_export import residency_table
    from tuner.result.pipeline_report import residency_section

    rec = rg.decide(FULL, NKVO, full=True, host_weights_mib=INPUT_MIB)
    rows = [
        {
            "phase": "tg",
            "depth": 0,
            "base_ts": 39.22,
            "tuned_ts": 70.77,
            "speedup": 1.749,
            "ci_low": 1.584,
            "ci_high": 1.932,
            "aa_noise_pct": 11.6,
            "verdict": "faster",
            "base_cpu": 306.0,
            "tuned_cpu": 400.0,
            "base_gpu": float("nan"),
        }
    ]
    tuned = {"values": {"no_kv_offload": 1, "T1": 4}, "params": {"no_kv_offload": 1}}  # values repeat the pinned T1
    out = rg.residency_result({"rules": [], "tuned": tuned, "rows": rows}, rec)
    table = residency_table(out["residency"])
    assert (
        table["rejected_tuned"] == {"no_kv_offload": 1} and "base_gpu" not in table["rejected_points"][0]
    )  # NaN left out (TOML)
    text = residency_section(table)
    assert "knobs: {'no_kv_offload': 1}" in text and "+74.9% [+58.4..+93.2%]" in text and "306 / 400" in text


def test_the_stage_redecides_a_stored_record_and_probes_again_where_a_probe_failed(tmp_path: Path, monkeypatch) -> None:
    import gzip
    import types

    from tests.unit.search.conftest import search_run
    from tuner.plan.derive import legal_values, resolve_space
    from tuner.plan.space import load_space
    from tuner.search.final_gates import config_key as _config_key
    from tuner.search.final_gates import run_residency_gate as _residency
    from tuner.study.record import SearchOutcome
    from tuner.study.state import StudyState
    from tuner.targets.host import Cpus

    class _Study:
        def __init__(self) -> None:
            self.user_attrs: dict = {}

        def set_user_attr(self, k, v) -> None:
            self.user_attrs[k] = v

    builds = types.SimpleNamespace(get=lambda variant, compile_values: types.SimpleNamespace(build_id=variant))
    space = resolve_space(
        load_space("cpu", "mma"),
        legal_values(load_space("cpu", "mma"), cpus=Cpus(ids=(0, 1), physical=2, masked=False)),
    )

    monkeypatch.setattr("tuner.measure.residency.input_layer_mib", lambda model: INPUT_MIB)
    parsed = {}
    for side, name in (("upstream", "h100-ngl8-upstream.log.gz"), ("final", "h100-ngl8-nkvo-t4-final.log.gz")):
        f = tmp_path / "residency" / side / "residency.log"
        f.parent.mkdir(parents=True)
        f.write_bytes(gzip.decompress((DATA / name).read_bytes()))
        parsed[side] = dataclasses.replace(parse_residency(f.read_text()), log_file=f)
    calls: list = []

    def probe(build, env, args, d):
        calls.append(d.name)
        return parsed[d.name]

    cfg = types.SimpleNamespace(variants=None, run_dir=tmp_path, model=tmp_path / "m.gguf")
    study = _Study()
    st = StudyState(study)
    result = {"rules": [], "tuned": {"trial": 0, "values": {"threads": 1}}, "rows": [{"phase": "tg"}], "dropped": {}}
    key = _config_key([], {"threads": 1})
    st.set_residency(
        key, rg.decide(parsed["upstream"], parsed["final"], full=True, host_weights_mib=INPUT_MIB)
    )  # the old rule's "fail"

    shape = types.SimpleNamespace(n_layers=16, d_model=2048)
    run = search_run(cfg, study, space=space, builds=builds, base_args=("-ngl", "8"), shape=shape)

    def go():  # the result as the study stores it, in and out
        return _residency(run, SearchOutcome.from_result(run.header, result), probe=probe).result_json()

    out = go()
    assert (
        calls == [] and out["residency"]["verdict"] == "pass" and st.residency(key)["verdict"] == "pass"
    )  # from the logs
    st.set_residency(
        key,
        {**st.residency(key), "upstream": {**st.residency(key)["upstream"], "error": "llama-bench exited with code 1"}},
    )
    assert go()["residency"]["verdict"] == "pass" and calls == ["upstream", "final"]  # a failed probe runs again
