"""A kept rule is narrowed to its first confirmed-faster depth (tuner/search/confirm.py, ``judge``).

The H100 case: the kernel screen composed ``decode/D64/gqa4/kvf16:6144-=MMA``; end to end the confirm found
MMA faster only at 32768, 49152 and 65536, and no different from upstream's VEC at 8192, 12288 and 16384
(point estimates 0.977..1.037). The export must not force MMA where it gains nothing end to end.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from tuner.measure.paired import UPSTREAM_KEPT
from tuner.plan.fa_rules import FaRule, parse_fa_rules
from tuner.rounds.output_gate import upstream_instead
from tuner.search.confirm import judge, narrowed_rule
from tuner.study.record import SearchOutcome, StudyHeader, relabel_rows

RULE = "decode/D64/gqa4/kvf16:6144-=MMA"
NARROWED = "decode/D64/gqa4/kvf16:32768-=MMA"
# depth -> (speedup, verdict) of the final config (MMA from 6144 on) against upstream (VEC)
H100 = {
    0: (1.004, "no difference"),  # outside the rule: VEC on both sides
    4096: (0.996, "no difference"),
    8192: (0.977, "no difference"),
    12288: (1.037, "no difference"),
    16384: (1.012, "no difference"),
    32768: (1.061, "faster"),
    49152: (1.083, "faster"),
    65536: (1.104, "faster"),
}


def _row(phase: str, depth: int, speedup: float, verdict: str, *, forced: str | None) -> dict[str, Any]:
    up = "VEC" if phase == "tg" else "MMA"
    base = 500.0 - depth / 512
    return {
        "phase": phase,
        "depth": depth,
        "upstream_kernel": up,
        "kernel": forced or up,
        "base_ts": base,
        "tuned_ts": base * speedup,
        "speedup": speedup,
        "ci_low": speedup - 0.02,
        "ci_high": speedup + 0.02,
        "rounds": 6,
        "aa_noise_pct": 3.0,
        "verdict": verdict,
        "rule": "sequential",
        "base_cpu": 100.0,
        "tuned_cpu": 101.5,
        "cpu_delta": 1.5,
        "cpu_ci_low": -1.0,
        "cpu_ci_high": 4.0,
        "cpu_noise": 4.5,
        "base_core": 99.0,
        "tuned_core": 99.5,
        "base_gpu": 60.0,
        "tuned_gpu": 58.0,
    }


def _rows(truth: dict[int, tuple[float, str]], rule: FaRule) -> list[dict[str, Any]]:
    tg = [_row("tg", d, s, v, forced=rule.kernel if rule.covers(d) else None) for d, (s, v) in truth.items()]
    return tg + [_row("pp", d, 1.0, "no difference", forced=None) for d in (0, 32768)]


def test_rule_faster_only_deep_is_narrowed_to_its_first_faster_depth() -> None:
    (rule,) = parse_fa_rules(RULE)
    rows = _rows(H100, rule)
    before = copy.deepcopy(rows)
    j = judge([rule], rows, process_changed=False)
    (narrowed,) = parse_fa_rules(NARROWED)
    assert j["kept"] == (narrowed,) and j["dropped"] == {}
    assert list(j["narrowed"]) == [narrowed]
    why = j["narrowed"][narrowed]
    assert RULE in why and "not faster end to end at depths [8192, 12288, 16384]" in why
    assert "starts at 32768, the first confirmed-faster depth" in why
    assert rows == before  # the measured rows are not touched; judge returns relabelled copies
    out = {(r["phase"], r["depth"]): r for r in j["rows"]}
    assert len(j["rows"]) == len(rows)
    for d in (8192, 12288, 16384):  # measured with MMA, not faster: exported as upstream's VEC
        r, m = out[("tg", d)], next(x for x in rows if x["phase"] == "tg" and x["depth"] == d)
        assert r["kernel"] == r["upstream_kernel"] == "VEC" and r["verdict"] == UPSTREAM_KEPT
        assert r["measured_kernel"] == "MMA" and r["measured_verdict"] == "no difference"
        assert r["measured_speedup"] == m["speedup"] and r["measured_tuned_ts"] == m["tuned_ts"]
        assert (r["measured_ci_low"], r["measured_ci_high"]) == (m["ci_low"], m["ci_high"])
        assert r["measured_tuned_cpu"] == m["tuned_cpu"] and r["measured_cpu_delta"] == m["cpu_delta"]
        # upstream's config there, by construction: its t/s, CPU% and GPU%, no measured difference
        assert r["tuned_ts"] == r["base_ts"] == m["base_ts"] and r["speedup"] == 1.0
        assert math.isnan(r["ci_low"]) and math.isnan(r["ci_high"]) and math.isnan(r["cpu_delta"])
        assert (r["tuned_cpu"], r["tuned_core"], r["tuned_gpu"]) == (r["base_cpu"], r["base_core"], r["base_gpu"])
    for d in (32768, 49152, 65536):  # still forced and faster
        assert out[("tg", d)] == next(x for x in rows if x["phase"] == "tg" and x["depth"] == d)
        assert out[("tg", d)]["kernel"] == "MMA" and "measured_kernel" not in out[("tg", d)]
    for key in (("tg", 0), ("tg", 4096), ("pp", 0), ("pp", 32768)):  # never covered by the rule
        assert "measured_kernel" not in out[key] and out[key]["verdict"] == "no difference"
    # no exported point shows a forced kernel at a depth the exported rules do not force
    for r in j["rows"]:
        forced = any(k.phase.bench == r["phase"] and k.covers(r["depth"]) for k in j["kept"])
        assert forced == (r["kernel"] != r["upstream_kernel"]), r


def test_rule_faster_at_its_lowest_inside_point_is_unchanged() -> None:
    (rule,) = parse_fa_rules("decode/D64/gqa4/kvf16:8192-=MMA")
    truth = {**H100, 8192: (1.052, "faster")}  # a hole at 12288/16384 stays: only the lower bound moves
    rows = _rows(truth, rule)
    j = judge([rule], rows, process_changed=False)
    assert j["kept"] == (rule,) and j["narrowed"] == {} and j["dropped"] == {}
    assert j["rows"] == rows
    assert narrowed_rule(rule, [r for r in rows if r["phase"] == "tg" and rule.covers(r["depth"])]) is None


def test_rule_with_a_slower_point_is_still_dropped() -> None:
    (rule,) = parse_fa_rules(RULE)
    rows = _rows({**H100, 12288: (0.941, "slower")}, rule)
    j = judge([rule], rows, process_changed=False)
    assert j["kept"] == () and j["narrowed"] == {} and "slower than upstream at depth [12288]" in j["dropped"][rule]
    # the export runs upstream's kernel at every depth: the dropped rule's points say so, its measurements kept aside
    out = {(r["phase"], r["depth"]): r for r in j["rows"]}
    assert all(r["kernel"] == r["upstream_kernel"] for r in j["rows"])
    assert out[("tg", 12288)]["verdict"] == UPSTREAM_KEPT and out[("tg", 12288)]["measured_verdict"] == "slower"
    assert out[("tg", 12288)]["measured_kernel"] == "MMA" and out[("tg", 0)] == rows[0]


def test_a_dropped_rule_confirmed_with_tuned_knobs_keeps_its_rows() -> None:
    # upstream's kernel with the tuned knobs alone was never measured: nothing to relabel the points with
    (rule,) = parse_fa_rules(RULE)
    rows = _rows({**H100, 12288: (0.941, "slower")}, rule)
    j = judge([rule], rows, process_changed=True)
    assert j["kept"] == () and j["rows"] == rows


def test_rule_confirmed_with_tuned_knobs_is_kept_whole() -> None:
    """With tuned process knobs every point measured knobs and kernel together: upstream's kernel with the
    knobs alone was never measured, so narrowing would export an unmeasured config."""
    (rule,) = parse_fa_rules(RULE)
    rows = _rows(H100, rule)
    j = judge([rule], rows, process_changed=True)
    assert j["kept"] == (rule,) and j["narrowed"] == {} and j["rows"] == rows and j["process_ok"]


def test_a_point_another_kept_rule_covers_is_not_relabelled() -> None:
    (old,) = parse_fa_rules(RULE)
    new, other = parse_fa_rules(f"{NARROWED},decode/D64/gqa4/kvf16:12288-16384=TILE")
    out = relabel_rows(_rows(H100, old), [new, other], [old])
    by = {r["depth"]: r for r in out if r["phase"] == "tg"}
    assert by[12288]["kernel"] == "MMA" and "measured_kernel" not in by[12288]
    assert by[8192]["verdict"] == by[16384]["verdict"] == UPSTREAM_KEPT


def test_narrowed_rules_are_stored_loaded_and_dropped_with_a_failed_gate() -> None:
    (narrowed,) = parse_fa_rules(NARROWED)
    why = "narrowed from decode/D64/gqa4/kvf16:6144-=MMA: not faster end to end at depths [8192]"
    res = {"rules": [NARROWED], "dropped": {}, "narrowed": {NARROWED: why}, "rows": [], "upstream_phases": []}
    o = SearchOutcome.from_result(StudyHeader(name="s"), res)
    assert o.rules == (narrowed,) and o.narrowed == {narrowed: why}
    assert o.result_json()["narrowed"] == {NARROWED: why}
    assert SearchOutcome.from_result(StudyHeader(name="s"), o.result_json()) == o
    old = SearchOutcome.from_result(StudyHeader(name="s"), {k: v for k, v in res.items() if k != "narrowed"})
    assert old.narrowed == {} and "narrowed" not in old.result_json()  # studies before narrowing load as they were
    out, rejected = upstream_instead({**res, "rules": (narrowed,), "narrowed": {narrowed: why}}, "failed a gate")
    assert out["narrowed"] == {} and out["dropped"] == {narrowed: "failed a gate"} and rejected["rules"] == (narrowed,)


def test_a_stored_result_shows_a_dropped_rules_points_as_upstreams() -> None:
    # a study recorded before the confirm relabelled dropped rules: the export must not show TILE at d0/d4096
    kept, dropped = parse_fa_rules(f"{NARROWED},decode/D64/gqa4/kvf16:0-8192=TILE")
    truth = {0: (0.995, "no difference"), 4096: (0.995, "no difference"), 32768: (1.08, "faster")}
    rows = [_row("tg", d, s, v, forced="TILE" if d < 8192 else "MMA") for d, (s, v) in truth.items()]
    res = {"rules": [kept.text], "dropped": {dropped.text: "not faster"}, "tuned": None, "rows": rows}
    stored = SearchOutcome.from_result(StudyHeader.from_attrs("s", {}), res)
    assert stored.rows == tuple(rows)  # the record is a view on what the study holds
    out = stored.exported()
    by = {r["depth"]: r for r in out.rows}
    assert by[0]["kernel"] == by[4096]["kernel"] == "VEC" and by[0]["measured_kernel"] == "TILE"
    assert by[32768] == rows[2]
    assert out.exported().rows == out.rows  # relabelling a relabelled point changes nothing
