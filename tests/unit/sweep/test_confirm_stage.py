"""``tuner sweep confirm`` as stages: a frozen ConfirmRequest planned (plan_confirm) and run (run_confirm) without
click writes what the command writes, and the command prints exactly the stages' texts (fake timings)."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.unit.sweep.test_sweep_confirm import FakeBench, _sweep_dir, passing_check
from tests.unit.sweep.test_sweep_export import _fake_source
from tuner.cli.sweep_cmd import sweep
from tuner.sweep import confirm, confirm_stage
from tuner.sweep.confirm_stage import ConfirmRequest, outcome_text, plan_confirm, run_confirm


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build dir with the tools, a fake tree, models, llama-bench (FakeBench), the gate and test-backend-ops."""
    _fake_source(tmp_path, monkeypatch)
    bins = tmp_path / "bin"
    bins.mkdir()
    for exe in ("llama-bench", "llama-perplexity", "llama-quantize"):
        (bins / exe).write_text("")
    bench = FakeBench(gain=1.10)
    monkeypatch.setattr(confirm_stage, "_same_device", lambda *a: {"device": "GPU X"})
    monkeypatch.setattr(confirm_stage, "make_live_measure", lambda *a, **k: types.SimpleNamespace(joint=bench))
    monkeypatch.setattr(confirm_stage, "synth_cached", lambda like, **k: tmp_path / f"{like}.gguf")
    monkeypatch.setattr(confirm_stage, "load_gguf_tensors", lambda path: [types.SimpleNamespace(ggml_type="Q4_K")])
    real_gate = confirm.gate_model

    def gate(*a: Any, **k: Any) -> Any:
        return real_gate(*a, **{**k, "run_one": passing_check})

    monkeypatch.setattr(confirm, "gate_model", gate)
    ops = {"passed": True, "summary": "1/1 tests passed"}
    monkeypatch.setattr(confirm, "backend_ops_check", lambda b, op, env, log, **k: {**ops, "op": op, "env": dict(env)})
    return bins


def _files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.suffix in (".md", ".patch")}


def test_the_stages_run_without_click_and_the_command_prints_their_texts(tmp_path: Path, fakes: Path) -> None:
    sweep_dir = _sweep_dir(tmp_path)
    request = ConfirmRequest(
        sweep_dir=sweep_dir, likes=("llama-3.2-1b",), depths=(0, 16384, 32768), rounds=3, build_dir=fakes
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.rounds = 4  # type: ignore[misc]
    plan = plan_confirm(request)
    assert plan.likes == ("llama-3.2-1b",) and plan.budget is None and "llama-3.2-1b" in plan.text
    outcome = run_confirm(plan)
    assert outcome.out == sweep_dir / "confirm" == request.out and outcome.patch
    assert [f.text for f in outcome.conf.fates if f.kept] == ["D64 gqa4 f16 ne1 1, n_kv in [16384, inf) -> MMA"]
    assert {r["op"] for r in outcome.backend_ops} == {"FLASH_ATTN_EXT", "MUL_MAT"}
    staged = _files(outcome.out)
    assert set(staged) == {"PR.md", "e2e.md", "upstream.patch"}

    # the command: the same request from flags, the same files, and on stdout the plan then the summary
    args = ["confirm", str(sweep_dir), "--like", "llama-3.2-1b", "--depths", "0,16384,32768", "--rounds", "3"]
    res = CliRunner().invoke(sweep, [*args, "--build", str(fakes)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert res.stdout == plan.text + outcome_text(outcome) + "\n"
    assert _files(outcome.out) == staged
    assert "kept: D64 gqa4 f16 ne1 1" in res.output and f"patch: {outcome.out / 'upstream.patch'}" in res.output


def test_a_build_without_the_tools_is_refused_before_anything_is_measured(tmp_path: Path, fakes: Path) -> None:
    from tuner.errors import UsageError

    (fakes / "llama-perplexity").unlink()
    plan = plan_confirm(ConfirmRequest(sweep_dir=_sweep_dir(tmp_path), likes=("llama-3.2-1b",), build_dir=fakes))
    with pytest.raises(UsageError, match="has no llama-perplexity, which the confirmation needs"):
        run_confirm(plan)
    assert not (tmp_path / "sweep" / "confirm").exists()
