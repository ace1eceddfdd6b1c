"""Session 6's screens and confirms, per cell: the per-pair interval (t with R-1 df) next to the pooled
block interval (t with (R-1)(C-1) df) that tuner uses since this session, and what compose keeps.

    python docs/h100/session6/screens.py > docs/h100/session6/screens.txt
    python docs/h100/session6/screens.py docs/h100/session8/latest/sm90-l1b-v3.db docs/h100/session8/latest/sm90-q05b.db \
        > docs/h100/session8/screens.txt     (session 8: the 1B after 6 rounds, the qwen2.5-0.5b control)

A database's file name is its study's name.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from tuner.measure.paired import paired_effect
from tuner.search import compose as comp
from tuner.search.screen import UPSTREAM, summarize_phase

HERE = Path(__file__).resolve().parent


def pct(e) -> str:
    return f"{e.pct:+5.1f} [{100 * (e.ci_low - 1):+5.1f}, {100 * (e.ci_high - 1):+5.1f}]"


for db in [Path(a) for a in sys.argv[1:]] or [HERE / "sm90-l8b-v3.db", HERE / "sm90-l1b-v3.db"]:
    name = db.stem
    a = {k: json.loads(v) for k, v in sqlite3.connect(db).execute("select key, value_json from study_user_attributes")}
    for key in [k for k in a if k == "screen_rounds" or k.startswith("confirm_rounds")]:
        for ph in ("tg", "pp"):
            recs = [r for r in a[key] if r["phase"] == ph]
            if not recs:
                continue
            depths = sorted({int(d) for r in recs for d in r["depths"]})
            cells = summarize_phase(ph, recs, depths)
            print(f"\n## {name} {key} {ph}: {len(recs)} rounds of {len(recs[0]['order'])} candidates")
            print("depth | upstream kernel | A/A noise | candidate: pooled block CI (verdict) | per-pair CI")
            for d, c in cells.items():
                up = [r["values"][UPSTREAM].get(str(d)) for r in recs]
                parts = [f"{n} {pct(e)} ({c.verdicts[n]}) | {pct(paired_effect([r['values'][n].get(str(d)) for r in recs], up))}"
                         for n, e in c.effects.items()]
                print(f"{d:6d} | {c.upstream_kernel} | ±{c.noise_pct:.1f}% | " + " ; ".join(parts))
            if key == "screen_rounds":
                dec = comp.compose_phase(ph, cells)
                sh = a["shape"]
                print("composed:", comp.rules_from(dec, comp.Shape(D=sh["head_dim"], gqa=sh["gqa"], kv="f16")) or "upstream everywhere")
