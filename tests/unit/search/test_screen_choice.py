"""One rule picks the screen's tool (tuner.search.kernel_screen.screen_method): ``tuner search --dry-run`` plans with the tool
the search's ``_screen_method`` picks for the same flags, from the pinned runtime knobs rendered the same way."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import use_render_tree
from tuner.cli import cli
from tuner.errors import TunerError, UsageError
from tuner.search.kernel_screen import METHOD_BENCH, METHOD_KERNEL, screen_method

REPO = Path(__file__).resolve().parents[3]
LIKE = "llama-3.2-1b"  # 16 layers: -ngl 17 offloads everything


@pytest.fixture()
def dry_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run on the test tree; nothing compiles."""
    import tuner.builder.cmake

    use_render_tree(monkeypatch)

    def no_build(*a: object, **k: object) -> None:
        raise TunerError("nothing compiles in this test")

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", no_build)


def _dry_run(arch: str, sets: dict[str, str], cpu_mask: str | None, screen: str) -> str:
    """The screen tool of `tuner search --dry-run --json` with these flags (a UsageError's text: ``refused: ...``)."""
    args = ["search", "--arch", arch, "--like", LIKE, "--dry-run", "--json", "--screen", screen]
    args += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    args += ["--cpu-mask", cpu_mask] if cpu_mask is not None else []
    res = CliRunner().invoke(cli, args)
    if isinstance(res.exception, UsageError):
        return f"refused: {res.exception}"
    assert res.exit_code == 0, (res.stderr, res.exception)
    return str(json.loads(res.stdout)["plan"]["screen_method"])


def _search(arch: str, sets: dict[str, str], cpu_mask: str | None, screen: str, monkeypatch: Any) -> str:
    """The screen tool the search picks: run_pipeline's steps up to ``_screen_method`` (the space resolved for
    the model, the pins coerced by it and rendered), for a new study."""
    import tuner.targets.archs
    import tuner.targets.models
    from tests.unit.search.test_kernel_screen import _Study
    from tuner.plan.space import load_space
    from tuner.search import context
    from tuner.search import pipeline as pl
    from tuner.search.kernel_screen import pinned_runtime
    from tuner.study.state import StudyState
    from tuner.targets.host import parse_cpu_mask
    from tuner.targets.models import load_model_shape
    from tuner.targets.target import resolve_target

    s = load_model_shape(LIKE)
    shape = {"head_dim": s.head_dim, "gqa": s.gqa, "n_layers": s.n_layers, "n_heads": s.n_heads}
    shape |= {"n_kv_heads": s.n_kv_heads, "d_model": s.d_model, "context_length": s.context_length}
    monkeypatch.setattr(tuner.targets.models, "read_shape", lambda path: dict(shape))
    monkeypatch.setattr(tuner.targets.archs, "gpu_free_bytes", lambda: 80 << 30)  # the model fits
    target = resolve_target(arch, dry_run=True)
    cfg = types.SimpleNamespace(
        target=target,
        arch=target.arch.name,
        model=REPO / "pyproject.toml",  # a file to stat; its shape is the one read_shape gives above
        depths=(0, 4096),
        pp=512,
        tg=128,
        cpu_mask=None if cpu_mask is None else parse_cpu_mask(cpu_mask),
        fixed=sets,
        screen_method=None if screen == "auto" else screen,
        study="s",
    )
    try:
        space, _ = pl._resolved_space(cfg, load_space(cfg.arch, "mma"))
        fixed = {k: (v if k == "variant" else space.knob(k).coerce(v)) for k, v in cfg.fixed.items()}
        _, base_args = pinned_runtime(space, fixed)
        kernels = {p: context.kernels_for(space, p) for p in context.PHASES}
        return pl._screen_method(
            StudyState(_Study()), cfg, kernels, base_args, custom_measure=False, n_layers=shape["n_layers"]
        )
    except UsageError as err:
        return f"refused: {err}"


CASES = [
    # (arch, --set pins, --cpu-mask, --screen, the tool both pick; "refused" where both refuse)
    ("sm_90", {}, None, "auto", METHOD_KERNEL),  # no pins: the whole model on the GPU
    ("sm_90", {"ngl": "17"}, None, "auto", METHOD_KERNEL),  # -ngl n_layers + 1: full offload, not host-paced
    ("sm_90", {"ngl": "99"}, None, "auto", "refused"),  # beyond 0..17 for this model: the search refuses the pin
    ("sm_90", {"ngl": "8"}, None, "auto", METHOD_BENCH),  # layers on the host
    ("sm_90", {"ngl": "16"}, None, "auto", METHOD_BENCH),  # the output layer on the host
    ("sm_90", {"no_kv_offload": "1"}, None, "auto", METHOD_BENCH),  # the KV cache on the host
    ("sm_90", {"no_kv_offload": "0"}, None, "auto", METHOD_KERNEL),
    ("sm_90", {"threads": "1", "ubatch": "256"}, None, "auto", METHOD_KERNEL),  # pins that keep everything on the GPU
    ("sm_90", {}, "0", "auto", METHOD_BENCH),  # --cpu-mask: the host paces a step
    ("sm_90", {"ngl": "8"}, None, "kernel", METHOD_KERNEL),  # asked for: taken
    ("sm_90", {}, None, "llama-bench", METHOD_BENCH),
    ("cpu", {}, None, "auto", METHOD_BENCH),
    ("cpu", {}, None, "kernel", "refused"),  # no kernel to force on the CPU
    ("gfx1151", {}, None, "kernel", "refused"),
]


@pytest.mark.parametrize(("arch", "sets", "mask", "screen", "want"), CASES)
def test_dry_run_and_search_pick_the_same_screen_tool(
    dry_tree: None,
    monkeypatch: pytest.MonkeyPatch,
    arch: str,
    sets: dict[str, str],
    mask: str | None,
    screen: str,
    want: str,
) -> None:
    planned = _dry_run(arch, sets, mask, screen)
    searched = _search(arch, sets, mask, screen, monkeypatch)
    assert planned.split(":")[0] == searched.split(":")[0] == want, (planned, searched)
    if want == "refused" and screen == "kernel":  # the same refusal, word for word
        assert planned == searched and "--screen llama-bench" in planned


def test_the_rule_alone() -> None:
    from tuner.targets.target import resolve_target

    kw: dict[str, Any] = {"target": resolve_target("sm_90", dry_run=True), "has_kernels": True, "n_layers": 16}
    assert screen_method(None, base_args=[], cpu_mask=None, **kw) == METHOD_KERNEL
    assert screen_method("auto", base_args=["-ngl", "17", "-nkvo", "0"], cpu_mask=None, **kw) == METHOD_KERNEL
    assert screen_method(None, base_args=["-ngl", "99"], cpu_mask=None, **kw) == METHOD_KERNEL  # >= n_layers + 1
    assert screen_method(None, base_args=["-ngl", "16"], cpu_mask=None, **kw) == METHOD_BENCH
    assert screen_method(None, base_args=["-nkvo", "1"], cpu_mask=None, **kw) == METHOD_BENCH
    assert screen_method(None, base_args=[], cpu_mask=(0, 1), **kw) == METHOD_BENCH
    assert screen_method(None, base_args=[], cpu_mask=None, custom_measure=True, **kw) == METHOD_BENCH
    assert screen_method(METHOD_KERNEL, base_args=["-nkvo", "1"], cpu_mask=(0,), **kw) == METHOD_KERNEL
    with pytest.raises(UsageError, match="no kernel to force"):
        screen_method(METHOD_KERNEL, base_args=[], cpu_mask=None, **{**kw, "has_kernels": False})
    with pytest.raises(UsageError, match=r"gfx1151 \(amd\)"):
        screen_method(
            METHOD_KERNEL, base_args=[], cpu_mask=None, **{**kw, "target": resolve_target("gfx1151", dry_run=True)}
        )


def test_the_plan_refines_only_with_the_llama_bench_screen(dry_tree: None) -> None:
    def stages(screen: str) -> list[str]:
        args = ["search", "--arch", "sm_90", "--like", LIKE, "--dry-run", "--json", "--screen", screen]
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, (res.stderr, res.exception)
        return [s["stage"] for s in json.loads(res.stdout)["plan"]["stages"]]

    assert "screen: refine" in stages("llama-bench")
    assert "screen: refine" not in stages("auto")  # the op level: the confirm places boundaries


def test_the_plan_counts_the_tune_knobs_and_depths_asked_for(dry_tree: None) -> None:
    args = ["search", "--arch", "sm_90", "--like", LIKE, "--dry-run", "--json", "--trials", "30"]
    focus = ["--tune-knobs", "mma.ampere.d64.c8.*", "--tune-depths", "32768,65536"]

    def tune(screen: str) -> dict:
        res = CliRunner().invoke(cli, [*args, *focus, "--screen", screen])
        assert res.exit_code == 0, (res.stderr, res.exception)
        (stage,) = [s for s in json.loads(res.stdout)["plan"]["stages"] if s["stage"] == "tune"]
        return stage

    bench = tune("llama-bench")
    assert "over 8 knob(s) (8 compile-time, 0 process-wide)" in bench["what"] and "at 2 depths" in bench["what"]
    assert bench["llama_bench_calls"] == [60, 60]  # decode rows: one phase, two calls a trial
    op = tune("auto")  # the op-level screen: config-row trials are timed there too, two cases a process
    assert "timed at the op level" in op["what"] and "2 cases each" in op["what"]
    assert op["llama_bench_calls"] == [0, 0] and op["seconds"][1] < bench["seconds"][1]
