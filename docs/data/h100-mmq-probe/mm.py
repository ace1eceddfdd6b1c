"""H100 probe (bash mm.sh runs it; $OUT is where it writes): mm-bench on two builds (upstream's MMQ choice; GGML_CUDA_FORCE_CUBLAS) in rotated rounds."""
import json, os, statistics, subprocess, sys, time
from pathlib import Path
from tuner.measure.mm_bench import MmShape, build_mm_bench, mm_bench_cases, parse_mm_bench_output

out = Path(os.environ["OUT"])
bins = {"mmq": Path(sys.argv[1]), "cublas": Path(sys.argv[2])}
types = ["q4_0", "q4_K", "q5_K", "q6_K", "q8_0", "iq4_xs"]
batches = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
size = 4096
if os.environ.get("MMB_SMALL"):  # a local check of this script on a CPU build
    types, batches, size = ["q4_0", "q8_0"], [16, 32], 256
backend = os.environ.get("MMB_BACKEND", "CUDA0")
shapes = [MmShape(type=t, m=size, k=size, ne11=n) for t in types for n in batches]
cases = out / "cases.txt"
cases.write_text(mm_bench_cases(shapes))
exes = {k: build_mm_bench(b) for k, b in bins.items()}
order = ["mmq", "cublas", "mmq-aa"]
rec = []
for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
    rot = order[r % 3:] + order[: r % 3]
    for name in rot:
        exe = exes[name.split("-")[0]]
        t0 = time.time()
        p = subprocess.run([str(exe), "-b", backend, "-f", str(cases), "-n", "20", "-c", "128"], capture_output=True, text=True)
        res = parse_mm_bench_output(p.stdout)
        print(f"round {r} {name}: rc={p.returncode} {time.time() - t0:.1f} s, {sum(1 for c in res.values() if c.us_per_op)} cases", flush=True)
        if p.returncode:
            print(p.stderr[-2000:])
        rec.append({"round": r, "name": name, "us": {i: c.us_per_op for i, c in res.items()}, "err": {i: c.error for i, c in res.items() if c.error}})
(out / "mm-rounds.json").write_text(json.dumps({"shapes": [s.__dict__ for s in shapes], "rounds": rec}))
def med(name, i):
    xs = [x["us"].get(i) for x in rec if x["name"] == name and x["us"].get(i)]
    return statistics.median(xs) if xs else float("nan")
print("type ne11 | mmq us | cublas us | cublas/mmq speed | mmq A/A")
for i, s in enumerate(shapes):
    a, b, c = med("mmq", i), med("cublas", i), med("mmq-aa", i)
    print(f"{s.type:7s} {s.ne11:5d} | {a:9.1f} | {b:9.1f} | {a / b:6.3f} | {c / a:6.3f}")
