"""A rule the confirm narrowed is exported narrowed and reported (report.md, config.toml), and the points it no
longer covers show upstream's kernel. From the real H100 study sm90-l1b-v3
(results/sm_90/llama-3.2-1b-q4_k_m/evidence/study.db.xz): its confirm kept
``decode/D64/gqa4/kvf16:32768-=TILE``, faster at 32768, 49152 and 65536 and no different from upstream at
8192, 12288 and 16384. Here the composed rule is taken to have started at 8192 (the points from 8192 to
16384 then measured TILE): the confirm narrows it to the rule the study exported.
"""

from __future__ import annotations

import json
import lzma
import sqlite3
from pathlib import Path

from tuner._compat import tomllib
from tuner.cli.export_cmd import export_study
from tuner.measure.paired import UPSTREAM_KEPT
from tuner.plan.fa_rules import as_stored, parse_fa_rules, rules_texts
from tuner.search.confirm import judge

ROOT = Path(__file__).resolve().parents[3]
DB = ROOT / "results" / "sm_90" / "llama-3.2-1b-q4_k_m" / "evidence" / "study.db.xz"
WIDE, NARROW = "decode/D64/gqa4/kvf16:8192-=TILE", "decode/D64/gqa4/kvf16:32768-=TILE"


def _narrowed_study(tmp_path: Path) -> str:
    db = tmp_path / "sm90-l1b-v3.db"
    db.write_bytes(lzma.decompress(DB.read_bytes()))
    con = sqlite3.connect(db)
    try:
        (value,) = con.execute("select value_json from study_user_attributes where key = 'result'").fetchone()
        res = json.loads(value)
        assert res["rules"] == [NARROW] and not res.get("tuned")
        (wide,) = parse_fa_rules(WIDE)
        rows = [{**r, "kernel": "TILE"} if r["phase"] == "tg" and wide.covers(r["depth"]) else r for r in res["rows"]]
        j = judge([wide], rows, process_changed=False)
        res = {**res, "rules": rules_texts(j["kept"]), "narrowed": as_stored(j["narrowed"]), "rows": j["rows"]}
        con.execute("update study_user_attributes set value_json = ? where key = 'result'", (json.dumps(res),))
        con.commit()
    finally:
        con.close()
    return f"sqlite:///{db}"


def test_narrowed_rule_is_exported_and_reported(tmp_path: Path) -> None:
    from tuner.result.validate import validate_result

    out = export_study("sm90-l1b-v3", storage=_narrowed_study(tmp_path), out_dir=tmp_path / "out")
    cfg = tomllib.loads((out / "config.toml").read_text())
    assert cfg["choice"]["fa_rules"] == [NARROW] and cfg["choice"]["dropped_rules"] == {}
    why = cfg["choice"]["narrowed_rules"][NARROW]
    assert f"narrowed from {WIDE}" in why and "not faster end to end at depths [8192, 12288, 16384]" in why
    report = (out / "report.md").read_text()
    (line,) = [ln for ln in report.splitlines() if ln.startswith("Narrowed after confirm")]
    assert f"`{NARROW}` (narrowed from {WIDE}: not faster end to end at depths [8192, 12288, 16384]" in line
    tg = {p["depth"]: p for p in cfg["points"] if p["phase"] == "tg"}
    for d in (8192, 12288, 16384):
        p = tg[d]
        assert p["kernel"] == p["upstream_kernel"] == "VEC" and p["verdict"] == UPSTREAM_KEPT
        assert p["measured_kernel"] == "TILE" and p["measured_verdict"] == "no difference"
        assert p["tuned_ts"] == p["base_ts"] and p["speedup"] == 1.0
    assert all(tg[d]["kernel"] == "TILE" and tg[d]["verdict"] == "faster" for d in (32768, 49152, 65536))
    # report.md and PR.md never show the forced kernel where the export does not force it
    assert "VEC → TILE" not in "\n".join(ln for ln in report.splitlines() if "d8192" in ln or "d16384" in ln)
    pr = (out / "PR.md").read_text()
    assert not [ln for ln in pr.splitlines() if ("d8192" in ln or "d16384" in ln) and "TILE" in ln]
    patch = (out / "upstream.patch").read_text()
    assert "K->ne[1] >= 32768" in patch and "8192" not in patch
    check = validate_result(out)
    assert check.ok, [f for f in check.findings if not f.ok]
    # a narrowed rule that is not exported is a schema error
    text = (out / "config.toml").read_text().replace(f'"{NARROW}" = ', f'"{WIDE}" = ')
    (out / "config.toml").write_text(text)
    bad = [f for f in validate_result(out).findings if not f.ok]
    assert [f.check for f in bad] == ["schema"] and "not one of choice.fa_rules" in bad[0].detail


def test_a_failed_trials_reason_names_its_log_without_this_machines_folders() -> None:
    from tuner.result.pipeline_report import _trials
    from tuner.study.record import TrialSummary

    why = "Build of sm_90/cuda@00941afc failed with exit code 1. Full log: /work/x/.devhome/builds/5a/logs/b-0094.log. Last"
    t = TrialSummary(number=2, status="failed", objectives=(), params={"k": 1}, phases=("tg",), reason=why)
    text = _trials([t])
    assert "/work" not in text and "Full log: b-0094.log" in text and "sm_90/cuda@00941afc" in text
