"""Every output tells the truth, and pipes: data on stdout, progress on stderr (issue 27).

The dry run's plan, --replay's tables, archs/estimate --json; the removed options; one spelling of
-o; XDG_CACHE_HOME; --help texts without a literal ``%%``.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.conftest import use_render_tree
from tuner.cli import _COMMANDS, cli

REPO = Path(__file__).resolve().parents[3]


def _section(md: str, title: str) -> list[str]:
    """The table rows of the Markdown section whose heading starts with ``title``."""
    part = md.split("## " + title, 1)[1].split("\n## ", 1)[0]
    return [ln for ln in part.splitlines() if ln.startswith("| ") and not ln.startswith("| variant")]


def _run(args: list[str]) -> click.testing.Result:
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.fixture()
def dry_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run on the test tree, on a machine without the HIP toolchain (nothing may compile)."""
    import tuner.builder.cmake
    import tuner.builder.hip

    use_render_tree(monkeypatch)
    monkeypatch.setattr(tuner.builder.hip, "find_hip_toolchain", lambda: None)

    def no_build(*a: object, **k: object) -> None:
        raise AssertionError("a skipped compile check must not compile")

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", no_build)


# ---------------------------------------------------------------- search --dry-run


def test_gfx1151_dry_run_plan_is_the_real_search_on_stdout(dry_tree: None) -> None:
    res = _run(["search", "--arch", "gfx1151", "--dry-run"])
    assert res.exit_code == 0, res.stderr
    plan = res.stdout
    # the stages tuner.search.pipeline.run_pipeline runs, in its order, each with what it runs
    stages = re.findall(
        r"^\| (screen|screen: refine|compose|tune|confirm|output gate|residency|builds \+ test-backend-ops) +\|",
        plan,
        re.M,
    )
    assert stages == [
        "screen",
        "screen: refine",
        "compose",
        "tune",
        "confirm",
        "output gate",
        "residency",
        "builds + test-backend-ops",
    ]
    # the kernels the gfx1151 space lets the screen force per phase (its rule knobs' choices)
    from tuner.plan.space import load_space
    from tuner.search.context import kernels_for

    space = load_space("gfx1151", "mma")
    assert f"decode: upstream vs {', '.join(kernels_for(space, 'tg'))}" in plan
    assert f"prefill: upstream vs {', '.join(kernels_for(space, 'pp'))}" in plan
    # not the old one-sampler plan
    assert "runtime trials ×" not in plan and "× 40" not in plan
    # the estimate names its machine and data file, and its total is the sum of the stages' times
    assert "ESTIMATE" in plan and "NVIDIA H100" in plan and "tuner/data/step_costs.toml" in plan
    # skipped compile checks are marked skipped with the reason, and no ✓ claims they ran
    checks = _section(plan, "Compile checks")
    assert len(checks) == 3 and all("| skipped |" in ln and "tuner toolchain hip" in ln for ln in checks)
    assert "skipped" in res.stderr and "✓" not in re.sub(r"==> Constraint.*\n.*\n", "", res.stderr)
    # readable text: no Python dict/list reprs in the tables
    assert not re.search(r"\{'|\['|': ", plan), plan
    # progress stays off stdout
    assert "==>" not in plan and "==> Constraint-checking" in res.stderr


def test_dry_run_json_parses_and_totals_add_up(dry_tree: None) -> None:
    res = _run(["search", "--arch", "gfx1151", "--dry-run", "--json", "--trials", "2", "--depths", "0,4096"])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    p = data["plan"]
    timed = [s["seconds"] for s in p["stages"] if s["seconds"] is not None]
    assert p["estimated_minutes"] == [round(sum(t[0] for t in timed) / 60, 1), round(sum(t[1] for t in timed) / 60, 1)]
    tune = next(s for s in p["stages"] if s["stage"] == "tune")
    assert tune["what"].startswith("2 Optuna trial(s)") and "at 2 depths" in tune["what"]
    assert all(c["status"] == "skipped" and c["why"] for c in data["compile_checks"])


def test_step_costs_cite_files_in_the_repo() -> None:
    from tuner.rounds.budget import load_step_costs

    costs = load_step_costs()
    srcs = [costs["full_build"]["source"]] + [
        m[k]
        for part in ("models", "confirm", "confirm_batch")
        for m in costs[part].values()
        for k in m
        if k.endswith("source")
    ]
    for s in srcs:
        path = s.split(":")[0].split(" (")[0]
        assert (REPO / path).is_file(), s


# ---------------------------------------------------------------- --replay, archs, estimate


def test_replay_tables_on_stdout_and_json() -> None:
    files = [str(p) for p in sorted((REPO / "tests" / "data" / "replay").glob("*.jsonl"))]
    res = _run(["search", "--replay", "--max-rounds", "4", *files])
    assert res.exit_code == 0, res.stderr
    assert "| REPLAY" in res.stdout and "depth winners reproduced" in res.stdout
    assert "| REPLAY" not in res.stderr and "nothing is measured now" in res.stderr
    data = json.loads(_run(["search", "--replay", "--json", "--max-rounds", "4", *files]).stdout)
    assert set(data) == {"tg", "pp"} and data["tg"]["n"] >= 1


def test_json_without_a_report_is_a_usage_error() -> None:
    from tuner.errors import UsageError

    res = CliRunner().invoke(cli, ["search", "--json"])
    assert isinstance(res.exception, UsageError) and "--json prints the report" in str(res.exception)


def test_archs_and_estimate_json_parse() -> None:
    archs = json.loads(_run(["archs", "--json"]).stdout)
    assert any(a["name"] == "gfx1151" for a in archs)
    one = json.loads(_run(["archs", "show", "gfx1151", "--json"]).stdout)
    assert one["name"] == "gfx1151"
    rows = json.loads(
        _run(["estimate", "--arch", "sm_90", "--like", "llama-3.2-1b", "--quant", "Q4_K_M", "--json"]).stdout
    )
    assert rows and all("not a measurement" in r["label"] for r in rows)
    # --quant is case-insensitive and the old --type still means the same
    old = json.loads(
        _run(["estimate", "--arch", "sm_90", "--like", "llama-3.2-1b", "--type", "q4_k_m", "--json"]).stdout
    )
    assert old == rows
    assert "--type" not in _run(["estimate", "--help"]).stdout


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("cmd", ["search", "worker"])
@pytest.mark.parametrize("opt", ["--profile", "--target-ci", "--max-reps"])
def test_dead_search_options_are_gone(cmd: str, opt: str) -> None:
    res = CliRunner().invoke(cli, [cmd, opt, "1"])
    assert res.exit_code == 2 and f"No such option '{opt}'" in res.output


def _all_commands() -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [()]
    ctx = click.Context(cli)
    for name in _COMMANDS:
        cmd = cli.get_command(ctx, name)
        out.append((name,))
        if isinstance(cmd, click.Group):
            out += [(name, sub) for sub in cmd.list_commands(click.Context(cmd))]
    return out


@pytest.mark.parametrize("path", _all_commands(), ids=lambda p: " ".join(p) or "tuner")
def test_help_has_no_literal_double_percent(path: tuple[str, ...]) -> None:
    res = _run([*path, "--help"])
    assert res.exit_code == 0 and "%%" not in res.stdout, res.stdout


def test_one_spelling_of_output() -> None:
    """Every command that writes a file or folder spells it -o/--output; old long names stay as hidden aliases."""
    for path in _all_commands():
        text = _run([*path, "--help"]).stdout
        if re.search(r"^\s+-o,", text, re.M):
            assert re.search(r"^\s+-o, --output\b", text, re.M), (path, text)
    res = CliRunner().invoke(cli, ["search", "--export", "x", "--dry-run", "--arch", "nope"])
    assert "No such option" not in res.output


# ---------------------------------------------------------------- cache folder


def test_xdg_cache_home_is_honoured_and_tuner_home_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.paths import tuner_home

    monkeypatch.delenv("TUNER_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuner_home() == tmp_path / "xdg" / "tuner"
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "th"))
    assert tuner_home() == tmp_path / "th"
    # a relative XDG_CACHE_HOME is invalid per the XDG spec: the default applies
    monkeypatch.delenv("TUNER_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", "rel")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert tuner_home() == tmp_path / "h" / ".cache" / "tuner"


def test_dashboard_hint_names_the_extra_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from tuner.cli import export_cmd

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "optuna_dashboard" else real(n, *a))
    hint = export_cmd.dashboard_hint("sqlite:///x.db")
    assert "pip install -e '.[dashboard]'" in hint and "open it live" not in hint
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object())
    from tuner.result.report import dashboard_command

    assert export_cmd.dashboard_hint("sqlite:///x.db") == f"open it live with: {dashboard_command('sqlite:///x.db')}"
    # a password never reaches the hint (PGPASSWORD or ~/.pgpass supplies it)
    assert "secret" not in export_cmd.dashboard_hint("postgresql://u:secret@h/db")


def test_dry_run_with_compile_checks_reads_as_text_and_uses_the_measured_rebuild(
    dry_tree: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the toolchain present the compile checks run (faked here: nothing compiles in a unit test);
    their detail is words, not the list/dict values they carry, and the plan's rebuild time is theirs."""
    import tuner.builder.cmake
    import tuner.builder.hip

    monkeypatch.setattr(tuner.builder.hip, "find_hip_toolchain", lambda: object())

    def fake_build(rv: object, *, compile_only: bool, objects: list[str]) -> types.SimpleNamespace:
        assert compile_only
        return types.SimpleNamespace(seconds=12.5, meta={"offload_targets": {o: ["gfx1151"] for o in objects}})

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", fake_build)
    res = _run(["search", "--arch", "gfx1151", "--dry-run", "--trials", "2"])
    assert res.exit_code == 0, res.stderr
    rows = _section(res.stdout, "Compile checks")
    assert len(rows) == 3 and all("| ok " in ln and "device code" in ln for ln in rows)
    assert "5 object(s) with gfx1151 device code" in rows[0] and "knob values" in rows[0]
    assert not re.search(r"\{'|\['|': ", res.stdout)
    assert "12.5 s a rebuild (this dry run's compile check" in res.stdout
    assert "the rebuild time is this machine's compile check" in res.stdout
    data = json.loads(_run(["search", "--arch", "gfx1151", "--dry-run", "--json", "--trials", "2"]).stdout)
    builds = next(s for s in data["plan"]["stages"] if s["stage"] == "builds + test-backend-ops")
    assert builds["seconds"] is not None and builds["seconds"][1] > builds["seconds"][0]


def test_dry_run_plan_leaves_pinned_knobs_out_of_the_tune_stage(dry_tree: None) -> None:
    from tuner.plan.space import load_space
    from tuner.search import tune as tn

    # the plan's model (the GPU default, llama-3.2-1b) has head size 64: rows of other head sizes are not sampled
    n = len(tn.tunable_knobs(load_space("gfx1151", "mma"), {}, head_dim=64))
    assert n < len(tn.tunable_knobs(load_space("gfx1151", "mma"), {}))

    def tune_what(*extra: str) -> str:
        data = json.loads(_run(["search", "--arch", "gfx1151", "--dry-run", "--json", *extra]).stdout)
        return next(s["what"] for s in data["plan"]["stages"] if s["stage"] == "tune")

    assert f"over {n} knob(s)" in tune_what()
    assert f"over {n - 1} knob(s)" in tune_what("--set", "tile.amd_rdna.d64.c4.nthreads=128")


def test_dry_run_plans_for_the_model_given(dry_tree: None, tmp_path: Path) -> None:
    """--model's own shape sets the plan: its context length caps the default depths (as the real search's
    request cuts them, tuner.search.request.plan_search), and the plan names it."""
    from tuner.targets.models import load_models, synth_model

    data = REPO / "tests" / "data" / "models"
    shape = load_models(data / "micro_models.toml")["micro"]
    gguf = synth_model(shape, tmp_path / "micro.gguf", vocab_path=data / "vocab-micro.gguf").path
    res = _run(["search", "--arch", "gfx1151", "--dry-run", "--json", "--model", str(gguf)])
    assert res.exit_code == 0, res.stderr
    plan = json.loads(res.stdout)["plan"]
    assert plan["model"] == "micro.gguf"
    screen = next(s for s in plan["stages"] if s["stage"] == "screen")
    kept = [d for d in (0, 4096, 8192, 16384, 32768, 65536) if d <= shape.context_length]
    assert f"{len(kept)} depths {kept}" in screen["what"]


def test_validate_marks_skipped_checks_as_not_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tuner.result.validate as rv

    fake = [
        rv.ResultCheck(
            path=tmp_path / "r",
            findings=(
                rv.Finding(check="hashes", ok=True, detail="patch and defines match"),
                rv.Finding(
                    check="bench",
                    ok=True,
                    detail="skipped: needs a sm_90 device, this machine has none (static checks only)",
                ),
                rv.Finding(check="gate", ok=False, detail="fails"),
            ),
        )
    ]
    monkeypatch.setattr(rv, "validate_paths", lambda *a, **k: fake)
    res = CliRunner().invoke(cli, ["validate", str(tmp_path)])
    out = res.stdout
    assert "✓ hashes" in out and "- bench: skipped" in out and "✕ gate" in out and "✓ bench" not in out
    assert res.exit_code == 1
