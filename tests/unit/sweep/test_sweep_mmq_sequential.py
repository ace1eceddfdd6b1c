"""Sequential rounds in the MMQ sweep (tuner/sweep/mmq.py), as in the FlashAttention sweep: every point
gets the minimum, later rounds' processes carry only the points whose verdict is still open, the store keeps
every round and the limits, a rerun resumes with the same decisions and a higher --max-rounds reopens only the
open points. Fake mm-bench timings of known truth."""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.oracles import parse_mmq_choices
from tests.unit.sweep.test_sweep_mmq_live import FROM, IDENT, SM90, A, B, FakeRunCases, _bin
from tuner.measure import mm_bench
from tuner.measure.decide import DEFAULT_LIMITS
from tuner.measure.fa_bench import BenchCase
from tuner.rounds.engine import DEFAULT, open_points, round_processes
from tuner.rounds.store import SampleStore
from tuner.sweep import mmq
from tuner.sweep.mmq import MmqChoice, mmq_dry_run_text, plan_mmq

BATCHES = (16, 64, 256, 1024, 4096)
NOISY = "q6_K"  # cuBLAS at MMQ's speed under 20% noise a case: its points stay open to the maximum


def _points(types: Sequence[str] = ("q4_K", "q8_0", NOISY)) -> list[mmq.MmqPoint]:
    return mmq.plan_points(plan_mmq(SM90, types, BATCHES), [A, B])[0]


class SeqFake:
    """run_cases' signature: FakeRunCases' planted truth for q4_K and q8_0 (cuBLAS 0.7x the time from the
    batch size in FROM, 1.4x below), and NOISY, where every config times the same under 20% noise a case."""

    def __init__(self, seed: int = 7) -> None:
        self.calls: list[tuple[str, list[mm_bench.MmShape], Path]] = []
        self.rng = random.Random(seed)

    def __call__(
        self,
        bin_dir: Path,
        shapes: Sequence[mm_bench.MmShape],
        env: Mapping[str, str],
        *,
        log_dir: Path,
        backend: str,
        iters: int,
        cache_mb: int,
        timeout: float,
        cuda_graphs: bool,
        target_ms: int = 0,
    ) -> list[BenchCase]:
        self.calls.append((log_dir.name, list(shapes), log_dir))
        forced = bool(parse_mmq_choices(env[mm_bench.ENV])) if env else False
        out = []
        for s in shapes:
            if s.type == NOISY:
                factor, sigma = 1.0, 0.2
            else:
                factor, sigma = (0.7 if s.ne11 >= FROM[(s.type, (s.m, s.k))] else 1.4) if forced else 1.0, 0.003
            us = 10.0 * s.ne11 / 16 * factor * math.exp(self.rng.gauss(0, sigma))
            out.append(BenchCase(ops=50, us_per_op=us, copies=2, copy_bytes=1 << 20))
        return out


def _run(fake: Any, store: SampleStore[mmq.MmqKey], points: Sequence[mmq.MmqPoint], limits: tuple[int, int]) -> Any:
    return mmq.run_mmq(
        points, limits=limits, store=store, bin_dir=Path("/b"), backend="CUDA0", log_dir=Path("/logs"),
        run_cases=fake,
    )  # fmt: skip


def _key(s: mm_bench.MmShape) -> tuple[str, int, int, int]:
    return (s.type, s.m, s.k, s.ne11)


def _rounds_of(store: SampleStore[mmq.MmqKey]) -> dict[tuple[str, int, int, int], int]:
    out: dict[tuple[str, int, int, int], int] = {}
    for s in store.samples():
        if s.config == DEFAULT:
            out[s.key] = max(out.get(s.key, 0), s.round + 1)
    return out


def test_settled_points_get_the_minimum_and_later_processes_carry_only_open_points(tmp_path: Path) -> None:
    points = _points()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    fake = SeqFake()
    ran, skipped = _run(fake, store, points, (3, 6))
    rounds = _rounds_of(store)
    assert {n for (t, *_), n in rounds.items() if t != NOISY} == {3}  # claimed either way at the minimum
    noisy = [n for (t, *_), n in rounds.items() if t == NOISY]
    assert sum(n == 6 for n in noisy) > len(noisy) // 2  # most stay open to the maximum (a few settle: futility)
    samples = store.samples()
    for r in range(6):  # each round's processes carry exactly the points open then, in the points' order
        want = [p.shape for p in open_points(mmq.MMQ, points, samples, r, (3, 6))]
        got = [shapes for _, shapes, d in fake.calls if d.parent.name == f"r{r}"]
        assert len(got) == 3 and all(shapes == want for shapes in got)
        assert len(want) == (len(points) if r < 3 else sum(n > r for n in noisy))
    assert (ran, skipped) == (18, 0) and store.limits() == (3, 6)
    out = mmq.compose_mmq(points, samples, limits=store.limits())
    assert not out.no_verdict
    assert out.choices == (
        MmqChoice(type="q4_K", lo=1024, hi=None, backend="BLAS"),
        MmqChoice(type="q8_0", lo=64, hi=None, backend="BLAS"),
    )
    assert {c.limits for st in out.stats.values() for c in st.values()} == {(3, 6)}
    report = mmq.mmq_report_text(out, points, limits=(3, 6), identity=IDENT, patch=True)
    assert "paired rounds: 3 rounds for every point, up to 6 for the points whose verdict is still open" in report
    by_n = {n: sum(1 for m in rounds.values() if m == n) for n in sorted(set(rounds.values()))}
    assert "- rounds a point with a verdict got: " + ", ".join(f"{n}: {k} points" for n, k in by_n.items()) in report


def test_an_aa_only_grid_composes_nothing_with_sequential_rounds(tmp_path: Path) -> None:
    points = _points(("q4_K", "q8_0"))
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    _run(FakeRunCases(aa_only=True, seed=11), store, points, DEFAULT_LIMITS)
    out = mmq.compose_mmq(points, store.samples(), limits=DEFAULT_LIMITS)
    assert out.choices == () and not out.no_verdict
    assert all(d.winner is None for ds in out.decisions.values() for d in ds)
    assert all(d.winner is None for ds in out.type_decisions.values() for d in ds)


def test_open_points_of_a_round_are_decided_from_the_rounds_before_it_only(tmp_path: Path) -> None:
    points = _points()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    _run(SeqFake(), store, points, (3, 6))
    every = store.samples()
    for r in range(7):
        before = [s for s in every if s.round < r]
        assert open_points(mmq.MMQ, points, every, r, (3, 6)) == open_points(mmq.MMQ, points, before, r, (3, 6))
    assert open_points(mmq.MMQ, points, every, 2, (3, 6)) == points  # below the minimum: every point
    assert {p.type for p in open_points(mmq.MMQ, points, every, 3, (3, 6))} == {NOISY}
    assert open_points(mmq.MMQ, points, every, 6, (3, 6)) == []


def test_a_rerun_resumes_and_a_higher_maximum_reopens_only_open_points(tmp_path: Path) -> None:
    points = _points()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    _run(SeqFake(), store, points, (3, 5))
    store.close()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    again = SeqFake(seed=99)  # other timings: nothing may be re-decided from them
    ran, skipped = _run(again, store, points, (3, 5))
    assert (ran, again.calls) == (0, []) and skipped == 15
    before = _rounds_of(store)
    at_max = sorted(k for k, n in before.items() if n == 5)
    assert at_max and {k[0] for k in at_max} == {NOISY}
    # interrupted in the last round (one config of one point missing): the round is measured again whole,
    # every config over its points back to back, since the stored part may come from another machine
    t, m, k, n = at_max[0]
    with store.db:
        store.db.execute(
            "DELETE FROM mm_samples WHERE round = 4 AND config = 'A/A' AND type = ? AND m = ? AND k = ? AND ne11 = ?",
            (t, m, k, n),
        )
    fix = SeqFake()
    assert _run(fix, store, points, (3, 5))[0] == 3
    assert [lbl for lbl, _, _ in fix.calls] == [mmq.LABELS[c] for c, _ in round_processes(mmq.MMQ, points, 4)]
    assert all(sorted(_key(s) for s in ss) == at_max for _, ss, _ in fix.calls)
    assert _rounds_of(store) == before
    more = SeqFake()
    _run(more, store, points, (3, 7))
    after = _rounds_of(store)
    assert {key: n for key, n in after.items() if key not in at_max} == {
        key: n for key, n in before.items() if key not in at_max
    }  # settled before the old maximum: untouched
    assert all(after[key] in (6, 7) for key in at_max)
    assert {d.parent.name for _, _, d in more.calls} == {"r5", "r6"}
    assert all({_key(s) for s in ss} <= set(at_max) for _, ss, _ in more.calls)
    assert store.limits() == (3, 7)
    out = mmq.compose_mmq(points, store.samples(), limits=store.limits())
    assert not out.no_verdict and [c.text for c in out.choices] == ["q4_K:1024..=BLAS", "q8_0:64..=BLAS"]


def test_a_store_without_limits_was_fixed_rounds_and_resumes(tmp_path: Path) -> None:
    """A file from before the limits were recorded holds fixed rounds: its limits read (n, n), one look, so
    confirm composes it as measured; a sequential rerun keeps its rounds and adds only the open points'."""
    points = _points()
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    _run(SeqFake(), store, points, (4, 4))
    store.close()
    with sqlite3.connect(tmp_path / "s.db") as c:
        c.execute("DELETE FROM meta WHERE key = 'limits'")
    store = SampleStore(mmq.MMQ_TABLE, tmp_path / "s.db", IDENT)
    assert store.limits() == (4, 4)
    assert not mmq.compose_mmq(points, store.samples(), limits=store.limits()).no_verdict
    fake = SeqFake()
    _run(fake, store, points, (3, 6))
    assert {d.parent.name for _, _, d in fake.calls} == {"r4", "r5"}  # rounds 1-4 kept, not rerun
    assert all({s.type for s in ss} == {NOISY} for _, ss, _ in fake.calls)
    assert store.limits() == (3, 6)


def test_plan_estimates_the_minimum_and_the_assumed_open_share() -> None:
    cells = plan_mmq(SM90)
    text = mmq_dry_run_text(cells, limits=(3, 6), sizes=[(4096, 4096)], open_share=0.5)
    per_round = 54 * 3
    assert f"9 processes and {3 * per_round} cases for the first 3 rounds" in text
    assert f"then about 9 processes and {round(3 * 0.5 * per_round)} cases (assumed: 50% of the points" in text
    assert f"fixed 6 rounds would be {6 * per_round} cases" in text
    fixed = mmq_dry_run_text(cells, limits=(5, 5), sizes=[(4096, 4096)])
    assert f"x 5 rounds = 15 processes, {5 * per_round} cases; estimated" in fixed and "assumed" not in fixed


def test_cli_takes_the_round_limits_and_records_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.cli.sweep_cmd import sweep

    fake = SeqFake()
    monkeypatch.setattr(mm_bench, "run_cases", fake)
    monkeypatch.setattr(mm_bench, "mmq_hook_present", lambda *a, **kw: True)
    out = tmp_path / "out"
    args = ["mmq", "--build", str(_bin(tmp_path)), "--type", "q4_K", "--type", NOISY, "--ne11", "256"]
    args += ["--ne11", "1024", "--size", "4096x4096", "-o", str(out)]
    res = CliRunner().invoke(sweep, [*args, "--max-rounds", "4"])
    assert res.exit_code == 0, res.output
    with sqlite3.connect(out / "mmq.sqlite3") as c:
        assert dict(c.execute("SELECT key, value FROM meta").fetchall())["limits"] == "3,4"
    assert [len(ss) for _, ss, _ in fake.calls] == [4] * 9 + [2] * 3  # round 4: the open NOISY points only
    assert "paired rounds: 3 rounds for every point, up to 4" in (out / "report.md").read_text()
    with pytest.raises(Exception, match="below --min-rounds"):
        CliRunner().invoke(sweep, [*args, "--min-rounds", "5", "--max-rounds", "4"], catch_exceptions=False)
