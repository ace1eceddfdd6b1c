"""The one screen round of the llama-3.1-8b shape that session 5 measured, kernels read per phase.

In that call `run_bench` still ran the prefill and decode tests of a "shared" call as two llama-bench
processes (fixed since: one process, one fill per depth), and the live measure read the kernels of
both phases from the second (decode) process's log. This reads each phase's kernels from its own
log and prints the round's paired ratios. One round has no confidence interval: these are point
estimates, not claims.

    python docs/h100/session5/round1.py   # from the repo root, with tuner installed
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import optuna

from tuner.search.live import kernel_at, parse_fa_log

HERE = Path(__file__).resolve().parent
optuna.logging.set_verbosity(optuna.logging.WARNING)
a = optuna.load_study(study_name="sm90-l8b-v3", storage=f"sqlite:///{HERE / 'call2' / 'sm90-l8b-v3.db'}").user_attrs
logs: dict[str, str] = {}
with tarfile.open(HERE / "call2" / "sm90-l8b-v3-logs.tgz") as tar:
    for m in tar.getmembers():
        if m.isfile() and m.name.endswith(".log"):
            logs[Path(m.name).name] = io.TextIOWrapper(tar.extractfile(m), errors="replace").read()  # type: ignore[arg-type]

print(f"llama-3.1-8b shape (Q4_K_M), H100, depths {a['depths']}, pp{a['pp']}/tg{a['tg']}, gate: "
      f"{next(iter(a['gates'].values()))['summary']}")
for r in a["screen_rounds"]:
    phase, ntok = r["phase"], (a["pp"] if r["phase"] == "pp" else a["tg"])
    print(f"\n{phase}: round {r['round'] + 1}, order {r['order']}, {r['seconds']:.0f} s")
    up = r["values"]["upstream"]
    for name in r["order"]:
        # the call's label: the shared calls ran both phases' candidates, the last one decode alone
        log = next(v for k, v in logs.items() if k.endswith(f"-{phase}.log") and
                   (f"-{name}+" in k if phase == "tg" else f"+{name}-" in k) or k == f"screen-tg-r0-{name}-tg.log" and phase == "tg")
        lines = parse_fa_log(log)
        cells = []
        for d, v in r["values"][name].items():
            k, why = kernel_at(lines, phase, int(d), ntok)
            cells.append(f"d{d} {v:8.1f} t/s {k}/{why} {100 * (v / up[d] - 1):+5.1f}%")
        print(f"  {name:9} " + "  ".join(cells))
