"""The kernel-level screen measure: depth -> FA shape, a fake test-backend-ops with a known truth, and
the pipeline's choice of screen tool."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tests.unit.measure.test_kernel_bench import _fake_tbo
from tuner.errors import UsageError
from tuner.plan.fa_rules import FaRule, Phase
from tuner.rounds import compose as comp
from tuner.rounds.joint import candidates_for, run_joint_rounds
from tuner.rounds.stats import summarize_phase
from tuner.search.kernel_screen import METHOD_BENCH, METHOD_KERNEL, KernelMeasure, kernel_shape
from tuner.search.pipeline import _screen_method
from tuner.study.state import StudyState

SHAPE_1B = {"head_dim": 64, "n_heads": 32, "n_kv_heads": 8, "gqa": 4}
DEPTHS = [0, 4096, 16384, 65536]

# The fake's truth: decode VEC (upstream's pick) costs 10 us + n_kv/1000; TILE is 20% faster from n_kv
# 16384 on and 1% slower below; MMA is 10% slower everywhere. Prefill: MMA (upstream's) 100 us, TILE
# twice that. Each call adds +-0.2% of noise.
FAKE = r"""
import os, random, re, sys
from tuner.plan.fa_rules import parse_fa_rules, Phase
print("Testing 1 devices\n\nBackend 1/1: CUDA0\n  Device description: Fake H100\n")
rules = parse_fa_rules(os.environ.get("GGML_TUNER_FA_RULES", ""))
lines = open(sys.argv[sys.argv.index("--test-file") + 1]).read().splitlines()
rng = random.Random()
for line in lines:
    name = line.split()[-1]
    i, nkv, nb = re.fullmatch(r"kb(\d+)_D64_gqa4_kvf16_nkv(\d+)_nb(\d+)", name).groups()
    nkv, nb = int(nkv), int(nb)
    phase = Phase.DECODE if nb == 1 else Phase.PREFILL
    hit = [r for r in rules if r.phase is phase and r.covers(nkv)]
    kernel, why = (hit[0].kernel, "rule") if hit else ("VEC" if nb == 1 else "MMA", "default")
    if nb == 1:
        base = 10 + nkv / 1000
        us = base * {"VEC": 1.0, "TILE": 0.8 if nkv >= 16384 else 1.01, "MMA": 1.1}[kernel]
    else:
        us = 100 * {"MMA": 1.0, "TILE": 2.0, "VEC": 3.0}[kernel]
    us *= 1 + rng.uniform(-0.002, 0.002)
    print(f"tuner-fa: D=64 DV=64 ne1={nb} gqa=4 n_kv={nkv} kernel={kernel} ({why})")
    print(f"  FLASH_ATTN_EXT(name={name},type=f32,ne=[64,32,{nb},1]):  1000 runs - {us:.4f} us/run - 1 kB/run")
"""


def _fake_build(tmp_path: Path) -> Path:
    """The fake build of test_kernel_bench (a tree with ggml.h) whose test-backend-ops runs FAKE."""
    (tmp_path / "fake_tbo.py").write_text(FAKE)
    return _fake_tbo(tmp_path, f'exec {sys.executable} {tmp_path / "fake_tbo.py"} "$@"\n')


def test_depth_maps_to_the_cells_and_rows_llama_bench_times() -> None:
    """Decode at depth d reads pad256(d + tg) cells with one row; prefill pad256(d + pp) with min(pp, ub) rows."""
    s = kernel_shape(SHAPE_1B, "tg", 4096, pp=512, tg=128, kv_type="f16")
    assert (s.n_kv, s.n_batch, s.gqa, s.head_dim) == (4352, 1, 4, 64)
    s = kernel_shape(SHAPE_1B, "pp", 0, pp=512, tg=128, kv_type="q8_0")
    assert (s.n_kv, s.n_batch, s.kv_type) == (512, 512, "q8_0")
    s = kernel_shape(SHAPE_1B, "pp", 65536, pp=2048, tg=128, kv_type="f16", ubatch=1024)
    assert (s.n_kv, s.n_batch) == (65536 + 2048, 1024)


def test_joint_call_reads_times_kernels_and_device(tmp_path: Path) -> None:
    m = KernelMeasure(
        _fake_build(tmp_path), SHAPE_1B, pp=512, tg=128, kv_type="f16", bench_args=("-ub", "256"), log_dir=tmp_path
    )
    (up,) = candidates_for("tg", [])[:1]
    out = m.joint(up, ["tg", "pp"], [0, 16384], "screen-r0-upstream")
    assert set(out) == {"tg", "pp"} and set(out["tg"]) == {0, 16384}
    assert out["tg"][16384]["kernel"] == "VEC" and out["pp"][0]["kernel"] == "MMA"
    assert out["tg"][16384]["why"] == "default" and out["tg"][16384]["error"] == ""
    # op runs per second: 1e6 / us, the fake's decode at n_kv 16640 costs about 26.64 us
    assert out["tg"][16384]["ts"] == pytest.approx(1e6 / 26.64, rel=0.01)
    assert m.info["device"] == "Fake H100"
    assert "nb256" in (tmp_path / "screen-r0-upstream" / "fa-shapes.txt").read_text()  # -ub 256 sets the rows


def test_screen_with_the_kernel_measure_composes_the_known_truth(tmp_path: Path) -> None:
    """Rotated rounds over the fake: decode TILE from 16384 on (the truth), nothing for prefill."""
    m = KernelMeasure(_fake_build(tmp_path), SHAPE_1B, pp=512, tg=128, kv_type="f16", log_dir=tmp_path)
    cands = {"tg": candidates_for("tg", ["VEC", "TILE", "MMA"]), "pp": candidates_for("pp", ["TILE", "MMA"])}
    recs: list[dict[str, Any]] = []
    run_joint_rounds(
        m.joint, cands, DEPTHS, recs, pp_tokens=512, min_rounds=3, max_rounds=4, target_ci=1.0, settle=comp.open_depths
    )
    shape = comp.Shape(D=64, gqa=4, kv="f16")
    rules = []
    for phase in ("tg", "pp"):
        cells = comp.judge_phase(phase, summarize_phase(phase, recs, DEPTHS))
        rules += comp.rules_from(comp.compose_phase(phase, cells), shape)
    assert [(r.phase, r.kernel) for r in rules] == [(Phase.DECODE, "TILE")]
    (r,) = rules
    assert r.covers(16384 + 256) and r.covers(65536 + 256) and not r.covers(4096 + 256) and r.hi is None
    assert isinstance(r, FaRule)


@dataclasses.dataclass
class _Study:
    user_attrs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def set_user_attr(self, k: str, v: Any) -> None:
        self.user_attrs[k] = v


@dataclasses.dataclass
class _Arch:
    vendor: str


@dataclasses.dataclass
class _Target:
    arch: _Arch
    is_cpu: bool = False
    name: str = "sm_90"


@dataclasses.dataclass
class _Cfg:
    target: _Target
    screen_method: str | None = None
    cpu_mask: tuple[int, ...] | None = None
    study: str = "s"
    arch: str = "sm_90"


KERNELS = {"tg": ["VEC", "TILE", "MMA"], "pp": ["TILE", "MMA"]}
GPU = _Target(_Arch("nvidia"))


def _pick(st: StudyState, cfg: Any, args: tuple[str, ...] = (), *, custom: bool = False, kernels: Any = None) -> str:
    return _screen_method(st, cfg, kernels or KERNELS, args, custom_measure=custom, n_layers=16)


def test_auto_picks_the_kernel_level_only_where_it_stands_for_llama_bench() -> None:
    st = StudyState(_Study())
    assert _pick(st, _Cfg(GPU)) == METHOD_KERNEL
    assert st.screen_method == METHOD_KERNEL  # recorded, so a resumed search keeps it
    for args in (("-ngl", "17"), ("-nkvo", "0"), ("-ngl", "99", "-nkvo", "0")):  # everything on the GPU
        assert _pick(StudyState(_Study()), _Cfg(GPU), args) == METHOD_KERNEL
    for cfg, args, custom in (
        (_Cfg(GPU), ("-ngl", "8"), False),  # part of the model on the CPU: the host paces a step
        (_Cfg(GPU), ("-ngl", "16"), False),  # 16 of 17 (the output layer stays on the CPU)
        (_Cfg(GPU), ("-nkvo", "1"), False),  # the KV cache on the host
        (_Cfg(GPU, cpu_mask=(0, 1)), (), False),
        (_Cfg(GPU), (), True),  # a test's or replay's measure
        (_Cfg(_Target(_Arch("amd"))), (), False),
        (_Cfg(_Target(_Arch("cpu"), is_cpu=True, name="cpu")), (), False),
    ):
        assert _pick(StudyState(_Study()), cfg, args, custom=custom) == METHOD_BENCH


def test_a_study_keeps_its_screen_tool_and_bad_asks_are_refused() -> None:
    old = StudyState(_Study({"screen_rounds": [{"phase": "tg"}]}))  # screened before the kernel-level screen
    assert _pick(old, _Cfg(GPU)) == METHOD_BENCH
    with pytest.raises(UsageError, match="--screen llama-bench"):
        _pick(old, _Cfg(GPU, screen_method=METHOD_KERNEL))
    cpu = _Cfg(_Target(_Arch("cpu"), is_cpu=True, name="cpu"), screen_method=METHOD_KERNEL, arch="cpu")
    with pytest.raises(UsageError, match="--screen llama-bench"):
        _pick(StudyState(_Study()), cpu, kernels={"tg": [], "pp": []})


def test_report_says_the_screen_was_timed_at_the_op_level() -> None:
    from tuner.result.pipeline_report import _screen_section
    from tuner.study.record import outcome_from_attrs

    cell = {
        "depth": 0,
        "upstream_kernel": "VEC",
        "aa": "VEC",
        "noise_pct": 0.4,
        "upstream_ts": 1000.0,
        "effects": {"TILE": {"n": 3, "ratio": 1.2, "ci_low": 1.19, "ci_high": 1.21, "verdict": "faster"}},
    }
    attrs = {"screen_tg": {"0": cell}}
    op = _screen_section(outcome_from_attrs({**attrs, "screen_method": "kernel"}))
    e2e = _screen_section(outcome_from_attrs(attrs))
    assert "op runs/s upstream" in op and "not tokens per second" in op
    assert "t/s upstream" in e2e and "op runs/s" not in e2e


def test_the_op_level_screen_does_not_refine_boundaries() -> None:
    # The op level places boundaries several times too shallow; the confirm narrows them instead.
    from tuner.search.pipeline import _refine_steps

    assert _refine_steps(types.SimpleNamespace(refine=2), METHOD_BENCH) == 2
    assert _refine_steps(types.SimpleNamespace(refine=2), METHOD_KERNEL) == 0
    assert _refine_steps(types.SimpleNamespace(refine=0), METHOD_KERNEL) == 0


def test_a_hung_test_backend_ops_costs_minutes_not_ten(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A test-backend-ops process once hung on the H100 after its CUDA graph warm-up; the measure's calls
    carry a timeout scaled to their cases (2 cases: 140 s), not the 600-s default."""
    import tuner.search.kernel_screen as ks
    from tuner.measure.kernel_bench import process_timeout

    seen: list[float] = []

    def fake_round(bin_dir, shapes, cands, *, log_dir, backend, timeout):  # type: ignore[no-untyped-def]
        seen.append(timeout)
        return []

    monkeypatch.setattr(ks, "run_round", fake_round)
    m = KernelMeasure(tmp_path, SHAPE_1B, pp=512, tg=128, kv_type="f16", log_dir=tmp_path)
    from tuner.rounds.joint import Candidate

    with pytest.raises(ValueError):  # the fake returns no times: zip(strict=True) refuses
        m.joint(Candidate(name="x"), ["tg"], [32768, 65536], "lab")
    assert seen == [process_timeout(2)] and seen[0] == 140.0
