"""Export from real H100 study databases stored in tests/data/studies (no GPU needed to re-export)."""

from __future__ import annotations

import lzma
import re
from pathlib import Path

from tuner._compat import tomllib
from tuner.cli.export_cmd import export_study
from tuner.targets.archs import find_product

ROOT = Path(__file__).resolve().parents[3]
STUDIES = ROOT / "tests" / "data" / "studies"


def _plain(tmp_path: Path, name: str) -> Path:
    """The stored study decompressed (SQLite reads only a plain file)."""
    db = tmp_path / name
    db.write_bytes(lzma.decompress((STUDIES / f"{name}.xz").read_bytes()))
    return db


def _tg_roofline_pcts(report: str) -> list[float]:
    rows = [ln for ln in report.splitlines() if ln.startswith("| tg128")]
    return [float(c.strip()) for ln in rows for c in ln.split("|")[-3:-1]]


def test_find_product_names_the_measured_gpu() -> None:
    assert find_product("NVIDIA H100 80GB HBM3") == ("sm_90", "H100 SXM5 80 GB")
    assert find_product("NVIDIA GeForce RTX 4060 Ti") == ("sm_89", "GeForce RTX 4060 Ti 16 GB")
    assert find_product("CPU backend (x86_64, 2 threads)") is None


def test_ptx_jit_study_reports_the_measured_gpu(tmp_path: Path) -> None:
    # sm_89 code run on the H100 as 89-virtual: the roofline must be the H100's. Against the
    # 4060 Ti's 288 GB/s the same decode speeds would read 230-370% of "roofline".
    out = export_study(
        "sm89v-llama-3.2-1b-q4km",
        storage=f"sqlite:///{_plain(tmp_path, 'sm89v-l1b-study.db')}",
        out_dir=tmp_path / "x",
        like="llama-3.2-1b",
        weight_type="q4_k_m",
    )
    report = (out / "report.md").read_text()
    assert "**sm_89 code, measured on the sm_90 GPU named above**" in report
    assert "(H100 SXM5 80 GB), not an sm_89 card's" in report
    pcts = _tg_roofline_pcts(report)
    assert len(pcts) == 8 and all(5 < p < 100 for p in pcts), pcts
    cfg = tomllib.loads((out / "config.toml").read_text())
    assert cfg["target"]["arch"] == "sm_89" and cfg["target"]["measured_arch"] == "sm_90"
    # The preset is for a real sm_89 card, not the PTX build that ran on the H100.
    assert '"CMAKE_CUDA_ARCHITECTURES": "89-real"' in (out / "CMakeUserPresets.json").read_text()


def test_trials_section_lists_every_trial(tmp_path: Path) -> None:
    out = export_study(
        "sm90-llama-3.1-8b-q4km",
        storage=f"sqlite:///{_plain(tmp_path, 'sm90-l8b-study.db')}",
        out_dir=tmp_path / "x",
        like="llama-3.1-8b",
        weight_type="q4_k_m",
    )
    report = (out / "report.md").read_text()
    section = report.split("## Trials", 1)[1]
    rows = re.findall(r"^\| trial(\d+) +\| (\w+) ", section, re.M)
    assert [int(n) for n, _ in rows] == list(range(9))
    assert dict(rows)["0"] == "ok" and dict(rows)["1"] == "infeasible"
    assert "upstream defaults" in section and "nwarps" in section  # the infeasible row says why
    assert "backend CUDA" in report
