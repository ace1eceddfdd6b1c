"""The CPU% rule (docs/design.md) in every decode decision: CPU% statistics and the rejection rule, on fakes whose truth is known."""

from __future__ import annotations

import math
import random

import pytest

from tuner.measure.paired import CPU_REJECTED, noise_points, paired_diff, rejects_cpu_cost
from tuner.plan.fa_rules import parse_fa_rules
from tuner.rounds import compose as comp
from tuner.rounds.joint import Candidate, candidates_for, run_phase_rounds
from tuner.rounds.stats import AA_NAME, UPSTREAM, summarize_phase
from tuner.search import confirm as conf
from tuner.search import tune as tn


def fake(ts, cpu, *, seed: int = 0, jitter: float = 0.003, cpu_jitter: float = 1.0):
    """A measure with known t/s and CPU% per candidate name (``ts(name)``, ``cpu(name)``), plus a busiest
    core of half the CPU% and no GPU (None, as the live measure reports without NVML)."""
    rng = random.Random(seed)

    def measure(c: Candidate, phase: str, depths, label: str):
        return {
            d: {
                "ts": ts(c.name) * rng.gauss(1, jitter),
                "kernel": None,
                "why": None,
                "error": "",
                "cpu": cpu(c.name) + rng.gauss(0, cpu_jitter),
                "core": cpu(c.name) / 2,
                "gpu": None,
            }
            for d in depths
        }

    return measure


def test_paired_diff_is_in_points_with_a_t_interval() -> None:
    d = paired_diff([190.0, 195.0, 192.0], [100.0, 101.0, 99.0])
    assert d.n == 3 and math.isclose(d.mean, 92.333333, rel_tol=1e-6)
    # t(0.975, 2) = 4.303; sd of (90, 94, 93) = 2.0817
    assert math.isclose(d.ci_high - d.mean, 4.3027 * 2.0817 / math.sqrt(3), rel_tol=1e-3)
    assert paired_diff([None, 50.0], [10.0, 20.0]).n == 1 and math.isnan(paired_diff([50.0], [20.0]).ci_low)
    assert noise_points(paired_diff([100.5, 99.0, 100.0], [100.0, 100.0, 100.0])) < 3
    assert noise_points(paired_diff([1.0], [2.0])) == math.inf  # one round: unknown noise


@pytest.mark.parametrize(
    "ts_low, ts_noise, cpu_low, cpu_noise, rejected",
    [
        (1.001, 2.0, 40.0, 3.0, True),  # CPU up 40 points beyond 3, t/s within its noise: the rule's case
        (0.90, 2.0, 40.0, 3.0, True),  # slower and hungrier
        (1.05, 2.0, 40.0, 3.0, False),  # the CPU pays for a gain beyond the noise
        (1.001, 2.0, 2.0, 3.0, False),  # CPU rise within the noise
        (1.001, 2.0, -30.0, 3.0, False),  # CPU down
        (1.001, 2.0, math.nan, 3.0, False),  # no CPU% measured (an old study): nothing to claim
        (1.001, 2.0, 40.0, math.inf, False),  # CPU noise unknown: no rise established
        (math.nan, 2.0, 40.0, 3.0, True),  # no t/s interval: no gain established
    ],
)
def test_rejects_cpu_cost_rule(
    ts_low: float, ts_noise: float, cpu_low: float, cpu_noise: float, rejected: bool
) -> None:
    assert rejects_cpu_cost(ts_low, ts_noise, cpu_low, cpu_noise) is rejected


def _screen(phase: str, ts, cpu, rounds: int = 4):
    recs: list = []
    cands = [*candidates_for(phase, []), Candidate(name="poll", args=("--poll", "100"))]
    run_phase_rounds(fake(ts, cpu), phase, cands, [0, 256], recs, min_rounds=rounds, max_rounds=rounds, target_ci=0.1)
    return recs, summarize_phase(phase, recs, [0, 256])


def test_screen_rejects_a_decode_candidate_that_only_burns_cpu() -> None:
    recs, cells = _screen("tg", lambda n: 100.0, lambda n: 190.0 if n == "poll" else 100.0)
    assert set(recs[0]["cpu"]) == {UPSTREAM, AA_NAME, "poll"} and recs[0]["core"]["poll"]["0"] == 95.0
    assert recs[0]["gpu"]["poll"] == {"0": None, "256": None}  # no GPU observer: unknown, not 0
    c = cells[0]
    assert c.verdicts["poll"] == CPU_REJECTED and c.verdicts[AA_NAME] != CPU_REJECTED
    assert 85 < c.cpu["poll"].mean < 95 and c.cpu_noise < 5
    assert c.levels["poll"]["cpu"] > 180 and c.levels[UPSTREAM]["core"] == 50.0 and math.isnan(c.levels["poll"]["gpu"])
    assert c.as_dict()["effects"]["poll"]["cpu"]["n"] == 4


def test_prefill_is_not_judged_by_cpu() -> None:
    _, cells = _screen("pp", lambda n: 100.0, lambda n: 190.0 if n == "poll" else 100.0)
    assert cells[0].verdicts["poll"] == "no difference"


def test_a_faster_hungrier_decode_candidate_is_kept() -> None:
    _, cells = _screen("tg", lambda n: 130.0 if n == "poll" else 100.0, lambda n: 190.0 if n == "poll" else 100.0)
    assert cells[0].verdicts["poll"] == "faster"


def test_old_records_without_utilizations_still_summarize() -> None:
    recs, _ = _screen("tg", lambda n: 100.0, lambda n: 190.0 if n == "poll" else 100.0)
    old = [{k: v for k, v in r.items() if k not in ("cpu", "core", "gpu")} for r in recs]
    c = summarize_phase("tg", old, [0, 256])[0]
    assert c.verdicts["poll"] == "no difference" and c.cpu["poll"].n == 0 and c.cpu_noise == math.inf
    assert math.isnan(c.levels[UPSTREAM]["cpu"]) and c.levels[UPSTREAM]["ts"] > 0


def test_compose_names_the_cpu_hungry_kernel_it_did_not_compose() -> None:
    recs: list = []
    cands = candidates_for("tg", ["VEC", "TILE"])  # upstream runs VEC: VEC is the A/A pair
    ts = {UPSTREAM: 100.0, "VEC": 100.0, "TILE": 100.2}
    cpu = {UPSTREAM: 20.0, "VEC": 20.0, "TILE": 95.0}

    base = fake(lambda n: ts[n], lambda n: cpu[n])

    def measure(c: Candidate, phase: str, depths, label: str):
        m = base(c, phase, depths, label)
        return {d: {**v, "kernel": c.kernel or "VEC", "why": "rule" if c.kernel else "default"} for d, v in m.items()}

    run_phase_rounds(measure, "tg", cands, [0], recs, min_rounds=4, max_rounds=4, target_ci=0.1)
    dec = comp.compose_phase("tg", summarize_phase("tg", recs, [0]))
    assert (
        dec[0].winner is None and CPU_REJECTED in dec[0].reason and "TILE (CPU% +7" in dec[0].reason
    )  # 75 points, jittered


def test_confirm_rejects_the_point_and_drops_the_rule_and_the_knobs() -> None:
    recs: list = []
    cands = [Candidate(name=UPSTREAM), Candidate(name=AA_NAME), Candidate(name=conf.FINAL)]
    run_phase_rounds(
        fake(lambda n: 100.0, lambda n: 180.0 if n == conf.FINAL else 100.0),
        "tg",
        cands,
        [0, 4096],
        recs,
        min_rounds=4,
        max_rounds=4,
        target_ci=0.1,
    )
    rows = conf.point_rows("tg", summarize_phase("tg", recs, [0, 4096]), recs)
    assert [r["verdict"] for r in rows] == [CPU_REJECTED, CPU_REJECTED]
    r = rows[0]
    assert 175 < r["tuned_cpu"] < 185 and 95 < r["base_cpu"] < 105 and r["cpu_ci_low"] > r["cpu_noise"]
    assert r["tuned_core"] == 90.0 and math.isnan(r["base_gpu"])
    j = conf.judge(parse_fa_rules("decode:0-=TILE"), rows, process_changed=True)
    assert j["kept"] == () and "CPU% up" in j["dropped"][parse_fa_rules("decode:0-=TILE")[0]]
    assert not j["process_ok"] and "CPU% up beyond the noise without a t/s gain at tg@d0" in j["process_why"]


def test_tune_rejects_a_trial_that_only_burns_cpu() -> None:
    up = fake(lambda n: 100.0, lambda n: 100.0, jitter=0.0, cpu_jitter=0.0)
    hungry = fake(lambda n: 100.5, lambda n: 160.0, jitter=0.0, cpu_jitter=0.0)
    objs, _, cpu = tn.paired_objectives(
        up, Candidate(name="ref"), hungry, Candidate(name="cand"), ["tg"], [0, 256], label="tune-t0-r0", flip=False
    )
    assert cpu == {"tg@0": 60.0, "tg@256": 60.0}
    cells = {"0": {"noise_pct": 1.0, "cpu_noise": 4.0}, "256": {"noise_pct": 2.0, "cpu_noise": 6.0}, "512": {}}
    assert tn.screen_noise(cells) == (2.0, 6.0)
    why = tn.cpu_rejection(objs, cpu, 2.0, 6.0)
    assert why.startswith(CPU_REJECTED) and "+60.0 points" in why
    assert tn.cpu_rejection([1.0, 1.10], cpu, 2.0, 6.0) == ""  # 10% faster: worth the CPU
    assert tn.cpu_rejection(objs, {}, 2.0, 6.0) == ""  # no CPU% measured
    assert tn.screen_noise({}) == (math.inf, math.inf)

    class T:
        def __init__(self, values, rejected=""):
            self.values, self.user_attrs = values, {"rejected": rejected} if rejected else {}

    assert tn.pick([T([1.0, 1.2], rejected=why), T([1.0, 1.03])]).values == [1.0, 1.03]
