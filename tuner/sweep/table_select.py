"""``tuner validate --gpu`` of a sweep table: the kernel the patched upstream tree launches, read on the GPU.

The patched tree has no kernel log, so fa-bench runs stored cells of each kept entry under Nsight Compute and the
launched kernels must be the table's (:func:`tuner.sweep.table.match_table`); skipped without ``ncu``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tuner import _run
from tuner.measure import fa_bench
from tuner.measure.fa_bench import fa_bench_cases
from tuner.result import upstream_check
from tuner.result.checks import Finding
from tuner.result.upstream_check import KERNEL_FUNCTIONS, parse_ncu_csv
from tuner.sweep import export, merge
from tuner.sweep.grid import Cell
from tuner.sweep.live import bench_shape
from tuner.sweep.table import TableRule, match_table

CHECK = "upstream.patch selects the table's kernels"
_TIMEOUT_S = 300


def probes(rules: Sequence[TableRule], cells: Sequence[Cell]) -> list[tuple[Cell, str]]:
    """(cell, kernel the patched tree must launch) at the lowest and highest stored n_kv of each kept entry."""
    out: list[tuple[Cell, str]] = []
    for r in rules:
        cov = sorted(
            (c for c in cells if (c.shape.D, c.shape.gqa, c.shape.kv, c.shape.ne1) == (r.D, r.gqa, r.kv, r.ne1)
             and r.covers(c.n_kv)),
            key=lambda c: c.n_kv,
        )  # fmt: skip
        for c in dict.fromkeys([cov[0], cov[-1]] if cov else []):
            s = c.shape
            want = match_table(
                rules, D=s.D, gqa=s.gqa, type_k=s.kv, type_v=s.kv, ne1=s.ne1, n_kv=c.n_kv,
                can_use_vector_kernel="VEC" in c.legal, gqa_opt_applies=True,
            )  # fmt: skip
            out.append((c, want or c.upstream))
    return out


def _launched(ncu: Path, exe: Path, cases: Path, backend: str, log: Path) -> tuple[set[str] | None, str]:
    """The kernel families one fa-bench run launched under ncu, or None with why."""
    cmd: list[str | Path] = [ncu, "--clock-control", "none", "--cache-control", "none"]
    cmd += ["--kernel-name", "regex:^(" + "|".join(KERNEL_FUNCTIONS) + ")$", "--metrics", "gpu__time_duration.sum"]
    cmd += ["--csv", "--page", "raw", "--print-kernel-base", "function"]
    cmd += [exe, "-b", backend, "-f", cases, "-n", "1", "-c", "0", "-T", "120"]
    env = {**os.environ, "GGML_CUDA_DISABLE_GRAPHS": "1"}  # one launch per op, each seen by ncu
    res = _run.run(cmd, env=env, check=False, timeout=_TIMEOUT_S, what="ncu fa-bench")
    log.write_text(res.output)
    if res.returncode != 0:
        return None, f"ncu exited {res.returncode} (log {log})"
    names = parse_ncu_csv(res.output)
    if not names:
        return None, f"no FlashAttention launch seen (log {log})"
    return {KERNEL_FUNCTIONS.get(n, n) for n in names}, ""


def selected_kernels(bin_dir: Path, ev: export.Evidence | merge.Merged, *, backend: str, log_dir: Path) -> Finding:
    """:data:`CHECK` (module doc) on the patched build in ``bin_dir``; ``ev``: the table's kept rules and cells."""
    todo = probes(ev.confirmed.kept_rules, ev.table.cells)
    if not todo:
        return Finding(check=CHECK, ok=True, detail="skipped: no FlashAttention entry kept")
    ncu = upstream_check.find_ncu()
    if ncu is None:
        return Finding(
            check=CHECK,
            ok=True,
            detail="skipped: Nsight Compute (ncu) not found; the static 'table lookup' check compares the "
            "patch's lookup with the matcher at every stored cell",
        )
    exe = fa_bench.build_fa_bench(bin_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows, ok = [], True
    for i, (c, want) in enumerate(todo):
        cases = log_dir / f"select-{i}.txt"
        cases.write_text(fa_bench_cases([bench_shape(c.shape, c.n_kv)]))
        got, why = _launched(ncu, exe, cases, backend, log_dir / f"select-{i}.log")
        hit = got == {want}
        ok &= hit
        seen = "/".join(sorted(got)) if got else f"? ({why})"
        s = c.shape
        where = f"D{s.D} gqa{s.gqa} {s.kv} ne1 {s.ne1} n_kv {c.n_kv}"
        rows.append(f"{where}: {seen}" + ("" if hit else f", the table gives {want}"))
    return Finding(check=CHECK, ok=ok, detail=("" if ok else "differs: ") + "; ".join(rows))
