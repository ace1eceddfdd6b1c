from __future__ import annotations

import random

import pytest

from tuner.search.select import BucketPick, Measurement, Selection, select_winners


def m(center: float, n: int = 12, spread: float = 0.01, seed: int = 0) -> Measurement:
    rnd = random.Random(seed * 1000 + int(center))
    return Measurement(samples=tuple(center * (1 + rnd.uniform(-spread, spread)) for _ in range(n)))


def results(**cfgs: dict[tuple[str, int], float]) -> dict:
    return {name: {p: m(v, seed=i) for p, v in pts.items()} for i, (name, pts) in enumerate(cfgs.items())}


DEPTHS = (0, 4096, 16384, 32768)


def pick_for(sel: Selection, phase: str, depth: int) -> BucketPick:
    """The bucket of ``sel`` that holds ``depth`` of ``phase``."""
    return next(b for b in sel.buckets if b.phase == phase and depth in b.depths)


def flat(v: float, phase: str = "tg") -> dict[tuple[str, int], float]:
    return {(phase, d): v for d in DEPTHS}


def test_no_difference_keeps_baseline() -> None:
    r = results(baseline=flat(100.0), trial1=flat(100.2))
    sel = select_winners(r, "baseline")
    assert [b.config for b in sel.buckets] == ["baseline"]
    assert sel.buckets[0].depths == DEPTHS


def test_uniform_winner_is_one_bucket() -> None:
    r = results(baseline=flat(100.0), trial1=flat(110.0), trial2=flat(105.0))
    sel = select_winners(r, "baseline")
    assert len(sel.buckets) == 1
    b = sel.buckets[0]
    assert b.config == "trial1"
    assert all(p["verdict"] == "faster" for p in b.per_point.values())
    assert b.per_point[0]["delta_pct"] == pytest.approx(10.0, abs=1.5)


def test_no_harm_rule_rejects_config_slower_somewhere() -> None:
    # trial1 is much faster at short depth but 10% slower at 32k: it may not represent a bucket
    # containing 32k; the selection splits so the long-context bucket keeps the baseline.
    pts = {("tg", 0): 130.0, ("tg", 4096): 125.0, ("tg", 16384): 101.0, ("tg", 32768): 90.0}
    r = results(baseline=flat(100.0), trial1=pts)
    sel = select_winners(r, "baseline")
    assert "trial1" in sel.rejected and "32768" in sel.rejected["trial1"]
    short = pick_for(sel, "tg", 0)
    long = pick_for(sel, "tg", 32768)
    assert short.config == "trial1" and 32768 not in short.depths
    assert long.config == "baseline"


def test_per_bucket_winners_by_context() -> None:
    # VEC-like config wins short contexts, MMA-like wins long ones, by more than tau.
    vec = {("tg", 0): 120.0, ("tg", 4096): 118.0, ("tg", 16384): 100.0, ("tg", 32768): 100.0}
    mma = {("tg", 0): 100.0, ("tg", 4096): 100.0, ("tg", 16384): 115.0, ("tg", 32768): 125.0}
    r = results(baseline=flat(100.0), vec=vec, mma=mma)
    sel = select_winners(r, "baseline")
    assert pick_for(sel, "tg", 0).config == "vec"
    assert pick_for(sel, "tg", 32768).config == "mma"
    assert pick_for(sel, "tg", 0).depths == (0, 4096)


def test_eligible_and_fallback() -> None:
    r = results(baseline=flat(100.0), g=flat(108.0), other=flat(120.0))
    sel = select_winners(r, "baseline", eligible=lambda c, ph: c in ("g",), fallback="g")
    assert [b.config for b in sel.buckets] == ["g"]
