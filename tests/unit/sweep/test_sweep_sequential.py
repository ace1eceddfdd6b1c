"""Sequential rounds in the sweep (tuner/rounds/engine.py, tuner/sweep/live.py): every cell gets the minimum,
further rounds go only to the cells whose verdict is still open, settled cells get none, the store keeps every
round, a rerun resumes and a higher --max-rounds reopens the open cells. Fake timings of known truth."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.unit.sweep.test_sweep_live import IDENT, N_KV, WIN, FakeRunRound, _back
from tuner.measure import kernel_bench as kb
from tuner.rounds.engine import round_processes
from tuner.rounds.store import SampleStore
from tuner.sweep import live
from tuner.sweep.grid import DEFAULT, Cell, FaShape, plan
from tuner.targets.archs import load_arch

SM90 = load_arch("sm_90")
NOISY = FaShape(D=128, gqa=8, kv="f16", ne1=1)  # nothing differs, and the A/A noise is too wide to settle


def _cells(shapes: Sequence[FaShape], n_kv: Sequence[int] = N_KV) -> list[Cell]:
    return [c for c in plan(SM90, n_kv=tuple(n_kv)) if c.shape in set(shapes)]


class NoisyRunRound(FakeRunRound):
    """FakeRunRound (MMA 1.25x faster on WIN, other forced kernels slower) plus NOISY: every kernel at
    upstream's speed under 20% noise a case, so its cells stay open."""

    def __call__(
        self,
        bin_dir: Path,
        shapes: Sequence[kb.FaShape],
        candidates: Mapping[str, Mapping[str, str]],
        *,
        log_dir: Path,
        backend: str,
        timeout: float,
    ) -> list[kb.KernelTime]:
        out = super().__call__(bin_dir, shapes, candidates, log_dir=log_dir, backend=backend, timeout=timeout)
        fixed = []
        for s, kt in zip(shapes, out, strict=True):
            if _back(s) == NOISY:
                us = 10.0 * math.exp(self.rng.gauss(0, 0.2))
                kt = kb.KernelTime(
                    label=kt.label, shape=s, us_per_run=us, runs=100, kernel=kt.kernel, why=kt.why, backend=backend
                )
            fixed.append(kt)
        return fixed


def _run(
    fake: FakeRunRound, store: SampleStore[live.FaKey], cells: Sequence[Cell], limits: tuple[int, int]
) -> tuple[int, int]:
    return live.run_sweep(
        cells, limits=limits, store=store, bin_dir=Path("/b"), backend="CUDA0", log_dir=Path("/nonexistent"),
        run_round=fake,
    )  # fmt: skip


def _rounds_of(store: SampleStore[live.FaKey]) -> dict[tuple[FaShape, int], int]:
    out: dict[tuple[FaShape, int], int] = {}
    for s in store.samples():
        if s.config == DEFAULT:
            out[s.key] = max(out.get(s.key, 0), s.round + 1)
    return out


def test_live_rounds_go_to_open_cells_only_and_a_higher_maximum_reopens_them(tmp_path: Path) -> None:
    cells = _cells([WIN, NOISY])
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    fake = NoisyRunRound()
    _run(fake, store, cells, (3, 5))
    rounds = _rounds_of(store)
    assert {n for (sh, _), n in rounds.items() if sh == WIN} == {3}  # MMA claimed, the rest slower: settled
    assert {n for (sh, _), n in rounds.items() if sh == NOISY} == {5}  # open to the maximum
    late = [(lbl, [_back(s) for s in ss]) for lbl, ss, log_dir in fake.calls if log_dir.parts[-2] in ("r3", "r4")]
    assert late and all(set(shapes) == {NOISY} for _, shapes in late)
    first = live.compose(cells, store.samples(), limits=(3, 5))
    assert [r.kernel for r in first.rules] == ["MMA"] and first.rules[0].D == WIN.D
    assert store.limits() == (3, 5)
    # a rerun with the same limits has nothing left to do; the open cells' decisions are replayed the same
    again = NoisyRunRound()
    ran, skipped = _run(again, store, cells, (3, 5))
    assert (ran, again.calls) == (0, [])
    assert skipped > 0
    # a higher maximum adds rounds to the open cells only, and the store keeps every round
    more = NoisyRunRound()
    _run(more, store, cells, (3, 7))
    rounds = _rounds_of(store)
    assert {n for (sh, _), n in rounds.items() if sh == WIN} == {3}
    assert {n for (sh, _), n in rounds.items() if sh == NOISY} == {7}
    assert {log_dir.parts[-2] for _, _, log_dir in more.calls} == {"r5", "r6"}
    assert store.limits() == (3, 7)
    out = live.compose(cells, store.samples(), limits=store.limits())
    assert [r.kernel for r in out.rules] == ["MMA"] and not out.no_verdict
    store.close()


def test_an_interrupted_round_is_measured_again_whole(tmp_path: Path) -> None:
    cells = _cells([NOISY])
    store = SampleStore(live.TABLE, tmp_path / "s.db", IDENT)
    _run(NoisyRunRound(), store, cells, (3, 5))
    # drop one config of the last round, as if the run had stopped inside it
    with store.db:
        store.db.execute("DELETE FROM samples WHERE round = 4 AND config = 'A/A'")
    assert not live.compose(cells, store.samples(), limits=(3, 5)).no_verdict  # 4 complete rounds: enough
    fake = NoisyRunRound()
    ran, _ = _run(fake, store, cells, (3, 5))
    # the stored configs of round 5 may come from another machine: every config runs again, back to back
    assert ran == len(fake.calls) == len(round_processes(live.FA, cells, 4))
    assert [lbl for lbl, _, _ in fake.calls] == [live.LABELS[cfg] for cfg, _ in round_processes(live.FA, cells, 4)]
    assert {int(d.parts[-2][1:]) for _, _, d in fake.calls} == {4}
    assert set(_rounds_of(store).values()) == {5}
    store.close()


def test_plan_estimate_counts_the_minimum_and_the_assumed_open_share() -> None:
    cells = _cells([WIN, NOISY])
    per_round = sum(len(c.configs) for c in cells)
    text = live.estimate_text(cells, limits=(3, 6), chunk_size=72, open_share=0.5)
    assert f"{3 * per_round} cases for the first 3 rounds" in text
    assert f"{round(3 * 0.5 * per_round)} cases (assumed: 50% of the cells still open after 3 rounds" in text
    fixed = live.estimate_text(cells, limits=(5, 5), chunk_size=72)
    assert "5 rounds: " in fixed and f"{5 * per_round} cases" in fixed
