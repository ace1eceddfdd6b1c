"""The AMD table flow on a machine without an AMD GPU (none exists on tuner's machines): the plan and the dry
runs work and say that nothing was timed; run, mmq and confirm stop with exit 2 naming the dry run before
anything is built; the backend is ggml's HIP name; the default build is the hip variant with both hooks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli.sweep_cmd import sweep
from tuner.errors import TunerError, UsageError
from tuner.sweep import build, confirm, confirm_stage, run_stage
from tuner.targets.archs import load_arch


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(sweep, list(args), standalone_mode=False)
    if isinstance(res.exception, TunerError):
        return res.exception.exit_code, str(res.exception)
    assert res.exception is None, res.exception
    return res.exit_code, res.output


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "detect_local_archs", lambda: [])
    for mod in (build, run_stage, confirm_stage):
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
    build.require_gpu(load_arch("gfx1151"), "CPU", "x")
    build.require_gpu(load_arch("sm_90"), "CUDA0", "x")


def test_confirm_without_the_gpu_stops_and_names_its_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.sweep.test_sweep_confirm import _sweep_dir

    sweep_dir = _sweep_dir(tmp_path)
    load = confirm.load_table  # the sweep dir's table, as an AMD arch's
    monkeypatch.setattr(confirm, "load_table", lambda *a: dataclasses.replace(load(*a), arch=load_arch("gfx1151")))
    plan = confirm_stage.plan_confirm(confirm_stage.ConfirmRequest(sweep_dir=sweep_dir, likes=("llama-3.2-1b",)))
    with pytest.raises(UsageError, match=rf"`tuner sweep confirm {sweep_dir} --dry-run`"):
        confirm_stage.run_confirm(plan)


def test_the_backend_is_ggmls_hip_name_and_the_default_build_the_hip_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build.gpu_backend(load_arch("gfx1151"), "CUDA0") == "ROCm0"
    assert build.gpu_backend(load_arch("gfx1151"), "CPU") == "CPU"
    assert build.gpu_backend(load_arch("sm_90"), "CUDA0") == "CUDA0"
    seen = {}

    def render(src, arch, variant, **kw):
        seen.update(arch=arch, variant=variant, hooks=kw.get("hooks"))
        raise UsageError("stop here")

    monkeypatch.undo()
    monkeypatch.setattr(build.source, "fetch_source", lambda *a: object())
    monkeypatch.setattr(build, "render_variant", render)
    monkeypatch.setattr(build, "detect_local_archs", lambda: [])
    with pytest.raises(UsageError, match="stop here"):
        build.default_build("gfx1151", None)
    assert seen == {"arch": "gfx1151", "variant": "hip", "hooks": ("mmq",)}
