from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

import tuner._run
from tuner._run import RunResult
from tuner.errors import UsageError
from tuner.measure.gate import params_for_model, params_for_shapes, parse_check_output, run_check, run_gate

DATA = Path(__file__).resolve().parents[2] / "data" / "bench"

# file -> (passed, n_ok, n_fail, n_not_supported, n_failing, backend_ran, crashed?)
# Add real H100/ROCm captures here as they are committed.
REAL_TBO = {
    "tbo-mma-cpu-pass-j2.txt": (True, 8, 0, 0, 0, True, False),
    "tbo-mma-skipped.txt": (False, 0, 0, 0, 0, False, False),
    "tbo-mma-fail-crafted.txt": (False, 3, 1, 1, 1, True, False),
    "tbo-rocwmma-fail-crafted.txt": (False, 1, 1, 1, 1, True, False),
    "tbo-crash-crafted.txt": (False, 1, 0, 0, 0, True, True),
}


@pytest.mark.parametrize("name", sorted(REAL_TBO))
def test_parse_fixtures(name: str) -> None:
    passed, ok, fail, ns, nfailing, ran, crashed = REAL_TBO[name]
    r = parse_check_output((DATA / name).read_text())
    assert (r.passed, r.n_ok, r.n_fail, r.n_not_supported, len(r.failing), r.backend_ran) == (
        passed,
        ok,
        fail,
        ns,
        nfailing,
        ran,
    )
    assert bool(r.crashed) == crashed


def test_failing_names_and_interleaved_err_text() -> None:
    r = parse_check_output((DATA / "tbo-mma-fail-crafted.txt").read_text(), backend="CUDA0")
    (name,) = r.failing
    assert name.startswith("FLASH_ATTN_EXT(hsk=64") and "type_K=q8_0" in name and name.endswith(")")
    assert "ERR" not in name
    rb = parse_check_output((DATA / "tbo-rocwmma-fail-crafted.txt").read_text(), backend="ROCm0")
    assert "kv=1024" in rb.failing[0] and "NMSE" not in rb.failing[0]


def test_requested_backend_must_run() -> None:
    text = (DATA / "tbo-mma-cpu-pass-j2.txt").read_text()
    assert parse_check_output(text, backend="CPU").passed
    assert not parse_check_output(text, backend="CUDA0").passed


def test_zero_cases_is_not_a_pass() -> None:
    text = "Testing 1 devices\n\nBackend 1/1: CPU\n  Device description: x\n\n  0/0 tests passed\n  Backend CPU: OK\n"
    r = parse_check_output(text, backend="CPU")
    assert not r.passed and "no case matched" in r.summary


def test_params_for_shapes_selects_any_of_them_in_order_or_every_case() -> None:
    """One ``-p`` for several kept shapes (the confirm's and validate's test-backend-ops), sorted by head size;
    None (every case) where there is none, or where a rule has no head size and so matches them all."""
    line = "FLASH_ATTN_EXT(hsk=256,hsv=256,nh=4,nr23=[2,1],kv=512,nb=1,mask=1,sinks=0,max_bias=0.000000,logit_softcap=0.000000,prec=f32,type_K=f16,type_V=f16,permute=[0,1,2,3])"
    both = params_for_shapes([(256, "f16"), (128, "f16"), (256, "f16")])
    assert both == "(hsk=128,hsv=128,.*type_K=f16,type_V=f16,)|(hsk=256,hsv=256,.*type_K=f16,type_V=f16,)"
    other = params_for_shapes([(128, "f16"), (256, "q8_0")])
    assert re.search(both, line) and other is not None and not re.search(other, line)
    assert params_for_shapes([]) is None and params_for_shapes([(128, "f16"), (None, "f16")]) is None


def test_params_for_model() -> None:
    assert params_for_model(64) == "hsk=64,hsv=64,"
    assert params_for_model(576, "q8_0", head_dim_v=512) == "hsk=576,hsv=512,.*type_K=q8_0,type_V=q8_0,"
    import re

    line = (DATA / "tbo-mma-cpu-pass-j2.txt").read_text()
    assert re.search(params_for_model(64, "f16"), line)
    assert not re.search(params_for_model(640), line)
    with pytest.raises(UsageError, match="Did you mean"):
        params_for_model(64, "q8_O")
    with pytest.raises(UsageError):
        params_for_model(0)


def _fake_bin(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "test-backend-ops"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe.parent


def _fake_run(outputs: dict[str, tuple[str, int]], calls: list[tuple[list[str], dict[str, str]]]):
    def run(cmd, *, env=None, log_file=None, on_line=None, **kw):  # type: ignore[no-untyped-def]
        cmd = [os.fspath(c) for c in cmd]
        calls.append((cmd, dict(env or {})))
        key = (env or {}).get("GGML_TUNER_FA_RULES", "")
        text, rc = outputs.get(key, outputs[""])
        for line in text.splitlines():
            on_line(line)
        return RunResult(returncode=rc, output="", seconds=0.1, log_file=log_file)

    return run


def test_run_check_builds_command_and_aggregates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    text = (DATA / "tbo-mma-fail-crafted.txt").read_text()
    monkeypatch.setattr(tuner._run, "run", _fake_run({"": (text, 1)}, calls))
    r = run_check(
        _fake_bin(tmp_path),
        ops=("FLASH_ATTN_EXT", "MUL_MAT"),
        backend="CUDA0",
        params="hsk=64,",
        jobs=4,
        log_dir=tmp_path / "logs",
    )
    assert len(calls) == 2
    cmd = calls[0][0]
    assert cmd[1:] == ["test", "-o", "FLASH_ATTN_EXT", "-b", "CUDA0", "-p", "hsk=64,", "-j", "4"]
    assert not r.passed and r.n_fail == 2 and r.n_ok == 6 and len(r.failing) == 1
    assert r.log_file == tmp_path / "logs" / "check.log"


def test_run_check_unknown_backend_is_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DATA / "tbo-mma-skipped.txt").read_text()
    monkeypatch.setattr(tuner._run, "run", _fake_run({"": (text, 0)}, []))
    with pytest.raises(UsageError, match="no device 'CUDA0'.*CPU"):
        run_check(_fake_bin(tmp_path), backend="CUDA0", log_dir=tmp_path)


def test_run_check_crash_names_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DATA / "tbo-crash-crafted.txt").read_text()
    monkeypatch.setattr(tuner._run, "run", _fake_run({"": (text, 134)}, []))
    r = run_check(_fake_bin(tmp_path), backend="CUDA0", log_dir=tmp_path)
    assert not r.passed and r.returncode == 134
    assert any("kv=1024,nb=75" in f for f in r.failing) and "died during" in r.summary


def test_run_check_rejects_bad_input(tmp_path: Path) -> None:
    b = _fake_bin(tmp_path)
    with pytest.raises(UsageError):
        run_check(b, backend="CUDA0; rm -rf /", log_dir=tmp_path)
    with pytest.raises(UsageError, match="regex"):
        run_check(b, backend="CPU", params="hsk=(64", log_dir=tmp_path)
    with pytest.raises(UsageError, match="test-backend-ops not found"):
        run_check(tmp_path, backend="CPU", log_dir=tmp_path)


def test_run_gate_forces_each_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    ok = (DATA / "tbo-mma-fail-crafted.txt").read_text().replace("FAIL", "OK").replace("Failing tests:", "")
    ok = ok.replace("3/4 tests passed", "4/4 tests passed")
    bad = (DATA / "tbo-mma-fail-crafted.txt").read_text()
    outputs = {"": (ok, 0), "decode:0-=MMA,prefill:0-=MMA": (bad, 1)}
    monkeypatch.setattr(tuner._run, "run", _fake_run(outputs, calls))
    g = run_gate(_fake_bin(tmp_path), ["vec", "TILE", "MMA"], backend="CUDA0", log_dir=tmp_path)
    rules = [env["GGML_TUNER_FA_RULES"] for _, env in calls]
    assert rules == ["decode:0-=VEC,prefill:0-=VEC", "decode:0-=TILE,prefill:0-=TILE", "decode:0-=MMA,prefill:0-=MMA"]
    assert not g.passed
    assert g.per_kernel["VEC"].passed and not g.per_kernel["MMA"].passed
    assert "kernel MMA" in g.summary and "type_K=q8_0" in g.summary
    assert g.failing[0].startswith("MMA: FLASH_ATTN_EXT(")


def test_run_gate_rejects_unknown_kernel(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Did you mean 'MMA'"):
        run_gate(_fake_bin(tmp_path), ["MMAA"], log_dir=tmp_path)


H100 = DATA / "h100"


@pytest.mark.parametrize("kernel", ["VEC", "MMA"])
def test_parse_real_h100_gate_output(kernel: str) -> None:
    import gzip

    text = gzip.decompress((H100 / f"tbo-hsk64-{kernel}.log.gz").read_bytes()).decode()
    r = parse_check_output(text, backend="CUDA0")
    # recorded on the H100: every D=64 FLASH_ATTN_EXT case passed with the kernel forced
    assert (r.passed, r.n_ok, r.n_fail, r.n_not_supported, r.backend_ran, bool(r.crashed)) == (
        True,
        1813,
        0,
        227,
        True,
        False,
    )


def test_real_h100_output_with_one_failure_is_infeasible() -> None:
    import gzip
    import re

    text = gzip.decompress((H100 / "tbo-hsk64-MMA.log.gz").read_bytes()).decode()
    case = re.search(r"^  (FLASH_ATTN_EXT\(.*\)): .*OK.*$", text, flags=re.M)
    assert case is not None
    broken = text.replace(case.group(0), f"  {case.group(1)}: FAIL", 1)
    broken = broken.replace("1813/1813 tests passed", "1812/1813 tests passed")
    r = parse_check_output(broken, backend="CUDA0")
    assert not r.passed and r.n_fail == 1 and list(r.failing) == [case.group(1)]
