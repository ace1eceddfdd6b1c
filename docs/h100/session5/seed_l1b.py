"""Seed the session-5 1B study with the session-4 screen rounds, their kernels re-read from the logs.

Session 4 screened the llama-3.2-1b shape on the H100 (4 paired rounds per phase at depths 0..65536,
same source, arch, pp/tg and build config) but parsed no kernels (see ../session4/reread.py). Those
rounds are real measurements; this copies them, with the kernels the logs show, into a new study so
that `tuner search --study sm90-l1b-v3` resumes after the screen (refinement, confirm) instead of
spending device time on it again. Nothing else of the old study (tune trials, result) is carried.

    python docs/h100/session5/seed_l1b.py   # writes docs/h100/session5/sm90-l1b-v3.db
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import optuna

from tuner.search.live import kernel_at, parse_fa_log

HERE = Path(__file__).resolve().parent
OLD = HERE.parent / "session4"
optuna.logging.set_verbosity(optuna.logging.WARNING)
old = optuna.load_study(study_name="sm90-l1b-v2", storage=f"sqlite:///{OLD / 'sm90-l1b-v2.db'}").user_attrs
logs: dict[str, str] = {}
with tarfile.open(OLD / "sm90-l1b-v2-logs.tgz") as tar:
    for m in tar.getmembers():
        if m.isfile() and m.name.endswith(".log"):
            logs[Path(m.name).name] = io.TextIOWrapper(tar.extractfile(m), errors="replace").read()  # type: ignore[arg-type]

recs = []
for r in old["screen_rounds"]:
    r = dict(r, session=4)
    ntok = old["pp"] if r["phase"] == "pp" else old["tg"]
    for name in r["order"]:
        lines = parse_fa_log(logs[f"screen-{r['phase']}-r{r['round']}-{name}-{r['phase']}.log"])
        ks = {str(d): kernel_at(lines, r["phase"], int(d), ntok) for d in r["depths"]}
        r["kernels"][name] = {d: k for d, (k, _) in ks.items()}
        r["why"][name] = {d: w for d, (_, w) in ks.items()}
    recs.append(r)

db = HERE / "sm90-l1b-v3.db"
db.unlink(missing_ok=True)
new = optuna.create_study(study_name="sm90-l1b-v3", storage=f"sqlite:///{db}", directions=["maximize", "maximize"])
for k in ("pipeline", "arch", "source_spec", "source_id", "commit", "era", "depths", "pp", "tg", "shape", "profile"):
    new.set_user_attr(k, old[k])
new.set_user_attr("screen_rounds", recs)
new.set_user_attr("seeded_from", "session 4 study sm90-l1b-v2: its 8 screen rounds (4 per phase), kernels re-read "
                  "from its logs by docs/h100/session5/seed_l1b.py")
print(f"{db}: {len(recs)} screen rounds seeded ({sum(r['phase'] == 'tg' for r in recs)} decode, "
      f"{sum(r['phase'] == 'pp' for r in recs)} prefill)")
