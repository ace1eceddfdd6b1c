"""The gate's CUDA calibration pairs of session 9 as a table (docs/equivalence.md quotes it).

    python docs/h100/session9/calib_table.py > docs/h100/session9/calib.txt
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
print("| pair | mode | candidate | mean KLD | 99% KLD | max KLD | same top p | deterministic |")
print("|---|---|---|---|---|---|---|---|")
for p in sorted((HERE / "calib").glob("*.json")):
    d = json.loads(p.read_text())
    s, st = d.get("stats") or {}, d["settings"]
    cand = " ".join(f"{k}={v}" for k, v in st.get("candidate_env", {}).items()) + " ".join(st.get("candidate_args", []))
    print(f"| {p.stem} | {d['mode']} | {cand or '(upstream itself)'} | {s.get('mean_kld')} | {s.get('p99_kld')} | "
          f"{s.get('max_kld')} | {s.get('same_top_pct')}% | {d.get('deterministic')} |")
