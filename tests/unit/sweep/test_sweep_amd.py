"""The AMD table flow on a machine without an AMD GPU (none exists on tuner's machines): the plan and the dry
runs work and say that nothing was timed; run, mmq and confirm stop with exit 2 naming the dry run before
anything is built; the backend is ggml's HIP name; the default build is the hip variant with both hooks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.unit.sweep.test_sweep_merge import _invoke
from tuner.errors import UsageError
from tuner.sweep import confirm, confirm_stage, run_stage
from tuner.targets.archs import load_arch


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.targets import archs

    monkeypatch.setattr(run_stage, "detect_local_archs", lambda: [])
    monkeypatch.setattr(archs, "detect_local_archs", lambda: [])  # what the refusal (targets.target) asks
    for mod in (run_stage, confirm_stage):
        monkeypatch.setattr(mod, "default_build", lambda *a, **k: pytest.fail("built without a GPU"))


@pytest.mark.parametrize("arch", ["gfx1151", "gfx1100", "gfx1201", "gfx942"])
def test_the_plan_and_the_dry_runs_work_and_say_nothing_was_timed(arch: str) -> None:
    code, text = _invoke("plan", "--arch", arch)
    assert code == 0 and "FlashAttention sweep: 50 shapes x 10 n_kv points = 500 cells" in text
    assert f"No {arch} GPU was timed here" in text and f"upstream on {arch}" in text
    for cmd in ("run", "mmq"):
        code, text = _invoke(cmd, "--arch", arch, "--dry-run")
        assert code == 0 and f"No {arch} GPU was timed here" in text and "estimated" in text


def test_run_and_mmq_without_the_gpu_stop_before_building_and_name_the_dry_run(tmp_path: Path) -> None:
    for cmd in ("run", "mmq"):
        code, text = _invoke(cmd, "--arch", "gfx1151", "-o", str(tmp_path / cmd))
        assert code == 2 and f"`tuner sweep {cmd} --arch gfx1151 --dry-run`" in text and "Strix Halo" in text
        assert not (tmp_path / cmd / f"{'sweep' if cmd == 'run' else 'mmq'}.sqlite3").exists()
    # the CPU backend (the tests' builds) times anywhere; an NVIDIA arch is not held to this rule
    run_stage.require_gpu(load_arch("gfx1151"), "CPU", "x")
    run_stage.require_gpu(load_arch("sm_90"), "CUDA0", "x")


def test_confirm_without_the_gpu_stops_and_names_its_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.sweep.test_sweep_confirm import _sweep_dir

    sweep_dir = _sweep_dir(tmp_path)
    load = confirm.load_table  # the sweep dir's table, as an AMD arch's
    monkeypatch.setattr(confirm, "load_table", lambda *a: dataclasses.replace(load(*a), arch=load_arch("gfx1151")))
    plan = confirm_stage.plan_confirm(confirm_stage.ConfirmRequest(sweep_dir=sweep_dir, likes=("llama-3.2-1b",)))
    with pytest.raises(UsageError, match=rf"`tuner sweep confirm {sweep_dir} --dry-run`"):
        confirm_stage.run_confirm(plan)


def test_the_backend_is_ggmls_hip_name_and_the_default_build_the_hip_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_stage.gpu_backend(load_arch("gfx1151"), "CUDA0") == "ROCm0"
    assert run_stage.gpu_backend(load_arch("gfx1151"), "CPU") == "CPU"
    assert run_stage.gpu_backend(load_arch("sm_90"), "CUDA0") == "CUDA0"
    seen = {}

    def render(src, arch, variant, **kw):
        seen.update(arch=arch, variant=variant, hooks=kw.get("hooks"))
        raise UsageError("stop here")

    monkeypatch.undo()
    monkeypatch.setattr(run_stage.source, "fetch_source", lambda *a: object())
    monkeypatch.setattr(run_stage, "render_variant", render)
    monkeypatch.setattr(run_stage, "detect_local_archs", lambda: [])
    with pytest.raises(UsageError, match="stop here"):
        run_stage.default_build("gfx1151", None)
    assert seen == {"arch": "gfx1151", "variant": "hip", "hooks": ("mmq",)}


def test_an_amd_table_confirms_exports_and_validates_from_fake_timings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gfx1151's grid with MMA planted faster than upstream's TILE from n_kv 16384 (fake timings of known truth,
    through the sweep's store, composition, confirmation and export): the patch is keyed on RDNA3.5 and
    `tuner validate` decides it again from the evidence."""
    import random

    from tests.unit.sweep.test_sweep_export import _confirmed, _export, _failed, _fake_source
    from tuner._compat import tomllib
    from tuner.rounds.engine import AA, DEFAULT
    from tuner.rounds.store import Sample, SampleStore
    from tuner.sweep import live
    from tuner.sweep.grid import plan

    _fake_source(tmp_path, monkeypatch)
    gfx = load_arch("gfx1151")
    sweep_dir = tmp_path / "sweep"
    ident = {"arch": "gfx1151", "backend": "ROCm0", "build": "/b", "timer": "t", "device": "AMD Radeon 8060S"}
    store = SampleStore(live.TABLE, sweep_dir / "sweep.sqlite3", ident)
    rng, rows = random.Random(1), []
    for c in plan(
        gfx, head_sizes=(64,), gqa_ratios=(4,), kv_types=("f16",), query_batches=(1,), n_kv=(4096, 8192, 16384, 32768)
    ):
        assert c.upstream == "TILE"
        for r in range(3):
            for cfg in c.configs:
                us = 100.0 * (1 + rng.uniform(-0.002, 0.002))
                us *= (0.8 if c.n_kv >= 16384 else 1.3) if cfg == "MMA" else 1.5 if cfg not in (DEFAULT, AA) else 1.0
                rows.append(Sample(key=(c.shape, c.n_kv), config=cfg, round=r, us=us))
    store.add(rows)
    store.close()
    out = _export(tmp_path, _confirmed(tmp_path, sweep_dir=sweep_dir))
    m = tomllib.loads((out / "table.toml").read_text())
    assert m["target"] == {"arch": "gfx1151", "measured_on": "AMD Radeon 8060S"}
    assert m["table"]["fa_rules"] == ["D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"]
    assert "if (GGML_CUDA_CC_IS_RDNA3_5(cc) && Q->ne[3] == 1) {" in (out / "upstream.patch").read_text()
    assert _failed(out) == {}
