"""python3 -P docs/data/h200-pipeline/judge.py STATE_DIR [LIKE]: the stored H200 rounds of one model judged by
tuner's own confirm code (tuner.sweep.confirm.judge_model and gate_model; nothing is measured), as the
confirmation will judge them when it finishes. STATE_DIR is h200/ from h200-state.tar.xz (its fa/, mmq/ and
confirm/). Reads a copy of the confirm store, so the file is left as it was."""
import shutil
import sys
import tempfile
from pathlib import Path

from tuner.sweep import confirm

state = Path(sys.argv[1])
like = sys.argv[2] if len(sys.argv) > 2 else "llama-3.1-8b"
table = confirm.load_table(state / "fa", state / "mmq")
tmp = Path(tempfile.mkdtemp()) / "confirm.sqlite3"
shutil.copy(state / "confirm" / "confirm.sqlite3", tmp)
store = confirm.ConfirmStore(tmp, {})
print("store:", dict(store.db.execute("SELECT key, value FROM meta")))
plan = confirm.plan_model(table, like, weight_types=confirm.planned_weight_types(like, "Q4_K_M"))
ds = tuple(sorted({int(d) for r in store.records(like) for d in r["depths"]}))
recs = confirm.measure_model(confirm._stored_only, plan, ds, rounds=3, store=store)
print(f"{like}: stored rounds per phase {({p: len(v) for p, v in recs.items()})}; table env {plan.env}")
cells = confirm.judge_model(recs, ds, mmq_changed=bool(plan.mmq), phases=plan.phases)
print(f"{'test':>15} {'upstream t/s':>12} {'table t/s':>10} {'speedup':>8} {'95% CI':>16} {'A/A':>6}  kernel  verdict")
for p in confirm.model_points(like, cells, pp=plan.pp):
    sp = p["tuned_ts"] / p["base_ts"] if p["tuned_ts"] else 0.0
    ci = f"[{p['ci_low']:.3f}, {p['ci_high']:.3f}]" if p["ci_low"] is not None else "-"
    print(f"{p['test'] + '@d' + str(p['depth']):>15} {p['base_ts']:12.2f} {p['tuned_ts'] or 0:10.2f} {sp:8.3f} "
          f"{ci:>16} {p['aa_noise_pct']:5.1f}%  {p['upstream_kernel']}->{p['kernel']}  {p['verdict']}")
g = confirm.gate_model(plan, Path(), Path(), arch=table.arch, era="mma", store=store, work_dir=Path(),
                       run_one=confirm._stored_only, quiet=True)
print(f"output-equivalence gate: {g['verdict']} (thresholds: {g.get('band_factor')} x the band of upstream's own kernels)")
for c in g.get("checks", []):
    st, th = c["stats"], c["thresholds"]
    print(f"  {c['name']}: {c['verdict']}; mean KLD {st['mean_kld']} (<= {th['mean_kld']}), p99 KLD {st['p99_kld']} "
          f"(<= {th['p99_kld']}), same top {st['same_top_pct']}% (>= {th['same_top_pct']}%)")
store.close()
