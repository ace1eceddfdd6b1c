"""The kernel-level screen's rounds in study-machine2.db.xz as a table: per phase and depth, upstream's kernel,
its op runs per second, and each candidate's mean ratio to upstream over the rounds (python3 summarize.py)."""

import json
import lzma
import sqlite3
import statistics
import tempfile
from pathlib import Path

with tempfile.NamedTemporaryFile(suffix=".db") as f:
    f.write(lzma.decompress((Path(__file__).parent / "study-machine2.db.xz").read_bytes()))
    f.flush()
    attrs = {k: json.loads(v) for k, v in sqlite3.connect(f.name).execute("select key, value_json from study_user_attributes")}
print(f"screen method: {attrs['screen_method']}; stage seconds: {attrs['stage_seconds']}")
recs = attrs["screen_rounds"]
for phase in ("tg", "pp"):
    rs = [r for r in recs if r["phase"] == phase]
    print(f"\n{phase}: {len(rs)} rounds, seconds {[r['seconds'] for r in rs]}")
    print("| depth | upstream kernel | upstream op runs/s | " + " | ".join(f"{n} / upstream" for n in rs[0]["order"][1:]) + " |")
    print("|---" * (3 + len(rs[0]["order"]) - 1) + "|")
    for d in map(str, rs[0]["depths"]):
        cells = []
        for n in rs[0]["order"][1:]:
            x = [r["values"][n][d] / r["values"]["upstream"][d] for r in rs if r["values"].get(n, {}).get(d) and r["values"]["upstream"].get(d)]
            cells.append(f"{statistics.mean(x):.3f} (n={len(x)})")
        print(f"| {d} | {rs[0]['kernels']['upstream'][d]} | {rs[0]['values']['upstream'][d]:.0f} | " + " | ".join(cells) + " |")
