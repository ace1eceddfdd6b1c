"""Re-read the kernels of the session-4 1B screen from its llama-bench logs, then summarize and compose.

The H100 run (search-sm90-l1b-v2.txt) parsed its GGML_TUNER_FA_LOG lines with a pattern that did not
know the type_k/type_v fields the hook had just gained, so every kernel came back unknown, no A/A
pair was found and nothing could be claimed. The t/s values in the study are unaffected; the logs
(sm90-l1b-v2-logs.tgz) hold the kernel lines. This script reads both with tuner's own functions:

    python docs/h100/session4/reread.py   # from the repo root, with tuner installed
"""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path

import optuna

from tuner.search import compose as comp
from tuner.search.live import kernel_at, parse_fa_log
from tuner.search.screen import summarize_phase

HERE = Path(__file__).resolve().parent
study = optuna.load_study(study_name="sm90-l1b-v2", storage=f"sqlite:///{HERE / 'sm90-l1b-v2.db'}")
a = study.user_attrs
logs: dict[str, str] = {}
with tarfile.open(HERE / "sm90-l1b-v2-logs.tgz") as tar:
    for m in tar.getmembers():
        if m.isfile() and m.name.endswith(".log"):
            logs[Path(m.name).name] = io.TextIOWrapper(tar.extractfile(m), errors="replace").read()  # type: ignore[arg-type]

recs = [dict(r) for r in a["screen_rounds"]]
for r in recs:
    ntok = a["pp"] if r["phase"] == "pp" else a["tg"]
    for name in r["order"]:
        lines = parse_fa_log(logs.get(f"screen-{r['phase']}-r{r['round']}-{name}-{r['phase']}.log", ""))
        ks = {str(d): kernel_at(lines, r["phase"], int(d), ntok) for d in r["depths"]}
        r["kernels"][name] = {d: k for d, (k, _) in ks.items()}
        r["why"][name] = {d: w for d, (_, w) in ks.items()}

shape = comp.Shape(D=a["shape"]["head_dim"], gqa=a["shape"]["gqa"], kv="f16")
for phase in ("tg", "pp"):
    depths = sorted({int(d) for r in recs if r["phase"] == phase for d in r["depths"]})
    cells = summarize_phase(phase, [r for r in recs if r["phase"] == phase], depths)
    n = max(e.n for c in cells.values() for e in c.effects.values())
    print(f"\n{phase}: {n} paired rounds; per depth: upstream kernel, A/A pair and its noise, forced kernels Δ% [95% CI]")
    for d, c in cells.items():
        effs = "  ".join(f"{k} {e.pct:+5.1f}% [{100 * (e.ci_low - 1):+5.1f},{100 * (e.ci_high - 1):+5.1f}] {c.verdicts[k]}"
                         for k, e in c.effects.items())
        print(f"  d{d:<6} upstream {c.upstream_kernel}  A/A {c.aa} ±{c.noise_pct:.1f}%  {effs}")
    dec = comp.compose_phase(phase, cells)
    print(f"  phase noise floor (median A/A): ±{comp.phase_noise(cells):.1f}%")
    print("  composed: " + (", ".join(comp.rules_from(dec, shape)) or "none (upstream's selection everywhere)"))
    print("  bisect next: " + str(comp.bisect_depths(dec, depths)))
