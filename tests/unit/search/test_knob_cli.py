"""Bad config-only knob input on the CLI: one paragraph and exit 2 before anything is built or measured."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli, main
from tuner.rounds.budget import BudgetReached
from tuner.search import pipeline
from tuner.targets import archs

DATA = Path(__file__).resolve().parents[2] / "data" / "models"
N_CPUS = len(os.sched_getaffinity(0))


@pytest.fixture()
def micro_model(tmp_path: Path) -> Path:
    from tuner.targets.models import load_models, synth_model

    shape = load_models(DATA / "micro_models.toml")["micro"]  # 2 layers: -ngl 0..3
    return synth_model(shape, tmp_path / "micro.gguf", vocab_path=DATA / "vocab-micro.gguf").path


@pytest.fixture()
def no_measuring(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list:
    """A cached-looking source; run_pipeline records the config it got and stops (nothing runs)."""
    seen: list = []
    monkeypatch.setattr("tuner.source.fetch_source", lambda spec=None: types.SimpleNamespace(era="mma", spec=spec))

    def stop(cfg: object, **kw: object) -> None:  # kw: the CLI's export callback
        seen.append(cfg)
        raise BudgetReached("test")

    monkeypatch.setattr(pipeline, "run_pipeline", stop)
    monkeypatch.chdir(tmp_path)
    return seen


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``tuner ARGS`` through ``tuner.cli.main`` (which maps a budget stop to exit 3): its status and stderr."""
    monkeypatch.setattr(sys, "argv", ["tuner", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def _search(*args: str) -> object:
    return CliRunner().invoke(cli, ["search", *args], standalone_mode=False)


def _refused(res: object, *says: str) -> str:
    err = res.exception  # type: ignore[attr-defined]
    assert err is not None and getattr(err, "exit_code", None) == 2, res.output  # type: ignore[attr-defined]
    msg = str(err)
    assert "\n" not in msg and all(s in msg for s in says), msg
    return msg


@pytest.mark.parametrize(
    ("mask", "says"),
    [("0-99999", "does not have"), ("a", "not a CPU list"), ("3-1", "empty"), (f"{N_CPUS}", "does not have")],
)
def test_search_refuses_a_bad_cpu_mask(mask: str, says: str, no_measuring: list) -> None:
    _refused(_search("--arch", "cpu", "--cpu-mask", mask), says)
    assert not no_measuring


@pytest.mark.parametrize("threads", ["0", "-2", str(N_CPUS + 1)])
def test_search_refuses_threads_outside_the_machine(threads: str, micro_model: Path, no_measuring: list) -> None:
    _refused(_search("--arch", "cpu", "--model", str(micro_model), "--set", f"threads={threads}"), f"1..{N_CPUS}")
    assert not no_measuring


def test_search_refuses_more_threads_than_the_mask(micro_model: Path, no_measuring: list) -> None:
    _refused(
        _search("--arch", "cpu", "--model", str(micro_model), "--cpu-mask", "0", "--set", "threads=2"),
        "1..1",
        "--cpu-mask 0",
    )
    assert not no_measuring


def test_search_refuses_ngl_above_the_layer_count(
    micro_model: Path, no_measuring: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archs, "detect_local_archs", lambda: ["sm_90"])
    _refused(_search("--arch", "sm_90", "--model", str(micro_model), "--set", "ngl=99"), "0..3", "2 layers")
    assert not no_measuring


def test_good_pins_and_the_mask_reach_the_pipeline(
    micro_model: Path, no_measuring: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archs, "detect_local_archs", lambda: ["sm_90"])
    res = _search(
        "--arch", "sm_90", "--model", str(micro_model), "--cpu-mask", "0", "--set", "ngl=3", "--set", "threads=1"
    )
    assert isinstance(res.exception, BudgetReached), res.output  # type: ignore[attr-defined]  # the fake's stop
    cfg = no_measuring[0]
    assert cfg.cpu_mask == (0,) and dict(cfg.fixed) == {"ngl": "3", "threads": "1"}


def test_a_search_the_budget_stopped_exits_3(
    micro_model: Path, no_measuring: list, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(archs, "detect_local_archs", lambda: ["sm_90"])
    code, err = run_main(monkeypatch, capsys, "search", "--arch", "sm_90", "--model", str(micro_model))
    assert code == 3 and no_measuring, err  # a script must not take it for a finished search
    assert "note: time budget reached" in err and "Rerun the same command to resume" in err and "error" not in err


def test_bench_refuses_a_bad_mask_and_threads_beyond_it(tmp_path: Path, micro_model: Path) -> None:
    b = tmp_path / "build" / "bin"
    b.mkdir(parents=True)
    (b / "llama-bench").write_text("#!/bin/sh\nexit 1\n")  # never started: the checks come first
    (b / "llama-bench").chmod(0o755)
    base = ["bench", "--build", str(b), "--model", str(micro_model), "--depths", "0", "-o", str(tmp_path / "out")]
    _refused(CliRunner().invoke(cli, [*base, "--cpu-mask", "0,99999"], standalone_mode=False), "does not have")
    _refused(CliRunner().invoke(cli, [*base, "--cpu-mask", "0", "--", "-t", "2"], standalone_mode=False), "1..1")
    _refused(CliRunner().invoke(cli, [*base, "--", "-t", "0"], standalone_mode=False), f"1..{N_CPUS}")
    assert not (tmp_path / "out").exists()
