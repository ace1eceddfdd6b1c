"""``tuner search --dry-run`` plans the run that will happen: the request the real run resolves (one code path,
:func:`tuner.search.request.plan_search`), compile checks of what the variant builds, this machine's recorded
prices and the model step priced, and every refusal of the real run made by the dry run too."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.conftest import use_render_tree
from tuner.cli import cli
from tuner.errors import TunerError


class _Reached(Exception):
    """The real run got past its checks (to the model step or a build): it did not refuse."""


def _no_build(*a: object, **k: object) -> None:
    raise _Reached("a build started")


@pytest.fixture()
def tree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The render test tree, no GPU detected, nothing built, no model made, a fresh TUNER_HOME and run dir."""
    import tuner.builder.cmake
    import tuner.search.request
    import tuner.targets.archs

    use_render_tree(monkeypatch)
    monkeypatch.setattr(tuner.targets.archs, "detect_local_archs", lambda: [], raising=False)
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TUNER_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(tuner.builder.cmake, "build_variant", _no_build)

    def no_model(*a: object, **k: object) -> None:
        raise _Reached("the model step started")

    monkeypatch.setattr(tuner.search.request, "_model", no_model)


def _dry(args: list[str]) -> Any:
    return CliRunner().invoke(cli, ["search", "--dry-run", "--json", *args])


def _resolved(args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The SearchConfig the real `tuner search ARGS` resolves (its model step faked: a file of the planned shape's
    name, the shape's context length), captured before the pipeline starts."""
    import tuner.cli.export_cmd
    import tuner.search.request as rq

    got: dict[str, Any] = {}

    def model(request: Any, planned: Any, source: Any, budget: Any) -> tuple[Path, float]:
        f = tmp_path / f"{planned.like}.gguf"
        f.write_bytes(b"")
        return f, 0.0

    monkeypatch.setattr(rq, "_model", model)
    monkeypatch.setattr(rq, "_check_pins", lambda *a, **k: None)  # reads the (fake) GGUF

    def capture(request: Any, out: Any = None) -> object:
        got["cfg"] = rq.resolve_search(request)
        got["request"] = request
        return object()

    monkeypatch.setattr(tuner.cli.export_cmd, "search_and_export", capture)
    res = CliRunner().invoke(cli, ["search", *args])
    assert res.exit_code == 0, (res.output, res.exception)
    return got


@pytest.mark.parametrize(
    "args", [["--arch", "cpu"], ["--arch", "sm_90"], ["--like", "llama-3.2-1b", "--depths", "0,4096"]]
)
def test_the_dry_run_plans_the_request_the_real_run_resolves(
    tree: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]
) -> None:
    import tuner.builder.cmake
    import tuner.targets.archs

    if "sm_90" in args:  # the real run tunes a GPU that is here
        monkeypatch.setattr(tuner.targets.archs, "detect_local_archs", lambda: ["sm_90"])
    # a compile check that runs (the CPU one) passes here; nothing compiles in a unit test
    monkeypatch.setattr(
        tuner.builder.cmake, "build_variant", lambda rv, **k: types.SimpleNamespace(seconds=1.0, meta={})
    )
    res = _dry(args)
    assert res.exit_code == 0, (res.output, res.exception)
    plan = json.loads(res.stdout)
    got = _resolved(args, monkeypatch, tmp_path)
    cfg, request = got["cfg"], got["request"]
    asked = plan["plan"]["request"]
    for k in ("pp", "tg", "trials", "min_rounds", "max_rounds", "refine", "confirm_extra", "reps_pp", "reps_tg"):
        assert asked[k] == getattr(cfg, k), k
    assert asked["depths"] == list(cfg.depths) and asked["screen_method"] == cfg.screen_method
    assert (asked["variants"] or None) == (list(cfg.variants) if cfg.variants else None)
    # the model the real run makes: its defaults' shape where --like is not given
    assert plan["plan"]["model"] == cfg.model.stem == (request.like or request.defaults.like)
    # the stages are of those settings: the screen's depths and rounds, the variants compile-checked
    screen = next(s for s in plan["plan"]["stages"] if s["stage"] == "screen")
    assert f"{list(cfg.depths)}" in screen["what"] and f"× {cfg.min_rounds}-{cfg.max_rounds} rounds" in screen["what"]
    if cfg.variants:
        assert [c["variant"] for c in plan["compile_checks"]] == [v for v in plan["variants"] if v in cfg.variants]


@pytest.mark.parametrize(
    "args",
    [
        ["--quant", "q4km"],
        ["--model", "/no/such/model.gguf"],
        ["--like", "no-such-shape"],
        ["--like", "llama-3.2-1b", "--model", "/no/such/model.gguf"],
        ["--like", "llama-3.2-1b", "--depths", "0,99999999"],
        ["--like", "llama-3.2-1b", "--tune-depths", "99999999"],
        ["--variant", "no-such-variant"],
        ["--storage", "mysql://h/db"],
        ["--arch", "sm_1"],
        ["--trials", "-1"],
        ["--depths", "0,abc"],
        ["--max-rounds", "1"],
    ],
)
def test_the_dry_run_refuses_what_the_real_run_refuses(tree: None, args: list[str]) -> None:
    """Same exit status, same paragraph; the real run refuses before the model step or any build."""
    real = CliRunner().invoke(cli, ["search", *args])
    dry = CliRunner().invoke(cli, ["search", "--dry-run", *args])
    assert not isinstance(real.exception, _Reached), real.exception
    if isinstance(real.exception, TunerError):  # tuner's own refusal: raised for tuner.cli's handler (exit 2)
        assert type(dry.exception) is type(real.exception) and real.exception.exit_code == 2
        assert str(dry.exception) == str(real.exception)
    else:  # click's parameter check
        assert real.exit_code == dry.exit_code == 2
        assert real.output.strip().splitlines()[-1] == dry.output.strip().splitlines()[-1]


def test_quant_names_are_checked_before_anything_runs(tree: None) -> None:
    from tuner.errors import UsageError
    from tuner.search.request import SearchRequest, plan_search
    from tuner.targets.quant_types import QUANT_TYPES
    from tuner.targets.target import resolve_target

    target = resolve_target("cpu", dry_run=True)
    with pytest.raises(UsageError, match="Did you mean") as e:
        plan_search(SearchRequest(target=target, quant="q4km"))
    assert "Q4_K_M" in str(e.value)
    for q in (*QUANT_TYPES, "f16", QUANT_TYPES[0].lower()):
        assert plan_search(SearchRequest(target=target, quant=q)).quant in (None, q)


def test_the_cpu_compile_check_compiles_the_cpu_backend_and_a_failure_is_exit_1(
    tree: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import shutil

    import tuner.builder.cmake
    import tuner.source
    from tuner.search.plan_here import CPU_CHECK_OBJECTS

    # the render tree with the CPU backend's TUs (the real tree has them; the test tree has CUDA's only)
    root = tmp_path / "tree"
    shutil.copytree(tuner.source.fetch_source().root, root)
    for o in CPU_CHECK_OBJECTS:
        (root / o).parent.mkdir(parents=True, exist_ok=True)
        (root / o).write_text("")
    src = tuner.source.fetch_source()
    monkeypatch.setattr(
        tuner.source, "fetch_source", lambda spec=None: types.SimpleNamespace(**{**vars(src), "root": root})
    )

    seen: list[list[str]] = []

    def fake(rv: object, *, compile_only: bool, objects: list[str]) -> types.SimpleNamespace:
        seen.append(list(objects))
        return types.SimpleNamespace(seconds=2.0, meta={})

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", fake)
    ok = _dry(["--arch", "cpu"])
    assert ok.exit_code == 0, (ok.output, ok.exception)
    checks = json.loads(ok.stdout)["compile_checks"]
    assert seen and all(objs == list(CPU_CHECK_OBJECTS) for objs in seen)  # no CUDA translation unit
    assert all(c["status"] == "ok" for c in checks)

    def broken(rv: object, **k: object) -> None:
        raise TunerError("ops.cpp: error: boom")

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", broken)
    bad = CliRunner().invoke(cli, ["search", "--dry-run", "--arch", "cpu"])
    assert isinstance(bad.exception, TunerError) and bad.exception.exit_code == 1
    assert "compile check of cpu failed" in str(bad.exception)
    assert "| failed " in bad.stdout and "✕" in bad.stderr
    assert not re.search(r"Compile-checking cpu .*\n\s+✓", bad.stderr)


def test_a_check_that_cannot_apply_is_not_applicable(tree: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.search.plan_here

    monkeypatch.setattr(tuner.search.plan_here, "CPU_CHECK_OBJECTS", ("ggml/src/ggml-cpu/not-in-this-tree.cpp",))
    res = _dry(["--arch", "cpu"])
    assert res.exit_code == 0, (res.output, res.exception)
    assert [c["status"] for c in json.loads(res.stdout)["compile_checks"]] == ["not applicable"]


def _record(path: Path, device: str, shape: dict[str, int] | None = None, **cost: float) -> None:
    path.parent.mkdir(parents=True)
    body = "\n".join(f"{k} = {v}" for k, v in cost.items())
    dims = "\n".join(f"{k} = {v}" for k, v in (shape or {"head_dim": 64, "n_layers": 2}).items())
    path.write_text(
        f'[target]\narch = "cpu"\nmeasured_on = "{device}"\n\n[model]\ndepths = [0, 1024]\npp = 128\ntg = 32\n\n'
        f"[model.shape]\n{dims}\n\n[cost]\n{body}\n"
    )


def test_prices_recorded_on_this_machine_come_first_and_say_so(tmp_path: Path) -> None:
    from tuner.search.cost import local_prices, this_cpu_device

    _record(tmp_path / "results/cpu/a/config.toml", this_cpu_device(), build_s=400.0, screen_s=30.0, tune_s=10.0,
            confirm_s=20.0, llama_bench_calls=25, model_s=3.0)  # fmt: skip
    _record(tmp_path / "results/cpu/b/config.toml", "CPU backend (other, 64 threads)", build_s=90.0)
    got = local_prices(
        "cpu", this_cpu_device(), shape={"head_dim": 64, "n_layers": 2}, pp=128, tg=32,
        results=tmp_path / "results", runs=tmp_path / "runs",
    )  # fmt: skip
    assert got["full_build"].seconds == 400.0 and got["full_build"].here  # the other machine's 90 s is not taken
    assert got["call_depth"].seconds == round((30.0 + 10.0 + 20.0) / (25 * 2), 2)
    assert got["model"].seconds == 3.0 and "this machine" in got["model"].source
    # another pp/tg prices no llama-bench call from that record
    other = local_prices("cpu", this_cpu_device(), shape={"head_dim": 64}, pp=512, tg=32, results=tmp_path / "results")
    assert "call_depth" not in other
    # a search of the same shape built what this one builds: its build is the price, not a longer one of another model
    _record(tmp_path / "results/cpu/c/config.toml", this_cpu_device(), build_s=900.0, shape={"head_dim": 128})
    assert (
        local_prices(
            "cpu", this_cpu_device(), shape={"head_dim": 64, "n_layers": 2}, pp=128, tg=32, results=tmp_path / "results"
        )["full_build"].seconds
        == 400.0
    )
    assert (
        local_prices("cpu", this_cpu_device(), shape={"head_dim": 32}, pp=128, tg=32, results=tmp_path / "results")[
            "full_build"
        ].seconds
        == 900.0
    )  # no same-shape record: the longest build of this machine


def test_model_synthesis_is_a_priced_line_of_the_plan(tree: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.search.cost import synth_price
    from tuner.targets.models import load_model_shape

    res = _dry(["--arch", "sm_90", "--like", "llama-3.2-1b", "--quant", "Q8_0"])
    assert res.exit_code == 0, (res.output, res.exception)
    plan = json.loads(res.stdout)["plan"]
    model = plan["stages"][0]
    synth, quantize = synth_price(load_model_shape("llama-3.2-1b"), "Q8_0")
    assert model["stage"] == "model" and "llama-quantize it to Q8_0" in model["what"]
    assert quantize is not None and model["seconds"] == [synth.seconds + quantize.seconds] * 2
    assert "recorded on NVIDIA H100" in model["cost"]
    timed = [s["seconds"] for s in plan["stages"] if s["seconds"] is not None]
    assert plan["estimated_minutes"][0] == round(sum(t[0] for t in timed) / 60, 1)  # counted in the total
