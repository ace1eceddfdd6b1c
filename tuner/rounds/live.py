"""The live measure function: one llama-bench call per candidate over a list of depths, for one
phase or (``measure.joint``) both, which then share each depth's fill.

Every call runs with ``GGML_TUNER_FA_LOG=1``; the patched build prints one line per distinct
shape and kernel (``tuner-fa: D=64 DV=64 ne1=1 gqa=4 n_kv=33024 kernel=VEC (default)``), from which
the kernel that actually ran at each depth is read: upstream's pick for the upstream candidate,
``rule`` or ``fallback`` (illegal here, upstream's choice kept) for a forced one. Builds without the
hook (the CPU backend) print nothing and the kernel stays unknown.

Each depth also carries what the observer saw in the test's timed repetitions (prefill and decode separately;
docs/design.md):
``cpu`` (the llama-bench process tree, percent of one core), ``core`` (its busiest thread) and ``gpu``
(NVML/AMD SMI utilization; None without them). The observer costs one psutil walk of the process
tree per 100 ms and one per llama-bench ``--progress`` line, a few milliseconds each in this process
(about 3% of one core on the 2-core CI box), not in llama-bench.
"""

from __future__ import annotations

__all__ = ["kernel_at", "make_live_measure", "parse_fa_log"]

import math
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.errors import TunerError
from tuner.measure.bench import run_bench
from tuner.measure.falog import kernel_at, parse_fa_log
from tuner.rounds.joint import Candidate, JointMeasure, Point, SharedMeasure

_OBSERVED = {"cpu": "cpu_util_mean", "core": "cpu_core_max", "gpu": "gpu_util_mean"}
"""Record keys (:data:`tuner.rounds.stats.OBSERVED`) and the bench columns they come from."""


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
    """A :data:`~tuner.rounds.joint.Measure` running the real llama-bench of ``bin_dir`` (pinned to
    ``cpus`` when given: the host-paced scenario)."""
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
    """A :data:`~tuner.rounds.joint.Measure` (one phase per call) that also has ``joint`` (both phases
    in one call: :func:`tuner.rounds.joint.run_joint_rounds`) and ``info`` (the device llama-bench
    reported, for the report)."""

    def __init__(self, joint: JointMeasure, info: dict[str, str]) -> None:
        self.joint = joint
        self.info = info

    def __call__(self, cand: Candidate, phase: str, depths: Sequence[int], label: str) -> Mapping[int, Point]:
        return self.joint(cand, [phase], depths, label)[phase]
