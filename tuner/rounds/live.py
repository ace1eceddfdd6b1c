"""The live measure function: one llama-bench call per candidate over a list of depths, for one phase or
(``measure.joint``) both, which then share each depth's fill.

Every call runs with ``GGML_TUNER_FA_LOG=1``; the patched build's log says which kernel ran at each depth
(upstream's pick, or ``rule``/``fallback`` for a forced one; unknown without the hook). Each depth also carries
the observer's ``cpu`` (process tree, percent of one core), ``core`` (busiest thread) and ``gpu`` utilization
over the timed repetitions (docs/design.md).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.errors import TunerError
from tuner.measure.bench import run_bench
from tuner.measure.kernel_bench import kernel_at, parse_fa_log
from tuner.rounds.joint import Candidate, JointMeasure, Point, SharedMeasure

_OBSERVED = {"cpu": "cpu_util_mean", "core": "cpu_core_max", "gpu": "gpu_util_mean"}  # record key -> bench column


def _finite(x: float | str) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None


def make_live_measure(
    bin_dir: Path,
    model: Path,
    *,
    pp: int,
    tg: int,
    reps: Mapping[str, int],
    log_dir: Path,
    era: str,
    arch: str | None,
    cpus: Sequence[int] | None = None,
) -> SharedMeasure:
    """A measure running the real llama-bench of ``bin_dir`` (pinned to ``cpus`` when given)."""
    info: dict[str, str] = {}

    def joint(cand: Candidate, phases: Sequence[str], depths: Sequence[int], label: str) -> dict[str, dict[int, Point]]:
        args = list(cand.args)
        fa = True
        if "-fa" in args:  # a knob on some spaces; run_bench owns the flag's era-dependent spelling
            i = args.index("-fa")
            fa = args[i + 1] in ("on", "1", "true")
            del args[i : i + 2]
        try:  # one -r for the call: the larger of the phases' repetitions
            df = run_bench(
                bin_dir,
                model,
                depths=tuple(depths),
                pp=pp if "pp" in phases else 0,
                tg=tg if "tg" in phases else 0,
                reps=max(reps[p] for p in phases),
                target_ci=None,
                env={**cand.env, "GGML_TUNER_FA_LOG": "1"},
                extra_args=tuple(args),
                log_dir=log_dir,
                label=label,
                era=era,
                flash_attn=fa,
                arch=arch,
                observe=True,
                cpus=cpus,
            )
        except TunerError as err:  # a failed call is data: every depth carries the error
            return {
                p: {d: {"ts": None, "kernel": None, "why": None, "error": str(err)[:300]} for d in depths}
                for p in phases
            }
        if len(df) and not info:
            gpu = str(df.iloc[0].get("gpu_info") or "")
            info["device"] = (
                gpu or f"CPU backend ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"
            )
        log_file = Path(str(df.attrs.get("log_file") or ""))
        lines = parse_fa_log(log_file.read_text(errors="replace")) if log_file.is_file() else []
        out: dict[str, dict[int, Point]] = {}
        for phase in phases:
            out[phase] = {}
            for d in depths:
                rows = df[(df["phase"] == phase) & (df["depth"] == d)]
                samples = list(rows.iloc[0]["samples"]) if len(rows) else []
                row_err = str(rows.iloc[0]["error"]) if len(rows) and rows.iloc[0]["error"] else ""
                k, why = kernel_at(lines, phase, d, pp if phase == "pp" else tg)
                out[phase][d] = {
                    "ts": float(statistics.median(samples)) if samples else None,
                    "kernel": k,
                    "why": why,
                    "error": row_err or ("" if samples else f"no samples; see {log_file}"),
                    **{key: _finite(rows.iloc[0][col]) if len(rows) else None for key, col in _OBSERVED.items()},
                }
        return out

    return _LiveMeasure(joint, info)


class _LiveMeasure:
    """A measure (one phase per call) with ``joint`` (both phases in one call) and ``info`` (the device)."""

    def __init__(self, joint: JointMeasure, info: dict[str, str]) -> None:
        self.joint = joint
        self.info = info

    def __call__(self, cand: Candidate, phase: str, depths: Sequence[int], label: str) -> Mapping[int, Point]:
        return self.joint(cand, [phase], depths, label)[phase]
