"""Upstream's llama-bench probed once per study on an AMX host (search/pipeline.repack_probe): where it dies in
llama.cpp's AMX kernels (SIGILL, as on the CI's VM, or SIGSEGV) and runs with --repack 0, every config of the
study is measured with --repack 0, the study records it (a resume does not probe again), and the export's
commands carry it; elsewhere nothing changes. llama-bench is faked; the real run is the README's main job."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest

from tests.unit.search.conftest import search_run
from tuner.result.export import server_args
from tuner.rounds.budget import Budget, BudgetReached
from tuner.search import pipeline


class FakeStudy:
    def __init__(self) -> None:
        self.user_attrs: dict[str, object] = {}

    def set_user_attr(self, k: str, v: object) -> None:
        self.user_attrs[k] = v


def _run(tmp_path: Path, study: FakeStudy, arch: str = "cpu"):
    cfg = types.SimpleNamespace(
        target=types.SimpleNamespace(arch=types.SimpleNamespace(name=arch)), run_dir=tmp_path, model=tmp_path / "m.gguf"
    )
    return search_run(cfg, study, base_args=("-t", "2"), base_env={"GGML_X": "1"}, custom=None)


@pytest.fixture
def amx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    (tmp_path / "llama-bench").write_text("")  # a build that has one (the probe skips a build without)

    def runs(bin_dir: Path, model: Path, args: list[str], env: dict[str, str], log_file: Path) -> int:
        assert env == {"GGML_X": "1"}  # upstream's runtime: its pinned env with its pinned args
        calls.append(args)
        return 0 if "--repack" in args else -4  # SIGILL in the AMX kernels unless the weights stay as they are

    monkeypatch.setattr(pipeline, "host_has_amx", lambda: True)
    monkeypatch.setattr(pipeline, "_runs", runs)
    return calls


def test_upstream_dying_in_the_amx_kernels_is_measured_with_repack_0_once_per_study(
    tmp_path: Path, amx: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    study = FakeStudy()
    build = types.SimpleNamespace(bin_dir=tmp_path)
    run = pipeline.repack_probe(_run(tmp_path, study), build)
    assert run.base_args == ("-t", "2", "--repack", "0") and run.host_args == ("--repack", "0")
    assert amx == [["-t", "2"], ["-t", "2", "--repack", "0"]] and "died of SIGILL" in capsys.readouterr().err
    # the study records it: a resumed search measures the same way without probing again
    again = pipeline.repack_probe(_run(tmp_path, study), build)
    assert again.base_args == run.base_args and len(amx) == 2
    # and the export's llama-server command says it as the server spells it
    assert server_args(["-t", "2", "--repack", "0"]) == ["-t", "2", "--no-repack"]


def test_a_host_where_upstream_runs_or_without_amx_or_not_the_cpu_is_left_as_it_is(
    tmp_path: Path, amx: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    build = types.SimpleNamespace(bin_dir=tmp_path)
    for arch in ("sm_90",):
        assert pipeline.repack_probe(_run(tmp_path, FakeStudy(), arch), build).host_args == ()
    monkeypatch.setattr(pipeline, "_runs", lambda *a: 0)
    study = FakeStudy()
    run = pipeline.repack_probe(_run(tmp_path, study), build)
    assert run.base_args == ("-t", "2") and study.user_attrs["host_args"] == []
    monkeypatch.setattr(pipeline, "host_has_amx", lambda: False)
    assert pipeline.repack_probe(_run(tmp_path, FakeStudy()), build).host_args == ()


def test_a_study_recording_other_host_args_is_refused(tmp_path: Path, amx: list[list[str]]) -> None:
    """The stored value reaches llama-bench's argv on resume and run.env on export: only what the probe writes."""
    from tuner.errors import UsageError

    study = FakeStudy()
    study.user_attrs["host_args"] = ["-o", "/etc/passwd"]
    with pytest.raises(UsageError, match="which tuner never writes"):
        pipeline.repack_probe(_run(tmp_path, study), types.SimpleNamespace(bin_dir=tmp_path))
    assert amx == []


def test_the_probe_starts_only_where_its_price_fits_the_time_budget(tmp_path: Path, amx: list[list[str]]) -> None:
    """--time-budget: nothing starts that would end past it; a rerun with time left probes as usual."""
    study, build = FakeStudy(), types.SimpleNamespace(bin_dir=tmp_path)
    spent = dataclasses.replace(_run(tmp_path, study), budget=Budget.counted_from(None, 0.5))
    with pytest.raises(BudgetReached, match="the llama-bench probe of llama.cpp's AMX kernels"):
        pipeline.repack_probe(spent, build)
    assert amx == [] and "host_args" not in study.user_attrs
    assert pipeline.repack_probe(_run(tmp_path, study), build).host_args == ("--repack", "0")
