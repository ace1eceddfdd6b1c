"""``tuner validate --gpu --pack/--from-pack`` of a sweep table: the patched build made and packed on a machine
without the GPU, installed from the pack on the GPU machine, where test-backend-ops runs on it.

The compiler and the GPU runs are fakes (the build's files are those of tests/unit/builder/test_carry.py); the
pack and its install are tuner.builder.carry's own. tests/integration/test_build_carry_cpu.py carries a real
build."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.unit.builder.test_carry import fake_build
from tests.unit.sweep.test_sweep_export import _confirmed, _export, _fake_source
from tuner.cli.export_cmd import validate
from tuner.errors import TunerError, UsageError
from tuner.plan.variant import Build


def _fakes(monkeypatch: pytest.MonkeyPatch, *, gpu: bool, ran: list[Path]) -> None:
    """This machine: an sm_90 GPU or none; builds leave test_carry's fake files, and a build whose artifact
    exists (a carried one) is cached; test-backend-ops passes and records the bin dir it ran from."""
    import tuner.builder.cmake
    import tuner.measure.gate
    import tuner.plan.render
    import tuner.result.upstream_check
    import tuner.targets.archs
    from tuner.paths import tuner_home

    monkeypatch.setattr(tuner.targets.archs, "detect_local_archs", lambda: ["sm_90"] if gpu else [])
    monkeypatch.setattr(tuner.plan.render, "render_variant", lambda *a, **k: types.SimpleNamespace(defines={}))
    monkeypatch.setattr(tuner.result.upstream_check, "patched_tree_text", lambda *a: {})
    monkeypatch.setattr(tuner.result.upstream_check, "find_ncu", lambda: None)  # the kernel read: tested on its own

    def build(rv: Any, targets: Any = ()) -> Build:
        art = tuner_home() / "builds" / rv.key / "artifacts" / rv.artifact_key
        if art.is_dir():
            return Build(build_id="b", build_dir=art.parent, bin_dir=art / "bin", log_file=art, cached=True, seconds=0)
        if gpu:
            raise TunerError("no compiler on the GPU machine (the test's premise: only the pack can give the build)")
        return fake_build(tuner_home(), rv)

    def check(bin_dir: Path, **kw: Any) -> Any:
        ran.append(bin_dir)
        return types.SimpleNamespace(passed=True, summary="2/2 tests passed", log_file=kw["log_dir"] / "x.log")

    monkeypatch.setattr(tuner.builder.cmake, "build_variant", build)
    monkeypatch.setattr(tuner.measure.gate, "run_check", check)


def _validate(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(validate, list(args), standalone_mode=False)
    if isinstance(res.exception, TunerError):
        return res.exception.exit_code, str(res.exception)
    if isinstance(res.exception, SystemExit):  # a failed check: validate's own exit 1
        return int(res.exception.code or 0), res.output
    assert res.exception is None, res.exception
    return 0, res.output


def test_a_table_build_packed_without_the_gpu_runs_its_tests_on_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_source(tmp_path, monkeypatch)
    table = _export(tmp_path, _confirmed(tmp_path))
    assert (table / "upstream.patch").is_file()
    pack, ran = tmp_path / "carry" / "table.tar.xz", []
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "builder"))
    _fakes(monkeypatch, gpu=False, ran=ran)
    code, out = _validate("--gpu", "--pack", str(pack), str(table))
    assert code == 0, out
    assert "build packed" in out and f"--from-pack {pack} {table}" in out and "skipped: needs a sm_90 GPU" in out
    assert pack.is_file() and ran == []
    # the GPU machine: no compiler (the fake refuses to build), its own TUNER_HOME
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "gpu"))
    _fakes(monkeypatch, gpu=True, ran=ran)
    code, out = _validate("--gpu", str(table))
    assert code == 1 and "no compiler on the GPU machine" in out  # without the pack: a failed check
    code, out = _validate("--gpu", "--from-pack", str(pack), "--log-dir", str(tmp_path / "logs"), str(table))
    assert code == 0, out
    assert "upstream.patch builds: carried" in out and "test-backend-ops FLASH_ATTN_EXT: 2/2 tests passed" in out
    assert ran and all(str(b).startswith(str(tmp_path / "gpu")) for b in ran)  # the tests ran the installed build


def test_pack_options_refuse_what_they_cannot_carry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_source(tmp_path, monkeypatch)
    table = _export(tmp_path, _confirmed(tmp_path))
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    _fakes(monkeypatch, gpu=True, ran=[])
    code, out = _validate("--pack", str(tmp_path / "p.tar.xz"), str(table))
    assert code == 2 and "belong to --gpu" in out
    code, out = _validate("--gpu", "--pack", str(tmp_path / "p.tar.xz"), str(tmp_path / "results"), str(table))
    assert code == 2 and "pass exactly one path, the table's folder" in out
    both = ("--gpu", "--pack", str(tmp_path / "a.tar.xz"), "--from-pack", str(tmp_path / "b.tar.xz"), str(table))
    code, out = _validate(*both)
    assert code == 2 and "two ends of one carry" in out
    # a pack of another build (here: a build of another patch) is bad input, not a failed check
    from tests.unit.builder.test_carry import make_rv
    from tuner.builder import carry

    other = make_rv()
    carry.pack_build(fake_build(tmp_path / "home", other), other, tmp_path / "other.tar.xz", spec="fake:tree")
    with pytest.raises(UsageError):
        CliRunner().invoke(
            validate, ["--gpu", "--from-pack", str(tmp_path / "other.tar.xz"), str(table)],
            standalone_mode=False, catch_exceptions=False,
        )  # fmt: skip
