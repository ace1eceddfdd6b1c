"""Stored H100 study databases (tests/data/studies, results/*/evidence) exported and reported (no GPU needed)."""

from __future__ import annotations

import lzma
from pathlib import Path

import optuna
import pytest

from tuner.cli.export_cmd import LAST_ONE_TPE_EXPORT, export_study
from tuner.errors import UsageError
from tuner.result.pipeline_report import report_text
from tuner.study.record import SearchOutcome, load_outcome
from tuner.targets.archs import find_product

ROOT = Path(__file__).resolve().parents[3]
STUDIES = ROOT / "tests" / "data" / "studies"


def _plain(tmp_path: Path, name: str) -> Path:
    """The stored study decompressed (SQLite reads only a plain file)."""
    db = tmp_path / name
    db.write_bytes(lzma.decompress((STUDIES / f"{name}.xz").read_bytes()))
    return db


def test_find_product_names_the_measured_gpu() -> None:
    assert find_product("NVIDIA H100 80GB HBM3") == ("sm_90", "H100 SXM5 80 GB")
    assert find_product("NVIDIA GeForce RTX 4060 Ti") == ("sm_89", "GeForce RTX 4060 Ti 16 GB")
    assert find_product("CPU backend (x86_64, 2 threads)") is None


def test_a_one_tpe_study_is_refused_with_the_commit_that_reads_it(tmp_path: Path) -> None:
    """Studies of the search before the pipeline are not exported any more: one paragraph, nothing written."""
    db = _plain(tmp_path, "sm90-l8b-study.db")
    with pytest.raises(UsageError, match=f"one-TPE search.*commit {LAST_ONE_TPE_EXPORT}") as err:
        export_study("sm90-llama-3.1-8b-q4km", storage=f"sqlite:///{db}", out_dir=tmp_path / "x")
    assert err.value.exit_code == 2 and not (tmp_path / "x").exists()


def _outcome(result: str, study: str, tmp_path: Path) -> SearchOutcome:
    db = tmp_path / f"{study}.db"
    db.write_bytes(lzma.decompress((ROOT / "results" / result / "evidence" / "study.db.xz").read_bytes()))
    return load_outcome(optuna.load_study(study_name=study, storage=f"sqlite:///{db}"))


def test_a_ptx_jit_report_says_whose_code_ran_on_which_gpu(tmp_path: Path) -> None:
    """sm_89 code run on an H100 as 89-virtual: the report says the speeds are the H100's, not an sm_89 card's."""
    ptx = report_text(_outcome("sm_89/llama-3.2-1b-q4_k_m-measured-on-h100", "sm89-l1b-v4", tmp_path))
    assert "**sm_89 code, measured on the sm_90 GPU named above** (H100 SXM5 80 GB;" in ptx
    assert "differ on a real sm_89 card" in ptx
    native = report_text(_outcome("sm_90/llama-3.2-1b-q4_k_m", "sm90-l1b-v3", tmp_path))
    assert "measured on NVIDIA H100" in native and "JIT-compiled" not in native
