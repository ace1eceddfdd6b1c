"""Kernel-level FA screen on the models' shapes: upstream, VEC, TILE, MMA in rotated paired rounds."""
import os
import time
from pathlib import Path
from tuner.builder.cmake import build_variant
from tuner.measure.kernel_bench import force_kernel_env, run_round, shape_for_model
from tuner.plan.render import render_variant
from tuner.source import DEFAULT_SPEC, fetch_source
from tuner.targets.archs import detect_local_archs
from tuner.targets.models import load_models

b = build_variant(render_variant(fetch_source(DEFAULT_SPEC), "sm_90", "cuda", local_archs=detect_local_archs()), jobs=16)
print("bin", b.bin_dir, flush=True)
cands = {"upstream": {}, **{k: force_kernel_env(k) for k in ("VEC", "TILE", "MMA")}}
orders = [list(cands), list(cands)[::-1], list(cands)[1:] + list(cands)[:1], list(cands)[::-1][1:] + list(cands)[::-1][:1]]
for model in os.environ.get("KB_MODELS", "llama-3.2-1b,llama-3.1-8b").split(","):
    shapes = [shape_for_model(load_models()[model], n_kv=n) for n in (4352, 8448, 16640, 33024, 65792)]
    for rnd, order in enumerate(orders[: int(os.environ.get("KB_ROUNDS", "4"))]):
        t0 = time.monotonic()
        for r in run_round(b.bin_dir, shapes, {k: cands[k] for k in order}, log_dir=Path(f"kb/{model}/r{rnd}"), backend="CUDA0"):
            print(model, rnd, r.label, r.shape.key, r.us_per_run, r.kernel, r.why, r.error or "", flush=True)
        print(f"round {rnd} of {model}: {time.monotonic() - t0:.1f} s", flush=True)

# What a screen call spends: decode-only llama-bench over the default depths at 1, 3 and 9 repetitions
# (one fill per depth per process either way), and the pp512+tg128 call the screen makes.
import glob
import subprocess

model = sorted(glob.glob(".devhome/models/llama-3.2-1b-q4_k_m-*.gguf"))[0]
bench = str(b.bin_dir / "llama-bench")
d = "0,4096,8192,16384,32768,65536"
for args in (["-p", "0", "-n", "128", "-r", "1"], ["-p", "0", "-n", "128", "-r", "3"], ["-p", "0", "-n", "128", "-r", "9"],
             ["-p", "512", "-n", "128", "-r", "9"], ["-p", "0", "-n", "32", "-r", "3"]):
    cmd = [bench, "-m", model, "-fa", "1", "-ngl", "99", "-d", d, "-o", "csv", *args]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    rows = [ln for ln in res.stdout.splitlines() if ln and not ln.startswith("build_commit")]
    print(f"llama-bench {' '.join(args)} -d {d}: {wall:.1f} s, rc {res.returncode}", flush=True)
    for ln in rows:
        f = ln.split(",")
        print("   ", ",".join(f[-8:]), flush=True)
