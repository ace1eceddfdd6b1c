"""fa-bench (cold K/V, 128 MB of copies) vs test-backend-ops perf (one K/V buffer) at the 1B decode shapes."""
import time
from pathlib import Path
from tuner.builder.cmake import build_variant
from tuner.measure.fa_bench import build_fa_bench, run_round_fast
from tuner.measure.kernel_bench import force_kernel_env, run_round, shape_for_model
from tuner.plan.render import render_variant
from tuner.source import DEFAULT_SPEC, fetch_source
from tuner.targets.archs import detect_local_archs
from tuner.targets.models import load_models

t0 = time.monotonic()
b = build_variant(render_variant(fetch_source(DEFAULT_SPEC), "sm_90", "cuda", local_archs=detect_local_archs()), jobs=16)
print(f"bin {b.bin_dir} ({time.monotonic() - t0:.0f} s)", flush=True)
t1 = time.monotonic()
exe = build_fa_bench(b.bin_dir)
print(f"fa-bench {exe} compiled in {time.monotonic() - t1:.1f} s", flush=True)
cands = {"upstream": {}, **{k: force_kernel_env(k) for k in ("VEC", "TILE", "MMA")}}
order = [list(cands), list(cands)[::-1], list(cands)[1:] + list(cands)[:1]]
shapes = [shape_for_model(load_models()["llama-3.2-1b"], n_kv=n) for n in (4352, 8448, 16640, 33024, 65792)]
for rnd in range(3):
    for timer, fn in (("fa-bench", run_round_fast), ("test-backend-ops", run_round)):
        t = time.monotonic()
        for r in fn(b.bin_dir, shapes, {k: cands[k] for k in order[rnd]}, log_dir=Path(f"fab/{timer}/r{rnd}"), backend="CUDA0"):
            print(timer, rnd, r.label, r.shape.key, r.us_per_run, r.kernel, r.why, r.error[:200] if r.error else "", flush=True)
        print(f"round {rnd} {timer}: {time.monotonic() - t:.1f} s", flush=True)
