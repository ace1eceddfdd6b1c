"""``tuner sweep confirm`` end to end on the real CPU build with the `tiny` shape (head size 64, GQA 4): a
sweep storage with one planted rule of that shape, llama-bench rounds of upstream, its A/A twin and the
table's env, the output-equivalence gate through llama-perplexity, e2e.md and PR.md, and a rerun that
resumes with nothing left to measure. The CPU backend has no tuner hook, so the table's env changes no
kernel there: the rule shows no end-to-end gain and is reported, and no patch is written. Then
`tuner sweep export` of that confirmation (an empty table, its evidence) and `tuner validate` of the folder.
About a minute on 2 cores once the build is cached."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli.sweep_cmd import sweep
from tuner.rounds.store import Sample, SampleStore
from tuner.sweep import live
from tuner.sweep.grid import AA, DEFAULT, FaShape, plan
from tuner.targets.archs import load_arch

pytestmark = pytest.mark.integration


def _planted_sweep(out: Path) -> None:
    """MMA 20% faster than upstream's VEC at D64/gqa4/f16 decode over every n_kv (the rule [0, inf) -> MMA), and
    VEC 20% faster than upstream's MMA at Q->ne[1] = 2 (the entry ne1 2, [0, inf) -> VEC: a small-batch pass)."""
    shapes = {FaShape(D=64, gqa=4, kv="f16", ne1=1): "MMA", FaShape(D=64, gqa=4, kv="f16", ne1=2): "VEC"}
    store = SampleStore(
        live.TABLE, out / "sweep.sqlite3", {"arch": "sm_90", "backend": "CUDA0", "build": "/b", "timer": "t"}
    )
    rows = []
    for c in plan(load_arch("sm_90"), n_kv=(256, 512, 1024), query_batches=(1, 2)):
        if c.shape not in shapes:
            continue
        for r in range(3):
            for i, cfg in enumerate(c.configs):
                us = 100.0 + 0.01 * ((r + i) % 3)
                us = us * 0.8 if cfg == shapes[c.shape] else us if cfg in (DEFAULT, AA) else us * 1.5
                rows.append(Sample(key=(c.shape, c.n_kv), config=cfg, round=r, us=us))
    store.add(rows)
    store.close()


def test_confirm_on_cpu_build_reports_the_rule_and_resumes(cpu_build, tmp_path: Path) -> None:
    from tuner.builder.cmake import ensure_targets

    bin_dir = Path(ensure_targets(cpu_build, ["llama-perplexity"]).bin_dir)
    sweep_dir, out = tmp_path / "sweep", tmp_path / "out"
    _planted_sweep(sweep_dir)
    args = ["confirm", str(sweep_dir), "--like", "tiny", "--quant", "f16", "--depths", "0,256", "--rounds", "2"]
    args += ["--reps", "1", "--build", str(bin_dir), "--backend", "CPU", "-o", str(out)]
    res = CliRunner().invoke(sweep, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "tiny (D64/gqa4/kvf16): 1 decode rule(s); 6 llama-bench calls" in res.output
    assert "reported: D64 gqa4 f16 ne1 1, n_kv in [0, inf) -> MMA" in res.output
    # the Q->ne[1] = 2 entry: its own pass of llama-bench pp2 at both depths, keyed to its batch; reported too
    assert "small-batch pass tiny-pp2: 1 entry(ies) at Q->ne[1] = 2, pp2 at depths [0, 256]" in res.output
    assert "reported: D64 gqa4 f16 ne1 2, n_kv in [0, inf) -> VEC" in res.output
    e2e, pr = (out / "e2e.md").read_text(), (out / "PR.md").read_text()
    assert "tg128@d256" in e2e and "pp512@d256" in e2e and "GGML_TUNER_FA_RULES=decode/D64/gqa4/kvf16:0-=MMA" in e2e
    assert "pp2@d256" in e2e and "GGML_TUNER_FA_RULES=prefill/D64/gqa4/kvf16/nb2:0-=VEC" in e2e
    assert "## Reported, not patched" in pr and "tiny" in pr
    assert not (out / "upstream.patch").exists()
    with sqlite3.connect(out / "confirm.sqlite3") as db:
        n = db.execute("SELECT count(*) FROM rounds").fetchone()[0]
        gate = db.execute("SELECT count(*) FROM gate WHERE model = 'tiny'").fetchone()[0]
    assert n == 6 and gate >= 1  # 2 rounds x (pp, tg) and 2 rounds of the pass's pp; the gate's checks stored
    again = CliRunner().invoke(sweep, args, catch_exceptions=False)
    assert again.exit_code == 0 and "round 1/2" not in again.output
    with sqlite3.connect(out / "confirm.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM rounds").fetchone()[0] == n
    _export_and_validate(sweep_dir, out, tmp_path / "results" / "cpu" / "table")


def _export_and_validate(sweep_dir: Path, confirm_dir: Path, dest: Path) -> None:
    """The confirmed CPU run as a result folder: an empty table (the rule was reported), evidence kept, and
    `tuner validate` recomposing it from the stored evidence on the pinned tree."""
    from tuner._compat import tomllib
    from tuner.cli.export_cmd import validate

    args = ["export", str(confirm_dir), "--sweep", str(sweep_dir), "-o", str(dest)]
    res = CliRunner().invoke(sweep, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "0 FlashAttention entr(ies) and 0 MMQ choice(s) kept, 2 reported" in res.output
    m = tomllib.loads((dest / "table.toml").read_text())
    assert m["table"]["composed_fa_rules"] == [
        "D64 gqa4 f16 ne1 1, n_kv in [0, inf) -> MMA",
        "D64 gqa4 f16 ne1 2, n_kv in [0, inf) -> VEC",
    ]
    # "models": one name per recorded row, the model's and its small-batch pass's
    assert (
        m["table"]["fa_rules"] == []
        and m["table"]["models"] == ["tiny", "tiny"]
        and not (dest / "upstream.patch").exists()
    )
    assert m["files"]["plots"] == ["plots/fa-D64.png", "plots/fa-D64-ne1-2.png"]  # decode, then Q->ne[1] = 2
    check = CliRunner().invoke(validate, [str(dest)], catch_exceptions=False)
    assert check.exit_code == 0 and "1 passed, 0 failed" in check.output, check.output
    assert "empty table: no entry was kept end to end" in check.output
