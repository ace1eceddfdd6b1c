"""The GPU read of the patched tree's kernel choice (tuner.sweep.table_check.selected_kernels) with ncu and fa-bench replaced
by fakes that answer from the case they are given; ncu's CSV as tests/unit/result/test_upstream_check.py
writes it (its parser reads the recorded H100 report in tests/data/ncu)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from tests.unit.result.test_upstream_check import _csv
from tests.unit.sweep.test_sweep_confirm import _sweep_dir
from tuner.sweep import confirm, table_check
from tuner.sweep.table import TableRule

RULE = TableRule(D=64, gqa=4, kv="f16", ne1=1, lo=16384, hi=None, kernel="MMA")


def _ev(tmp: Path) -> Any:
    table = confirm.load_table(_sweep_dir(tmp))
    return types.SimpleNamespace(table=table, confirmed=types.SimpleNamespace(kept_rules=[RULE]))


def test_probes_are_the_lowest_and_highest_covered_cells(tmp_path: Path) -> None:
    got = [(c.shape.D, c.shape.gqa, c.n_kv, want) for c, want in table_check.probes([RULE], _ev(tmp_path).table.cells)]
    assert got == [(64, 4, 16384, "MMA"), (64, 4, 32768, "MMA")]
    narrow = TableRule(D=64, gqa=4, kv="f16", ne1=1, lo=8192, hi=16384, kernel="TILE")
    assert [(c.n_kv, w) for c, w in table_check.probes([narrow], _ev(tmp_path).table.cells)] == [(8192, "TILE")]


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, kernel_at: Any, calls: list[Any]) -> None:
    import tuner._run
    import tuner.measure.fa_bench
    import tuner.result.upstream_check

    monkeypatch.setattr(tuner.result.upstream_check, "find_ncu", lambda: Path("/opt/ncu"))
    monkeypatch.setattr(tuner.measure.fa_bench, "build_fa_bench", lambda bin_dir: bin_dir / "fa-bench")

    def run(cmd: list[Any], **kw: Any) -> Any:
        calls.append((cmd, kw["env"]))
        n_kv = int(Path(cmd[cmd.index("-f") + 1]).read_text().split()[4])  # the case line's n_kv
        return types.SimpleNamespace(returncode=0, output=_csv([kernel_at(n_kv)] * 3))

    monkeypatch.setattr(tuner._run, "run", run)


def test_the_launched_kernel_must_be_the_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    _fake_gpu(monkeypatch, lambda n: "flash_attn_ext_f16" if n >= 16384 else "flash_attn_ext_vec", calls)
    f = table_check.selected_kernels(tmp_path / "bin", _ev(tmp_path), backend="CUDA0", log_dir=tmp_path / "logs")
    assert f.ok and f.detail == "D64 gqa4 f16 ne1 1 n_kv 16384: MMA; D64 gqa4 f16 ne1 1 n_kv 32768: MMA", f.detail
    cmd, env = calls[0]
    assert cmd[0] == Path("/opt/ncu") and cmd[cmd.index("-n") + 1] == "1" and env["GGML_CUDA_DISABLE_GRAPHS"] == "1"
    calls.clear()
    _fake_gpu(monkeypatch, lambda n: "flash_attn_ext_vec", calls)  # the patch did not take: upstream's VEC
    f = table_check.selected_kernels(tmp_path / "bin", _ev(tmp_path), backend="CUDA0", log_dir=tmp_path / "logs")
    assert not f.ok and "n_kv 16384: VEC, the table gives MMA" in f.detail


def test_without_ncu_or_a_kept_entry_the_check_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.result.upstream_check

    monkeypatch.setattr(tuner.result.upstream_check, "find_ncu", lambda: None)
    f = table_check.selected_kernels(tmp_path / "bin", _ev(tmp_path), backend="CUDA0", log_dir=tmp_path / "logs")
    assert f.ok and f.detail.startswith("skipped: Nsight Compute (ncu) not found")
    ev = _ev(tmp_path)
    ev.confirmed.kept_rules = []
    f = table_check.selected_kernels(tmp_path / "bin", ev, backend="CUDA0", log_dir=tmp_path / "logs")
    assert f.ok and f.detail == "skipped: no FlashAttention entry kept"
