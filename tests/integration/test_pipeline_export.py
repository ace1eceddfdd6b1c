"""Export of a screen -> compose -> tune -> confirm study, on the real pinned tree.

The study is the real H100 session-4 database (docs/h100/session4); its ``result`` is replaced here by
a CRAFTED confirm outcome (one kept decode rule and its points), because that run never reached its
confirm stage. What is tested is the export, not the numbers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULE = "decode/D64/gqa4/kvf16:65536-=TILE"


def _crafted_rows() -> list[dict]:
    rows = []
    for d, up, tuned, lo, hi, v in ((32768, 561.0, 563.0, 0.99, 1.02, "no difference"),
                                    (49152, 480.0, 481.0, 0.99, 1.02, "no difference"),
                                    (65536, 402.6, 461.0, 1.11, 1.18, "faster")):
        rows.append({"phase": "tg", "depth": d, "upstream_kernel": "VEC", "kernel": "TILE" if d >= 65536 else "VEC",
                     "base_ts": up, "tuned_ts": tuned, "speedup": tuned / up, "ci_low": lo, "ci_high": hi, "rounds": 4,
                     "aa_noise_pct": 4.4, "verdict": v})
    return rows


def test_pipeline_export_writes_an_upstream_ready_result(tree_a, tmp_path: Path) -> None:
    import optuna

    from tuner.cli.export_cmd import export_study
    from tuner.result.upstream_patch import whitespace_only_hunks
    from tuner.result.validate import validate_result

    db = tmp_path / "study.db"
    shutil.copy(REPO / "docs" / "h100" / "session4" / "sm90-l1b-v2.db", db)
    storage = f"sqlite:///{db}"
    study = optuna.load_study(study_name="sm90-l1b-v2", storage=storage)
    study.set_user_attr("result", {"rules": [RULE], "dropped": {}, "tuned": None, "rows": _crafted_rows(),
                                   "upstream_phases": ["pp"], "confirm_depths": [32768, 49152, 65536]})
    out = export_study("sm90-l1b-v2", storage=storage, out_dir=tmp_path / "out")
    files = {p.name for p in out.iterdir()}
    assert {"config.toml", "tuned.patch", "upstream.patch", "PR.md", "report.md", "speedup.png", "run.env"} <= files
    up = (out / "upstream.patch").read_text()
    assert "Q->ne[0] == 64" in up and "gqa_ratio == 4" in up and "K->ne[1] >= 65536" in up
    assert "getenv" not in up and not whitespace_only_hunks(up)
    assert "decode/D64/gqa4/kvf16:65536-=TILE" in (out / "tuned.patch").read_text()  # baked, keyed by shape
    report = (out / "report.md").read_text()
    assert "tg128@d65536" in report and "| Model" in report
    check = validate_result(out)
    assert check.ok, [f for f in check.findings if not f.ok]


def test_a_pinned_study_exports_its_mask_and_derived_knob_values(tree_a, tmp_path: Path) -> None:
    """A study measured under --cpu-mask with tuned threads/-ngl: the export resolves the same derived
    space (from the study's derived_knobs) and its commands carry the pin, so they reproduce the run."""
    import dataclasses

    import optuna

    from tuner.cli.export_cmd import export_study
    from tuner.plan.derive import legal_values
    from tuner.plan.space import load_space
    from tuner.targets.host import Cpus

    db = tmp_path / "study.db"
    shutil.copy(REPO / "docs" / "h100" / "session4" / "sm90-l1b-v2.db", db)
    storage = f"sqlite:///{db}"
    study = optuna.load_study(study_name="sm90-l1b-v2", storage=storage)
    legal = legal_values(load_space("sm_90", "mma"), cpus=Cpus(ids=(0, 1), physical=2, masked=True),
                         shape={"n_layers": 16, "n_kv_heads": 8, "head_dim": 64})
    study.set_user_attr("derived_knobs", {k: dataclasses.asdict(v) for k, v in legal.items()})
    study.set_user_attr("cpu_mask", [0, 1])
    study.set_user_attr("result", {"rules": [], "dropped": {}, "tuned": {"trial": 0, "values": {"threads": 1, "ngl": 9},
                                                                                  "params": {"threads": 1, "ngl": 9}},
                                   "rows": _crafted_rows(), "upstream_phases": [], "confirm_depths": [32768]})
    out = export_study("sm90-l1b-v2", storage=storage, out_dir=tmp_path / "out")
    run_env = (out / "run.env").read_text()
    assert "# llama-bench: taskset -c 0-1 llama-bench" in run_env and "-t 1 -ngl 9" in run_env
    assert "# llama-server: taskset -c 0-1 llama-server" in run_env
    assert 'cpu_mask = "0-1"' in (out / "config.toml").read_text()
